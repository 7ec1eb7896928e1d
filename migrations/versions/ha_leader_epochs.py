"""leader_epochs (the fencing epoch of the leader election) and the epoch on each
placement and decision

Revision ID: ha_leader_epochs
Revises: act_decisions_retries
Create Date: 2026-11-30 20:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "ha_leader_epochs"
down_revision: str | None = "act_decisions_retries"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "leader_epochs",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("holder", sa.String(length=253), nullable=False),
        sa.Column("elected_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_leader_epochs")),
    )
    for table in ("placements", "decisions"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("leader_epoch", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    for table in ("decisions", "placements"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("leader_epoch")
    op.drop_table("leader_epochs")
