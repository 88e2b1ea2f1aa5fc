"""store_generation: one counter bumped by triggers when what predictions read changes

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 22:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from core import store_generation

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The DDL is core.store_generation's, the same statements create_all runs (see its docstring).
    op.create_table(
        store_generation.TABLE,
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    for statement in store_generation.install_statements(op.get_bind().dialect.name):
        op.execute(statement)


def downgrade() -> None:
    for statement in store_generation.drop_statements(op.get_bind().dialect.name):
        op.execute(statement)
    op.drop_table(store_generation.TABLE)
