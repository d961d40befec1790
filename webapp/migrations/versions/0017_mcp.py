"""MCP servers per tenant and their tools (the accepted and the current definition of each).

Revision ID: 0017_mcp
Revises: 0016_routing
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0017_mcp'
down_revision = '0016_routing'
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')


def upgrade():
    op.create_table(
        'mcp_servers',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('tenant_id', sa.Integer(), nullable=False),
        sa.Column('name', sa.String(length=40), nullable=False),
        sa.Column('url', sa.String(length=500), nullable=True),
        sa.Column('command', sa.Text(), nullable=True),
        sa.Column('headers', JSON, nullable=False),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('created_by_id', sa.Integer(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('synced_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['created_by_id'], ['users.id'], name=op.f('fk_mcp_servers_created_by_id_users')),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_mcp_servers_tenant_id_tenants')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_mcp_servers')),
        sa.UniqueConstraint('tenant_id', 'name', name='uq_mcp_servers_tenant_name'),
    )
    op.create_index(op.f('ix_mcp_servers_tenant_id'), 'mcp_servers', ['tenant_id'], unique=False)
    op.create_table(
        'mcp_tools',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('server_id', sa.Integer(), nullable=False),
        sa.Column('tenant_id', sa.Integer(), nullable=False),
        sa.Column('registry_name', sa.String(length=128), nullable=False),
        sa.Column('remote_name', sa.String(length=200), nullable=False),
        sa.Column('description', sa.Text(), nullable=False),
        sa.Column('input_schema', JSON, nullable=False),
        sa.Column('annotations', JSON, nullable=False),
        sa.Column('fingerprint', sa.String(length=64), nullable=False),
        sa.Column('current_description', sa.Text(), nullable=False),
        sa.Column('current_input_schema', JSON, nullable=False),
        sa.Column('current_annotations', JSON, nullable=False),
        sa.Column('current_fingerprint', sa.String(length=64), nullable=False),
        sa.Column('held', sa.Boolean(), nullable=False),
        sa.Column('accepted_by_id', sa.Integer(), nullable=True),
        sa.Column('accepted_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['accepted_by_id'], ['users.id'], name=op.f('fk_mcp_tools_accepted_by_id_users')),
        sa.ForeignKeyConstraint(
            ['server_id'], ['mcp_servers.id'], name=op.f('fk_mcp_tools_server_id_mcp_servers'), ondelete='CASCADE'
        ),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name=op.f('fk_mcp_tools_tenant_id_tenants')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_mcp_tools')),
        sa.UniqueConstraint('tenant_id', 'registry_name', name='uq_mcp_tools_tenant_registry_name'),
    )
    op.create_index(op.f('ix_mcp_tools_server_id'), 'mcp_tools', ['server_id'], unique=False)


def downgrade():
    op.drop_index(op.f('ix_mcp_tools_server_id'), table_name='mcp_tools')
    op.drop_table('mcp_tools')
    op.drop_index(op.f('ix_mcp_servers_tenant_id'), table_name='mcp_servers')
    op.drop_table('mcp_servers')
