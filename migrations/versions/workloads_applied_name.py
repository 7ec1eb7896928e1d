"""workloads.applied_name and a partial unique index on (tenant, applied_name) over live
workloads: two concurrent PUTs of one new name could create two workloads

Revision ID: workloads_applied_name
Revises: k8s_cluster_status
Create Date: 2026-11-30 23:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "workloads_applied_name"
down_revision: str | None = "k8s_cluster_status"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# broker/store/models.py LIVE_APPLIED (repeated: a migration must not change with the models)
_LIVE = "applied_name IS NOT NULL AND status NOT IN ('succeeded', 'failed', 'cancelled')"


def upgrade() -> None:
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.add_column(sa.Column("applied_name", sa.String(length=253), nullable=True))
    op.create_index("uq_workloads_tenant_applied_name", "workloads",
                    ["tenant", "applied_name"], unique=True,
                    postgresql_where=sa.text(_LIVE), sqlite_where=sa.text(_LIVE))


def downgrade() -> None:
    op.drop_index("uq_workloads_tenant_applied_name", table_name="workloads")
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.drop_column("applied_name")
