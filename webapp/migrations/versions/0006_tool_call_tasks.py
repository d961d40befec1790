"""Tasks: a tool call can wait on its tool's long-running task.

Revision ID: 0006
Revises: 0005
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('tool_calls') as batch:
        batch.add_column(sa.Column('task', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True))
        batch.add_column(sa.Column('task_due_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('task_progress_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('task_input', sa.Text(), nullable=True))
    op.create_index('ix_tool_calls_status_task_due', 'tool_calls', ['status', 'task_due_at'])


def downgrade():
    op.drop_index('ix_tool_calls_status_task_due', table_name='tool_calls')
    with op.batch_alter_table('tool_calls') as batch:
        batch.drop_column('task_input')
        batch.drop_column('task_progress_at')
        batch.drop_column('task_due_at')
        batch.drop_column('task')
