"""Event webhooks: a tenant's subscriptions (where events go, signed with a secret of their own, as
Standard Webhooks say) and every event's delivery to each, with its body and its last attempt.

Revision ID: 0024_webhooks
Revises: 0023_tools_version
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0024_webhooks'
down_revision = '0023_tools_version'
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')


def upgrade():
    op.create_table(
        'webhook_subscriptions',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('tenant_id', sa.Integer(), sa.ForeignKey('tenants.id'), nullable=False),
        sa.Column('url', sa.String(2000), nullable=False),
        sa.Column('events', JSON, nullable=False),
        sa.Column('secret_sealed', sa.Text(), nullable=False),
        sa.Column('through_seq', sa.BigInteger(), nullable=False),
        sa.Column('created_by_id', sa.Integer(), sa.ForeignKey('users.id'), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('deleted_at', sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index('ix_webhook_subscriptions_tenant_id', 'webhook_subscriptions', ['tenant_id'])
    op.create_table(
        'webhook_deliveries',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('subscription_id', sa.Integer(), sa.ForeignKey('webhook_subscriptions.id'), nullable=False),
        sa.Column('event_id', sa.String(40), nullable=False),
        sa.Column('event_type', sa.String(64), nullable=False),
        sa.Column('conversation_id', sa.Integer(), nullable=True),
        sa.Column('body', sa.Text(), nullable=False),
        sa.Column('status', sa.String(16), nullable=False),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('http_status', sa.Integer(), nullable=True),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint('subscription_id', 'event_id', name='uq_webhook_deliveries_event'),
    )
    op.create_index('ix_webhook_deliveries_pending', 'webhook_deliveries', ['subscription_id', 'status', 'id'])


def downgrade():
    op.drop_table('webhook_deliveries')
    op.drop_table('webhook_subscriptions')
