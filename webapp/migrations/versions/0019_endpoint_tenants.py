"""Which tenants may use each model endpoint. Every endpoint a tenant uses today (as its endpoint or
its small endpoint) is granted to it, so no running tenant loses its model.

Revision ID: 0019_endpoint_tenants
Revises: 0018_policy_changes
"""
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = '0019_endpoint_tenants'
down_revision = '0018_policy_changes'
branch_labels = None
depends_on = None


def upgrade():
    grants = op.create_table(
        'endpoint_tenants',
        sa.Column('endpoint_id', sa.Integer(), nullable=False),
        sa.Column('tenant_id', sa.Integer(), nullable=False),
        sa.Column('granted_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ['endpoint_id'], ['model_endpoints.id'], name=op.f('fk_endpoint_tenants_endpoint_id_model_endpoints')
        ),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_endpoint_tenants_tenant_id_tenants')),
        sa.PrimaryKeyConstraint('endpoint_id', 'tenant_id', name=op.f('pk_endpoint_tenants')),
    )
    op.create_index(op.f('ix_endpoint_tenants_tenant_id'), 'endpoint_tenants', ['tenant_id'], unique=False)
    op.bulk_insert(grants, in_use(op.get_bind()))


def in_use(connection) -> list[dict]:
    """A grant for every (endpoint, tenant) in use now, as the tenant's endpoint or small endpoint."""
    tenants = sa.table('tenants', sa.column('id'), sa.column('endpoint_id'), sa.column('small_endpoint_id'))
    pairs = set()
    for tenant_id, endpoint_id, small_id in connection.execute(
        sa.select(tenants.c.id, tenants.c.endpoint_id, tenants.c.small_endpoint_id)
    ):
        pairs.update((used, tenant_id) for used in (endpoint_id, small_id) if used is not None)
    # the naive UTC moment on SQLite, as webapp.models.UTCDateTime stores it there
    now = datetime.now(UTC) if connection.dialect.name != 'sqlite' else datetime.now(UTC).replace(tzinfo=None)
    return [{'endpoint_id': e, 'tenant_id': t, 'granted_at': now} for e, t in sorted(pairs)]


def downgrade():
    op.drop_index(op.f('ix_endpoint_tenants_tenant_id'), table_name='endpoint_tenants')
    op.drop_table('endpoint_tenants')
