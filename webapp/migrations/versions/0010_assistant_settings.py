"""How a tenant's admins want the assistant to work (register, extra rules, one tool call per
reply), versioned, and the version each model call was sent.

Revision ID: 0010_assistant_settings
Revises: 0009_endpoints
"""
import sqlalchemy as sa
from alembic import op

revision = '0010_assistant_settings'
down_revision = '0009_endpoints'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'assistant_settings',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column(
            'tenant_id', sa.Integer(), sa.ForeignKey('tenants.id', name='fk_assistant_settings_tenant_id_tenants'),
            nullable=False,
        ),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('register', sa.String(200), nullable=False),
        sa.Column('rules', sa.Text(), nullable=False),
        sa.Column('one_call_per_reply', sa.Boolean(), nullable=False),
        sa.Column(
            'created_by_id', sa.Integer(), sa.ForeignKey('users.id', name='fk_assistant_settings_created_by_id_users'),
            nullable=True,
        ),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name='pk_assistant_settings'),
        sa.UniqueConstraint('tenant_id', 'version', name='uq_assistant_settings_tenant_version'),
    )
    with op.batch_alter_table('model_calls') as batch:
        batch.add_column(sa.Column('settings_version', sa.Integer(), nullable=True))


def downgrade():
    with op.batch_alter_table('model_calls') as batch:
        batch.drop_column('settings_version')
    op.drop_table('assistant_settings')
