"""decisions table (the actuator's durable work), workload retry/backoff and displaced_from

Revision ID: act_decisions_retries
Revises: 0002_observed_inventory
Create Date: 2026-12-01 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "act_decisions_retries"
down_revision: str | None = "0002_observed_inventory"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "decisions",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("key", sa.String(length=400), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=True),
        sa.Column("cluster", sa.String(length=128), nullable=False),
        sa.Column("pool", sa.String(length=128), nullable=False),
        sa.Column("workload_id", sa.String(length=40), nullable=False),
        sa.Column("spec", _JSON, nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("step", sa.String(length=32), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("not_before_s", sa.Float(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=False),
        sa.Column("created_s", sa.Float(), nullable=False),
        sa.Column("updated_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_decisions")),
    )
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.create_index("ix_decisions_state_id", ["state", "id"], unique=False)
        batch_op.create_index("ix_decisions_key_state", ["key", "state"], unique=False)
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempts", sa.Integer(), server_default="0",
                                      nullable=False))
        batch_op.add_column(sa.Column("last_attempt_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("not_before_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("displaced_from", _JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.drop_column("displaced_from")
        batch_op.drop_column("not_before_s")
        batch_op.drop_column("last_attempt_s")
        batch_op.drop_column("attempts")
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.drop_index("ix_decisions_key_state")
        batch_op.drop_index("ix_decisions_state_id")
    op.drop_table("decisions")
