"""Bulk runs: a run's items, each a conversation of its own; the model moves of a batch run parked
for the Message Batches API; a model call answered by a batch.

Revision ID: 0026_runs
Revises: 0025_external_calls
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0026_runs'
down_revision = '0025_external_calls'
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')


def upgrade():
    op.create_table(
        'runs',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('tenant_id', sa.Integer(), nullable=False),
        sa.Column('user_id', sa.Integer(), nullable=False),
        sa.Column('title', sa.String(length=200), nullable=False),
        sa.Column('batch', sa.Boolean(), nullable=False),
        sa.Column('items', sa.Integer(), nullable=False),
        sa.Column('started', sa.Integer(), nullable=False),
        sa.Column('cancelled_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('cancelled_by_id', sa.Integer(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id']),
        sa.ForeignKeyConstraint(['user_id'], ['users.id']),
        sa.ForeignKeyConstraint(['cancelled_by_id'], ['users.id']),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_runs_tenant_id', 'runs', ['tenant_id'])
    with op.batch_alter_table('conversations') as batch:
        batch.add_column(sa.Column('run_id', sa.Integer(), nullable=True))
        batch.create_foreign_key('fk_conversations_run_id_runs', 'runs', ['run_id'], ['id'])
        batch.create_index('ix_conversations_run_id', ['run_id'])
    op.create_table(
        'run_items',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('run_id', sa.Integer(), nullable=False),
        sa.Column('position', sa.Integer(), nullable=False),
        sa.Column('message', sa.Text(), nullable=False),
        sa.Column('conversation_id', sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(['run_id'], ['runs.id']),
        sa.ForeignKeyConstraint(['conversation_id'], ['conversations.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('run_id', 'position', name='uq_run_items_run_position'),
    )
    op.create_table(
        'batch_requests',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('conversation_id', sa.Integer(), nullable=False),
        sa.Column('tenant_id', sa.Integer(), nullable=False),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('params', JSON, nullable=False),
        sa.Column('endpoint', sa.String(length=64), nullable=True),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('batch_id', sa.String(length=120), nullable=True),
        sa.Column('result', JSON, nullable=True),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('answer_version', sa.Integer(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('sent_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('done_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['conversation_id'], ['conversations.id']),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id']),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_batch_requests_conversation_id', 'batch_requests', ['conversation_id'])
    op.create_index('ix_batch_requests_status', 'batch_requests', ['status'])
    op.create_index('ix_batch_requests_batch_id', 'batch_requests', ['batch_id'])
    with op.batch_alter_table('model_calls') as batch:
        batch.add_column(sa.Column('batch_id', sa.String(length=120), nullable=True))


def downgrade():
    with op.batch_alter_table('model_calls') as batch:
        batch.drop_column('batch_id')
    op.drop_table('batch_requests')
    op.drop_table('run_items')
    with op.batch_alter_table('conversations') as batch:
        batch.drop_index('ix_conversations_run_id')
        batch.drop_constraint('fk_conversations_run_id_runs', type_='foreignkey')
        batch.drop_column('run_id')
    op.drop_index('ix_runs_tenant_id', 'runs')
    op.drop_table('runs')
