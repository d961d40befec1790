"""Browser sessions kept server-side (signing out ends one for good; the idle clock and the longest a
session lasts are checked there), and API tokens with a name, their first characters and an expiry.

Revision ID: 0012_sessions_tokens
Revises: 0011_policy_limits
"""
import sqlalchemy as sa
from alembic import op

revision = '0012_sessions_tokens'
down_revision = '0011_policy_limits'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'user_sessions',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column(
            'user_id', sa.Integer(), sa.ForeignKey('users.id', name='fk_user_sessions_user_id_users'), nullable=False
        ),
        sa.Column('key_hash', sa.String(64), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('last_seen_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint('id', name='pk_user_sessions'),
        sa.UniqueConstraint('key_hash', name='uq_user_sessions_key_hash'),
    )
    op.create_index('ix_user_sessions_user_id', 'user_sessions', ['user_id'])
    with op.batch_alter_table('api_tokens') as batch:
        batch.add_column(sa.Column('name', sa.String(100), nullable=False, server_default=''))
        batch.add_column(sa.Column('prefix', sa.String(16), nullable=False, server_default=''))
        batch.add_column(sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True))
        batch.create_index('ix_api_tokens_prefix', ['prefix'])


def downgrade():
    with op.batch_alter_table('api_tokens') as batch:
        batch.drop_index('ix_api_tokens_prefix')
        batch.drop_column('expires_at')
        batch.drop_column('prefix')
        batch.drop_column('name')
    op.drop_index('ix_user_sessions_user_id', table_name='user_sessions')
    op.drop_table('user_sessions')
