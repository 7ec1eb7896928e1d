"""initial schema

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-30 08:18:45.240448
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    
    op.create_table('events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('ts', sa.Float(), nullable=False),
    sa.Column('tenant', sa.String(length=64), nullable=True),
    sa.Column('kind', sa.String(length=64), nullable=False),
    sa.Column('subject', sa.String(length=253), nullable=False),
    sa.Column('data', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_events'))
    )
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.create_index('ix_events_tenant_id', ['tenant', 'id'], unique=False)
        batch_op.create_index(batch_op.f('ix_events_ts'), ['ts'], unique=False)

    op.create_table('offers',
    sa.Column('provider', sa.String(length=32), nullable=False),
    sa.Column('region', sa.String(length=64), nullable=False),
    sa.Column('instance_type', sa.String(length=64), nullable=False),
    sa.Column('vcpu', sa.Float(), nullable=False),
    sa.Column('memory_gib', sa.Float(), nullable=False),
    sa.Column('gpu_count', sa.Integer(), nullable=False),
    sa.Column('gpu_model', sa.String(length=64), nullable=True),
    sa.Column('interconnect', sa.String(length=16), nullable=False),
    sa.Column('price_usd_per_hour', sa.Float(), nullable=True),
    sa.Column('spot_price_usd_per_hour', sa.Float(), nullable=True),
    sa.Column('source', sa.String(length=16), nullable=False),
    sa.Column('attrs', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('updated_s', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('provider', 'region', 'instance_type', name=op.f('pk_offers'))
    )
    op.create_table('provider_accounts',
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('provider', sa.String(length=32), nullable=False),
    sa.Column('stale', sa.Boolean(), nullable=False),
    sa.Column('failures', sa.Integer(), nullable=False),
    sa.Column('last_ok_s', sa.Float(), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=False),
    sa.Column('updated_s', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_provider_accounts'))
    )
    op.create_table('quota_snapshots',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('account', sa.String(length=128), nullable=False),
    sa.Column('provider', sa.String(length=32), nullable=False),
    sa.Column('taken_s', sa.Float(), nullable=False),
    sa.Column('ok', sa.Boolean(), nullable=False),
    sa.Column('quotas', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('error', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_quota_snapshots'))
    )
    with op.batch_alter_table('quota_snapshots', schema=None) as batch_op:
        batch_op.create_index('ix_quota_snapshots_account_taken', ['account', 'taken_s'], unique=False)

    op.create_table('tenants',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('budget_usd_per_hour', sa.Float(), nullable=True),
    sa.Column('created_s', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_tenants'))
    )
    op.create_table('api_tokens',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('token_sha256', sa.String(length=64), nullable=False),
    sa.Column('tenant', sa.String(length=64), nullable=False),
    sa.Column('is_admin', sa.Boolean(), nullable=False),
    sa.Column('description', sa.String(length=200), nullable=False),
    sa.Column('created_s', sa.Float(), nullable=False),
    sa.Column('revoked', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['tenant'], ['tenants.name'], name=op.f('fk_api_tokens_tenant_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens')),
    sa.UniqueConstraint('token_sha256', name=op.f('uq_api_tokens_token_sha256'))
    )
    op.create_table('clusters',
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('tenant', sa.String(length=64), nullable=False),
    sa.Column('provider', sa.String(length=32), nullable=False),
    sa.Column('region', sa.String(length=64), nullable=False),
    sa.Column('account', sa.String(length=128), nullable=True),
    sa.Column('zones', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('lat', sa.Float(), nullable=True),
    sa.Column('lon', sa.Float(), nullable=True),
    sa.Column('labels', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('taints', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('quota_vcpu', sa.Float(), nullable=True),
    sa.Column('quota_gpu', sa.Float(), nullable=True),
    sa.Column('healthy', sa.Boolean(), nullable=False),
    sa.Column('quota_stale', sa.Boolean(), nullable=False),
    sa.Column('attrs', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('updated_s', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['tenant'], ['tenants.name'], name=op.f('fk_clusters_tenant_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_clusters'))
    )
    with op.batch_alter_table('clusters', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_clusters_account'), ['account'], unique=False)
        batch_op.create_index(batch_op.f('ix_clusters_tenant'), ['tenant'], unique=False)

    op.create_table('sites',
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('tenant', sa.String(length=64), nullable=False),
    sa.Column('lat', sa.Float(), nullable=False),
    sa.Column('lon', sa.Float(), nullable=False),
    sa.Column('cpu', sa.Float(), nullable=False),
    sa.Column('memory_gib', sa.Float(), nullable=False),
    sa.Column('gpu', sa.Integer(), nullable=False),
    sa.Column('price_usd_per_hour', sa.Float(), nullable=False),
    sa.Column('gpu_model', sa.String(length=64), nullable=True),
    sa.Column('interconnect', sa.String(length=16), nullable=False),
    sa.Column('uplink_gbps', sa.Float(), nullable=False),
    sa.Column('health', sa.String(length=16), nullable=False),
    sa.Column('last_seen_s', sa.Float(), nullable=True),
    sa.Column('labels', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('attrs', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('updated_s', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['tenant'], ['tenants.name'], name=op.f('fk_sites_tenant_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_sites'))
    )
    with op.batch_alter_table('sites', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_sites_tenant'), ['tenant'], unique=False)

    op.create_table('workloads',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('tenant', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=253), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('priority', sa.Integer(), nullable=False),
    sa.Column('spec', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('idempotency_key', sa.String(length=200), nullable=True),
    sa.Column('request_sha256', sa.String(length=64), nullable=False),
    sa.Column('placement_id', sa.String(length=40), nullable=True),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('submitted_s', sa.Float(), nullable=False),
    sa.Column('updated_s', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['tenant'], ['tenants.name'], name=op.f('fk_workloads_tenant_tenants'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_workloads')),
    sa.UniqueConstraint('tenant', 'idempotency_key', name='uq_workloads_tenant_idem')
    )
    with op.batch_alter_table('workloads', schema=None) as batch_op:
        batch_op.create_index('ix_workloads_queue', ['status', 'priority', 'submitted_s'], unique=False)
        batch_op.create_index('ix_workloads_tenant_order', ['tenant', 'submitted_s', 'id'], unique=False)

    op.create_table('placements',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('workload_id', sa.String(length=40), nullable=False),
    sa.Column('tenant', sa.String(length=64), nullable=False),
    sa.Column('assignments', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('clusters_csv', sa.Text(), nullable=False),
    sa.Column('cost_usd_per_hour', sa.Float(), nullable=False),
    sa.Column('rtt_ms', sa.Float(), nullable=True),
    sa.Column('decision', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('active', sa.Boolean(), nullable=False),
    sa.Column('dispatched', sa.Boolean(), nullable=False),
    sa.Column('dispatch_attempts', sa.Integer(), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=False),
    sa.Column('created_s', sa.Float(), nullable=False),
    sa.Column('updated_s', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['workload_id'], ['workloads.id'], name=op.f('fk_placements_workload_id_workloads'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_placements'))
    )
    with op.batch_alter_table('placements', schema=None) as batch_op:
        batch_op.create_index('ix_placements_pending_dispatch', ['active', 'dispatched'], unique=False)
        batch_op.create_index(batch_op.f('ix_placements_workload_id'), ['workload_id'], unique=False)

    op.create_table('pools',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('cluster', sa.String(length=128), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('instance_type', sa.String(length=64), nullable=False),
    sa.Column('node_cpu', sa.Float(), nullable=False),
    sa.Column('node_memory_gib', sa.Float(), nullable=False),
    sa.Column('node_gpu', sa.Integer(), nullable=False),
    sa.Column('nodes', sa.Integer(), nullable=False),
    sa.Column('max_nodes', sa.Integer(), nullable=False),
    sa.Column('price_usd_per_hour', sa.Float(), nullable=False),
    sa.Column('pricing', sa.String(length=16), nullable=False),
    sa.Column('gpu_model', sa.String(length=64), nullable=True),
    sa.Column('interconnect', sa.String(length=16), nullable=False),
    sa.Column('used_cpu', sa.Float(), nullable=False),
    sa.Column('used_memory_gib', sa.Float(), nullable=False),
    sa.Column('used_gpu', sa.Integer(), nullable=False),
    sa.Column('largest_free_gpu_set', sa.Integer(), nullable=False),
    sa.Column('reclaim_rate_per_hour', sa.Float(), nullable=False),
    sa.Column('attrs', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.ForeignKeyConstraint(['cluster'], ['clusters.name'], name=op.f('fk_pools_cluster_clusters'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_pools')),
    sa.UniqueConstraint('cluster', 'name', name=op.f('uq_pools_cluster'))
    )
    


def downgrade() -> None:
    
    op.drop_table('pools')
    with op.batch_alter_table('placements', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_placements_workload_id'))
        batch_op.drop_index('ix_placements_pending_dispatch')

    op.drop_table('placements')
    with op.batch_alter_table('workloads', schema=None) as batch_op:
        batch_op.drop_index('ix_workloads_tenant_order')
        batch_op.drop_index('ix_workloads_queue')

    op.drop_table('workloads')
    with op.batch_alter_table('sites', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_sites_tenant'))

    op.drop_table('sites')
    with op.batch_alter_table('clusters', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_clusters_tenant'))
        batch_op.drop_index(batch_op.f('ix_clusters_account'))

    op.drop_table('clusters')
    op.drop_table('api_tokens')
    op.drop_table('tenants')
    with op.batch_alter_table('quota_snapshots', schema=None) as batch_op:
        batch_op.drop_index('ix_quota_snapshots_account_taken')

    op.drop_table('quota_snapshots')
    op.drop_table('provider_accounts')
    op.drop_table('offers')
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_events_ts'))
        batch_op.drop_index('ix_events_tenant_id')

    op.drop_table('events')
    
