"""taints on pools: the NoSchedule/NoExecute taints a registration says every node of the
pool carries (a GPU node group tainted `nvidia.com/gpu:NoSchedule`), which the planner reads
before the pool has a node to observe

Revision ID: pools_taints
Revises: workloads_status_updated
Create Date: 2026-12-07 18:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "pools_taints"
down_revision: str | None = "workloads_status_updated"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pools", schema=None) as batch_op:
        batch_op.add_column(sa.Column(
            "taints",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pools", schema=None) as batch_op:
        batch_op.drop_column("taints")
