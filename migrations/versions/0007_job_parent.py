"""jobs.parent_id: the job that created a job (a fanned-out sweep's per-sparsity children)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 23:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Jobs stored before have no parent. A plain ADD COLUMN, no foreign key: on SQLite a constraint
    # needs a batch copy of `jobs`, whose drop of the old table would cascade to every result (0004).
    op.add_column("jobs", sa.Column("parent_id", sa.String(length=36), nullable=True))
    op.create_index("ix_jobs_parent_id", "jobs", ["parent_id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_parent_id", table_name="jobs")
    op.drop_column("jobs", "parent_id")
