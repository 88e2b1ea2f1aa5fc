"""dense_windows: a dense baseline's per-window NLL scored in another dtype, once per device kind

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07 13:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import core.tables

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Empty to begin with: a simulation to a precision fills it as it scores bfloat16 windows.
    op.create_table(
        "dense_windows",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("result_id", sa.Integer(), nullable=False),
        sa.Column("scored_on", sa.String(length=256), nullable=False),
        sa.Column("window_index", sa.Integer(), nullable=False),
        sa.Column("nll", sa.Float(), nullable=False),
        sa.Column("created_at", core.tables.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["result_id"], ["results.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("result_id", "scored_on", "window_index", name="uq_dense_windows"),
    )


def downgrade() -> None:
    op.drop_table("dense_windows")
