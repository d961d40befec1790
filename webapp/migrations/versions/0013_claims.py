"""Claims: a reviewer who opens a waiting call holds it for a few minutes; others see who.

Revision ID: 0013_claims
Revises: 0012_sessions_tokens
"""
import sqlalchemy as sa
from alembic import op

revision = '0013_claims'
down_revision = '0012_sessions_tokens'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('tool_calls') as batch:
        batch.add_column(sa.Column('claimed_by_id', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('claimed_until', sa.DateTime(timezone=True), nullable=True))
        batch.create_foreign_key('fk_tool_calls_claimed_by_id_users', 'users', ['claimed_by_id'], ['id'])


def downgrade():
    with op.batch_alter_table('tool_calls') as batch:
        batch.drop_constraint('fk_tool_calls_claimed_by_id_users', type_='foreignkey')
        batch.drop_column('claimed_until')
        batch.drop_column('claimed_by_id')
