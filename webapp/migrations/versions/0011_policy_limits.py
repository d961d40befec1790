"""Cumulative limits in tool policies: what may run with no person per conversation, per customer and
per tenant in 24 hours; each tool call keeps the customer it acts on.

Revision ID: 0011_policy_limits
Revises: 0010_assistant_settings
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0011_policy_limits'
down_revision = '0010_assistant_settings'
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')


def upgrade():
    with op.batch_alter_table('tool_policies') as batch:
        batch.add_column(sa.Column('limits', JSON, nullable=True))
    with op.batch_alter_table('tool_calls') as batch:
        batch.add_column(sa.Column('customer_id', sa.Integer(), nullable=True))
    op.create_index('ix_tool_calls_tenant_name_created', 'tool_calls', ['tenant_id', 'name', 'created_at'])


def downgrade():
    op.drop_index('ix_tool_calls_tenant_name_created', table_name='tool_calls')
    with op.batch_alter_table('tool_calls') as batch:
        batch.drop_column('customer_id')
    with op.batch_alter_table('tool_policies') as batch:
        batch.drop_column('limits')
