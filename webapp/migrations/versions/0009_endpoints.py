"""Model endpoints: Anthropic-compatible servers an operator registers, the one serving each tenant,
and the endpoint that served each model call.

Revision ID: 0009_endpoints
Revises: 0008
"""
import sqlalchemy as sa
from alembic import op

revision = '0009_endpoints'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'model_endpoints',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('name', sa.String(64), nullable=False),
        sa.Column('base_url', sa.String(500), nullable=False),
        sa.Column('model', sa.String(120), nullable=False),
        sa.Column('protocol', sa.String(16), nullable=False),
        sa.Column('context_window', sa.Integer(), nullable=True),
        sa.Column('api_key_encrypted', sa.Text(), nullable=True),
        sa.Column('api_key_env', sa.String(120), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint('name', name='uq_model_endpoints_name'),
        sa.PrimaryKeyConstraint('id', name='pk_model_endpoints'),
    )
    with op.batch_alter_table('tenants') as batch:
        batch.add_column(
            sa.Column('endpoint_id', sa.Integer(), sa.ForeignKey('model_endpoints.id', name='fk_tenants_endpoint_id_model_endpoints'))
        )
    with op.batch_alter_table('model_calls') as batch:
        batch.add_column(sa.Column('endpoint', sa.String(64), nullable=True))


def downgrade():
    with op.batch_alter_table('model_calls') as batch:
        batch.drop_column('endpoint')
    with op.batch_alter_table('tenants') as batch:
        batch.drop_column('endpoint_id')
    op.drop_table('model_endpoints')
