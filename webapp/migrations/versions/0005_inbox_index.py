"""An index for the approval inbox: a tenant's waiting calls, oldest first.

Revision ID: 0005
Revises: 0004
"""
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade():
    op.create_index('ix_tool_calls_tenant_status_created', 'tool_calls', ['tenant_id', 'status', 'created_at', 'id'])


def downgrade():
    op.drop_index('ix_tool_calls_tenant_status_created', table_name='tool_calls')
