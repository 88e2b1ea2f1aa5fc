"""jobs.progress_at: when a running job last reported progress (hung-job detection)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import core.tables

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Running jobs of an older worker have none yet: the reconciler then reads started_at.
    op.add_column("jobs", sa.Column("progress_at", core.tables.UTCDateTime(timezone=True), nullable=True))


def downgrade() -> None:
    # A plain DROP COLUMN, never a batch copy of `jobs`: on SQLite that copy drops the old table, and
    # with foreign keys on, dropping it would cascade to every result, fit and probe point.
    op.drop_column("jobs", "progress_at")
