"""What an admin maps of an MCP tool's arguments: the money it moves (and its unit), what it acts on,
and a read-only tool of the same server whose live result reviewers see as the facts.

Revision ID: 0022_mcp_mapping
Revises: 0021_tool_hooks
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0022_mcp_mapping'
down_revision = '0021_tool_hooks'
branch_labels = None
depends_on = None


def upgrade():
    json_type = sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')
    with op.batch_alter_table('mcp_tools') as batch:
        batch.add_column(sa.Column('mapping', json_type, nullable=True))


def downgrade():
    with op.batch_alter_table('mcp_tools') as batch:
        batch.drop_column('mapping')
