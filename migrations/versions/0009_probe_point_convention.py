"""probe_points.convention: the rules each probe point was read by (core.probe_conventions)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04 19:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Every point stored before was read by the only convention there was.
    op.add_column(
        "probe_points",
        sa.Column("convention", sa.String(length=16), nullable=False, server_default="prunecast"),
    )


def downgrade() -> None:
    # A plain DROP COLUMN, never a batch copy (see 0004).
    op.drop_column("probe_points", "convention")
