"""A tenant's tools version: the database moves it on with every change to who may use the tenant's
tools (tool_access) and to its MCP servers and their tools, so each process keeps the tenant's tool
registry and access rules and reads one number (in a move's claim) to know they still hold.

Revision ID: 0023_tools_version
Revises: 0022_mcp_mapping
"""
import sqlalchemy as sa
from alembic import op

revision = '0023_tools_version'
down_revision = '0022_mcp_mapping'
branch_labels = None
depends_on = None

TABLES = ('tool_access', 'mcp_servers', 'mcp_tools')  # each has the tenant_id of its row
BUMP = 'UPDATE tenants SET tools_version = tools_version + 1 WHERE id = {row}.tenant_id'

POSTGRESQL_FUNCTION = """
CREATE OR REPLACE FUNCTION desk_tools_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        UPDATE tenants SET tools_version = tools_version + 1 WHERE id = OLD.tenant_id;
    END IF;
    IF TG_OP <> 'DELETE' AND (TG_OP = 'INSERT' OR NEW.tenant_id IS DISTINCT FROM OLD.tenant_id) THEN
        UPDATE tenants SET tools_version = tools_version + 1 WHERE id = NEW.tenant_id;
    END IF;
    RETURN NULL;
END $$
"""


def upgrade():
    op.add_column('tenants', sa.Column('tools_version', sa.Integer(), nullable=False, server_default='0'))
    if op.get_bind().dialect.name == 'postgresql':
        op.execute(POSTGRESQL_FUNCTION)
        for table in TABLES:
            op.execute(
                f'CREATE TRIGGER {table}_tools_changed AFTER INSERT OR UPDATE OR DELETE ON {table} '
                'FOR EACH ROW EXECUTE FUNCTION desk_tools_changed()'
            )
        return
    for table in TABLES:  # SQLite: a trigger per kind of change
        op.execute(f'CREATE TRIGGER {table}_inserted AFTER INSERT ON {table} BEGIN {BUMP.format(row="NEW")}; END')
        op.execute(
            f'CREATE TRIGGER {table}_updated AFTER UPDATE ON {table} BEGIN '
            f'{BUMP.format(row="OLD")}; {BUMP.format(row="NEW")} AND NEW.tenant_id IS NOT OLD.tenant_id; END'
        )
        op.execute(f'CREATE TRIGGER {table}_deleted AFTER DELETE ON {table} BEGIN {BUMP.format(row="OLD")}; END')


def downgrade():
    if op.get_bind().dialect.name == 'postgresql':
        for table in TABLES:
            op.execute(f'DROP TRIGGER IF EXISTS {table}_tools_changed ON {table}')
        op.execute('DROP FUNCTION IF EXISTS desk_tools_changed()')
    else:
        for table in TABLES:
            for change in ('inserted', 'updated', 'deleted'):
                op.execute(f'DROP TRIGGER IF EXISTS {table}_{change}')
    with op.batch_alter_table('tenants') as batch:
        batch.drop_column('tools_version')
