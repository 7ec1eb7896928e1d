"""observed inventory per cluster/site and per-pool demand (placement/snapshot.py merges them)

Revision ID: 0002_observed_inventory
Revises: 0001
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002_observed_inventory"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "inventory",
        sa.Column("member", sa.String(length=128), nullable=False),
        sa.Column("observed_s", sa.Float(), nullable=False),
        sa.Column("since_s", sa.Float(), nullable=False),
        sa.Column("nodes", _JSON, nullable=False),
        sa.Column("reclaims", _JSON, nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("error_s", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("member", name=op.f("pk_inventory")),
    )
    op.create_table(
        "pool_demand",
        sa.Column("cluster", sa.String(length=128), nullable=False),
        sa.Column("pool", sa.String(length=128), nullable=False),
        sa.Column("cpu_per_s", sa.Float(), nullable=False),
        sa.Column("gpu_per_s", sa.Float(), nullable=False),
        sa.Column("at_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "pool", name=op.f("pk_pool_demand")),
    )


def downgrade() -> None:
    op.drop_table("pool_demand")
    op.drop_table("inventory")
