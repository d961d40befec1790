"""MCP doors that belong to the operator: a started server's variables and working directory, whether
an operator set its command, and who set each header.

Rows stored before: a command is taken as an operator's only when the server was added from the
command line (created_by_id IS NULL); one a tenant's admin added is never started until an operator
adds it again. Each header is marked "operator" the same way, so a $VARIABLE a tenant's admin named
is read only when it carries MCP_SECRET_PREFIX.

Revision ID: 0020_mcp_doors
Revises: 0019_endpoint_tenants
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0020_mcp_doors'
down_revision = '0019_endpoint_tenants'
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')


def upgrade():
    with op.batch_alter_table('mcp_servers') as batch:
        batch.add_column(sa.Column('environment', JSON, nullable=False, server_default=sa.text("'[]'")))
        batch.add_column(sa.Column('working_directory', sa.String(500), nullable=True))
        batch.add_column(sa.Column('command_by_operator', sa.Boolean(), nullable=False, server_default=sa.false()))
    servers = sa.table(
        'mcp_servers',
        sa.column('id', sa.Integer()),
        sa.column('command', sa.Text()),
        sa.column('headers', JSON),
        sa.column('created_by_id', sa.Integer()),
        sa.column('command_by_operator', sa.Boolean()),
    )
    connection = op.get_bind()
    connection.execute(
        servers.update()
        .where(servers.c.command.is_not(None), servers.c.created_by_id.is_(None))
        .values(command_by_operator=True)
    )
    for server_id, headers, created_by_id in connection.execute(
        sa.select(servers.c.id, servers.c.headers, servers.c.created_by_id)
    ).all():
        if headers:
            marked = [{**header, 'operator': created_by_id is None} for header in headers]
            connection.execute(servers.update().where(servers.c.id == server_id).values(headers=marked))


def downgrade():
    servers = sa.table('mcp_servers', sa.column('id', sa.Integer()), sa.column('headers', JSON))
    connection = op.get_bind()
    for server_id, headers in connection.execute(sa.select(servers.c.id, servers.c.headers)).all():
        if headers:
            unmarked = [{key: value for key, value in header.items() if key != 'operator'} for header in headers]
            connection.execute(servers.update().where(servers.c.id == server_id).values(headers=unmarked))
    with op.batch_alter_table('mcp_servers') as batch:
        batch.drop_column('command_by_operator')
        batch.drop_column('working_directory')
        batch.drop_column('environment')
