"""Approvals for agents that run elsewhere: the tools they declare (joining the tenant's tools version,
as MCP tools do) and what they send with each call they ask about; a conversation and a call name the
outside agent they come from.

Revision ID: 0025_external_calls
Revises: 0024_webhooks
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0025_external_calls'
down_revision = '0024_webhooks'
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')
BUMP = 'UPDATE tenants SET tools_version = tools_version + 1 WHERE id = {row}.tenant_id'


def upgrade():
    op.create_table(
        'external_tools',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('tenant_id', sa.Integer(), nullable=False),
        sa.Column('name', sa.String(length=128), nullable=False),
        sa.Column('description', sa.Text(), nullable=False),
        sa.Column('input_schema', JSON, nullable=False),
        sa.Column('amount_argument', sa.String(length=128), nullable=True),
        sa.Column('amount_unit', sa.String(length=8), nullable=False),
        sa.Column('subject_argument', sa.String(length=128), nullable=True),
        sa.Column('created_by_id', sa.Integer(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_by_id', sa.Integer(), nullable=True),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id']),
        sa.ForeignKeyConstraint(['created_by_id'], ['users.id']),
        sa.ForeignKeyConstraint(['updated_by_id'], ['users.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('tenant_id', 'name', name='uq_external_tools_tenant_name'),
    )
    op.create_table(
        'external_calls',
        sa.Column('tool_call_id', sa.Integer(), nullable=False),
        sa.Column('tenant_id', sa.Integer(), nullable=False),
        sa.Column('source', sa.String(length=64), nullable=False),
        sa.Column('context', sa.Text(), nullable=False),
        sa.Column('facts', JSON, nullable=False),
        sa.Column('idempotency_key', sa.String(length=200), nullable=False),
        sa.Column('request_hash', sa.String(length=64), nullable=False),
        sa.Column('outcome_ok', sa.Boolean(), nullable=True),
        sa.Column('outcome_summary', sa.Text(), nullable=True),
        sa.Column('outcome_output', JSON, nullable=True),
        sa.Column('outcome_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['tool_call_id'], ['tool_calls.id']),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id']),
        sa.PrimaryKeyConstraint('tool_call_id'),
        sa.UniqueConstraint('tenant_id', 'idempotency_key', name='uq_external_calls_tenant_key'),
    )
    with op.batch_alter_table('conversations') as batch:
        batch.add_column(sa.Column('source', sa.String(length=64), nullable=True))
    with op.batch_alter_table('tool_calls') as batch:
        batch.add_column(sa.Column('source', sa.String(length=64), nullable=True))
    # a declared tool joins its tenant's tools: every change moves the tenant's tools version (0023)
    if op.get_bind().dialect.name == 'postgresql':
        op.execute(
            'CREATE TRIGGER external_tools_tools_changed AFTER INSERT OR UPDATE OR DELETE ON external_tools '
            'FOR EACH ROW EXECUTE FUNCTION desk_tools_changed()'
        )
        return
    table = 'external_tools'
    op.execute(f'CREATE TRIGGER {table}_inserted AFTER INSERT ON {table} BEGIN {BUMP.format(row="NEW")}; END')
    op.execute(
        f'CREATE TRIGGER {table}_updated AFTER UPDATE ON {table} BEGIN '
        f'{BUMP.format(row="OLD")}; {BUMP.format(row="NEW")} AND NEW.tenant_id IS NOT OLD.tenant_id; END'
    )
    op.execute(f'CREATE TRIGGER {table}_deleted AFTER DELETE ON {table} BEGIN {BUMP.format(row="OLD")}; END')


def downgrade():
    if op.get_bind().dialect.name == 'postgresql':
        op.execute('DROP TRIGGER IF EXISTS external_tools_tools_changed ON external_tools')
    else:
        for change in ('inserted', 'updated', 'deleted'):
            op.execute(f'DROP TRIGGER IF EXISTS external_tools_{change}')
    with op.batch_alter_table('tool_calls') as batch:
        batch.drop_column('source')
    with op.batch_alter_table('conversations') as batch:
        batch.drop_column('source')
    op.drop_table('external_calls')
    op.drop_table('external_tools')
