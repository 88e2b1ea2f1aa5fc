"""profile_linears: per block linear of a profile, what each unstructured mask rule would remove

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 01:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Profiles stored before have no rows here: they predict slicing only, as they did.
    op.create_table(
        "profile_linears",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("profile_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("layer", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("columns", sa.Integer(), nullable=False),
        sa.Column("output_energy", sa.Float(), nullable=False),
        sa.Column("errors", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["profile_id"], ["profiles.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_profile_linears_job_id", "profile_linears", ["job_id"])
    op.create_index("ix_profile_linears_profile_id", "profile_linears", ["profile_id"])


def downgrade() -> None:
    op.drop_index("ix_profile_linears_profile_id", table_name="profile_linears")
    op.drop_index("ix_profile_linears_job_id", table_name="profile_linears")
    op.drop_table("profile_linears")
