"""Long conversations: summaries of older turns, and what each model call was sent (its purpose, the
hashes of its system prompt and tool definitions, the summary it stood on).

Revision ID: 0008
Revises: 0007
"""
import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'summaries',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column(
            'conversation_id',
            sa.Integer(),
            sa.ForeignKey('conversations.id', name='fk_summaries_conversation_id_conversations'),
            nullable=False,
        ),
        sa.Column('through_seq', sa.Integer(), nullable=False),
        sa.Column('text', sa.Text(), nullable=False),
        sa.Column('tokens_before', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name='pk_summaries'),
    )
    op.create_index('ix_summaries_conversation_id', 'summaries', ['conversation_id'])
    with op.batch_alter_table('model_calls') as batch:
        batch.add_column(sa.Column('purpose', sa.String(16), nullable=False, server_default='answer'))
        batch.add_column(sa.Column('system_hash', sa.String(64), nullable=True))
        batch.add_column(sa.Column('tools_hash', sa.String(64), nullable=True))
        batch.add_column(
            sa.Column('summary_id', sa.Integer(), sa.ForeignKey('summaries.id', name='fk_model_calls_summary_id_summaries'))
        )


def downgrade():
    with op.batch_alter_table('model_calls') as batch:
        batch.drop_column('summary_id')
        batch.drop_column('tools_hash')
        batch.drop_column('system_hash')
        batch.drop_column('purpose')
    op.drop_index('ix_summaries_conversation_id', table_name='summaries')
    op.drop_table('summaries')
