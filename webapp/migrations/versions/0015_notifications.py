"""Reminders and escalation of waiting calls: a reminder time per tool policy, when each waiting call
is reminded and escalated, a tenant's notification channels and the log of every delivery.

Revision ID: 0015_notifications
Revises: 0014_tool_access
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0015_notifications'
down_revision = '0014_tool_access'
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')


def upgrade():
    with op.batch_alter_table('tool_policies') as batch:
        batch.add_column(sa.Column('remind_after_seconds', sa.Integer(), nullable=True))
    with op.batch_alter_table('tool_calls') as batch:
        batch.add_column(sa.Column('remind_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('escalate_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('reminded_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('escalated_at', sa.DateTime(timezone=True), nullable=True))
    op.create_index('ix_tool_calls_status_remind', 'tool_calls', ['status', 'remind_at'])
    op.create_index('ix_tool_calls_status_escalate', 'tool_calls', ['status', 'escalate_at'])
    op.create_table(
        'notification_channels',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column(
            'tenant_id', sa.Integer(),
            sa.ForeignKey('tenants.id', name='fk_notification_channels_tenant_id_tenants'), nullable=False,
        ),
        sa.Column('kind', sa.String(16), nullable=False),
        sa.Column('url', sa.String(2000), nullable=True),
        sa.Column('secret_sealed', sa.Text(), nullable=True),
        sa.Column('recipients', JSON, nullable=True),
        sa.Column(
            'created_by_id', sa.Integer(),
            sa.ForeignKey('users.id', name='fk_notification_channels_created_by_id_users'), nullable=True,
        ),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name='pk_notification_channels'),
        sa.UniqueConstraint('tenant_id', 'kind', name='uq_notification_channels_tenant_kind'),
    )
    op.create_table(
        'notification_deliveries',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column(
            'tenant_id', sa.Integer(),
            sa.ForeignKey('tenants.id', name='fk_notification_deliveries_tenant_id_tenants'), nullable=False,
        ),
        sa.Column(
            'channel_id', sa.Integer(),
            sa.ForeignKey('notification_channels.id', name='fk_notification_deliveries_channel_id_notification_channels'),
            nullable=True,
        ),
        sa.Column('channel_kind', sa.String(16), nullable=False),
        sa.Column(
            'tool_call_id', sa.Integer(),
            sa.ForeignKey('tool_calls.id', name='fk_notification_deliveries_tool_call_id_tool_calls'), nullable=True,
        ),
        sa.Column('kind', sa.String(16), nullable=False),
        sa.Column('attempt', sa.Integer(), nullable=False),
        sa.Column('status', sa.String(16), nullable=False),
        sa.Column('http_status', sa.Integer(), nullable=True),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name='pk_notification_deliveries'),
    )
    op.create_index('ix_notification_deliveries_tenant_id', 'notification_deliveries', ['tenant_id', 'id'])
    op.create_index(
        'ix_notification_deliveries_call', 'notification_deliveries', ['tool_call_id', 'channel_id', 'kind']
    )


def downgrade():
    op.drop_index('ix_notification_deliveries_call', table_name='notification_deliveries')
    op.drop_index('ix_notification_deliveries_tenant_id', table_name='notification_deliveries')
    op.drop_table('notification_deliveries')
    op.drop_table('notification_channels')
    op.drop_index('ix_tool_calls_status_escalate', table_name='tool_calls')
    op.drop_index('ix_tool_calls_status_remind', table_name='tool_calls')
    with op.batch_alter_table('tool_calls') as batch:
        batch.drop_column('escalated_at')
        batch.drop_column('reminded_at')
        batch.drop_column('escalate_at')
        batch.drop_column('remind_at')
    with op.batch_alter_table('tool_policies') as batch:
        batch.drop_column('remind_after_seconds')
