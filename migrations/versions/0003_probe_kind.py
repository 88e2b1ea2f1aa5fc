"""probe points say which probe measured them; indexed by (job_id, probe)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Rows stored before this revision (none were written: no worker probed yet) become
    # `counterfactual`; the server default only exists to fill them and is dropped at once.
    with op.batch_alter_table("probe_points", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("probe", sa.String(length=32), nullable=False, server_default="counterfactual")
        )
    with op.batch_alter_table("probe_points", schema=None) as batch_op:
        batch_op.alter_column("probe", server_default=None)
        batch_op.drop_index(batch_op.f("ix_probe_points_job_id"))
        batch_op.create_index("ix_probe_points_job_id_probe", ["job_id", "probe"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("probe_points", schema=None) as batch_op:
        batch_op.drop_index("ix_probe_points_job_id_probe")
        batch_op.create_index(batch_op.f("ix_probe_points_job_id"), ["job_id"], unique=False)
        batch_op.drop_column("probe")
