"""token roles and expiry, member scopes (federation-wide or tenant-private, lent to tenants)

Revision ID: tenancy_roles_scopes
Revises: ha_leader_epochs
Create Date: 2026-11-30 20:00:00

- api_tokens.role: admin | operator | tenant (backfilled from is_admin, which stays,
  equal to role == 'admin', so an older broker reading the row still sees admins);
- api_tokens.expires_s: epoch seconds after which the token no longer resolves (NULL: never);
- clusters.shared / sites.shared: federation-wide (registered by an admin or operator);
  backfilled true for the rows of the `admin` tenant, the rule the broker used before;
- clusters.lent_to / sites.lent_to: the other tenants a private member is lent to.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "tenancy_roles_scopes"
down_revision: str | None = "ha_leader_epochs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
_MEMBERS = ("clusters", "sites")


def upgrade() -> None:
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("role", sa.String(length=16), server_default="tenant",
                                      nullable=False))
        batch_op.add_column(sa.Column("expires_s", sa.Float(), nullable=True))
    op.execute("UPDATE api_tokens SET role = 'admin' WHERE is_admin")
    for table in _MEMBERS:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("shared", sa.Boolean(), server_default=sa.false(),
                                          nullable=False))
            batch_op.add_column(sa.Column("lent_to", _JSON, nullable=True))
        op.execute(f"UPDATE {table} SET shared = true WHERE tenant = 'admin'")  # noqa: S608


def downgrade() -> None:
    for table in _MEMBERS:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("lent_to")
            batch_op.drop_column("shared")
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_column("expires_s")
        batch_op.drop_column("role")
