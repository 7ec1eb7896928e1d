"""workloads.retry_reason (the planner's Retry.reason), and workloads an older broker marked
`unplaceable` for good back to `pending`: the placement loop now keeps every unplaced
workload pending and retries it with backoff (a cluster may register or recover later)

Revision ID: workloads_retry_reason
Revises: workloads_applied_name
Create Date: 2026-12-02 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "workloads_retry_reason"
down_revision: str | None = "workloads_applied_name"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.add_column(sa.Column("retry_reason", sa.Text(), nullable=True))
    # Their message (the planner's reason) becomes the retry reason; due at once.
    op.execute("UPDATE workloads SET status = 'pending', retry_reason = message, "
               "not_before_s = NULL WHERE status = 'unplaceable'")


def downgrade() -> None:
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.drop_column("retry_reason")
