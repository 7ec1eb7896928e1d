"""An index on workloads (status, updated_s): the placement loop reads the workloads that
ended lately every epoch (WorkloadRepo.ended_since, the prewarm's net forecast), which
without it scans every finished workload

Revision ID: workloads_status_updated
Revises: workloads_retry_reason
Create Date: 2026-12-06 22:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "workloads_status_updated"
down_revision: str | None = "workloads_retry_reason"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_workloads_status_updated", "workloads", ["status", "updated_s"])


def downgrade() -> None:
    op.drop_index("ix_workloads_status_updated", table_name="workloads")
