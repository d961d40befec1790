"""An index for /metrics: tool calls by status, oldest first (the oldest waiting approval and the
count of waiting approvals by age are index range scans, whatever the tenant).

Revision ID: 0007
Revises: 0006
"""
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade():
    op.create_index('ix_tool_calls_status_created', 'tool_calls', ['status', 'created_at'])


def downgrade():
    op.drop_index('ix_tool_calls_status_created', table_name='tool_calls')
