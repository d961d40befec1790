"""Policy changes that wait for a second admin; operators' ceilings per tool.

Revision ID: 0018_policy_changes
Revises: 0017_mcp
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0018_policy_changes'
down_revision = '0017_mcp'
branch_labels = None
depends_on = None


def upgrade():
    json_type = sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')
    op.create_table(
        'policy_changes',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('tenant_id', sa.Integer(), sa.ForeignKey('tenants.id'), nullable=False),
        sa.Column('tool_name', sa.String(length=128), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('proposed', json_type, nullable=False),
        sa.Column('before', json_type, nullable=False),
        sa.Column('base_version', sa.Integer(), nullable=False),
        sa.Column('loosens', json_type, nullable=False),
        sa.Column('source', sa.String(length=32), nullable=False),
        sa.Column('requested_by_id', sa.Integer(), sa.ForeignKey('users.id'), nullable=True),
        sa.Column('requested_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('decided_by_id', sa.Integer(), sa.ForeignKey('users.id'), nullable=True),
        sa.Column('decided_by_label', sa.String(length=255), nullable=True),
        sa.Column('decided_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('reason', sa.Text(), nullable=True),
        sa.Column('applied_version', sa.Integer(), nullable=True),
    )
    op.create_index('ix_policy_changes_tenant_id', 'policy_changes', ['tenant_id'])
    op.create_table(
        'tool_ceilings',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('tool_name', sa.String(length=128), nullable=False),
        sa.Column('ceiling_cents', sa.Integer(), nullable=True),
        sa.Column('set_by_id', sa.Integer(), sa.ForeignKey('users.id'), nullable=True),
        sa.Column('set_at', sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint('tool_name', name='uq_tool_ceilings_tool_name'),
    )


def downgrade():
    op.drop_table('tool_ceilings')
    op.drop_index('ix_policy_changes_tenant_id', table_name='policy_changes')
    op.drop_table('policy_changes')
