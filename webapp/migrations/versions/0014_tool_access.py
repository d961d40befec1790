"""Who may have the assistant use each tool, per tenant; why a conversation was stopped.

Revision ID: 0014_tool_access
Revises: 0013_claims
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0014_tool_access'
down_revision = '0013_claims'
branch_labels = None
depends_on = None


def upgrade():
    json_type = sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')
    op.create_table(
        'tool_access',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('tenant_id', sa.Integer(), sa.ForeignKey('tenants.id'), nullable=False),
        sa.Column('tool_name', sa.String(length=128), nullable=False),
        sa.Column('who', sa.String(length=16), nullable=False),
        sa.Column('roles', json_type, nullable=False),
        sa.Column('user_ids', json_type, nullable=False),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('updated_by_id', sa.Integer(), sa.ForeignKey('users.id'), nullable=True),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint('tenant_id', 'tool_name', name='uq_tool_access_tenant_tool'),
    )
    with op.batch_alter_table('conversations') as batch:
        batch.add_column(sa.Column('cancel_reason', sa.String(length=200), nullable=True))


def downgrade():
    with op.batch_alter_table('conversations') as batch:
        batch.drop_column('cancel_reason')
    op.drop_table('tool_access')
