"""cluster_status on placements: ready/desired replicas and the driver's message per member
cluster, written by the reconciler (the workload's per-cluster status and conditions)

Revision ID: k8s_cluster_status
Revises: tenancy_roles_scopes
Create Date: 2026-11-30 21:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "k8s_cluster_status"
down_revision: str | None = "tenancy_roles_scopes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("placements", schema=None) as batch_op:
        batch_op.add_column(sa.Column(
            "cluster_status",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("placements", schema=None) as batch_op:
        batch_op.drop_column("cluster_status")
