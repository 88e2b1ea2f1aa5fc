"""probe_points.n, stderr, value_min, value_max: the spread of each probe point over its tokens

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 19:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (("n", sa.Integer()), ("stderr", sa.Float()), ("value_min", sa.Float()), ("value_max", sa.Float()))


def upgrade() -> None:
    # Points stored before keep nulls: their spread was never measured.
    for name, kind in COLUMNS:
        op.add_column("probe_points", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMNs, never a batch copy (see 0004).
    for name, _ in reversed(COLUMNS):
        op.drop_column("probe_points", name)
