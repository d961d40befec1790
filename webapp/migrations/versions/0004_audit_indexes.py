"""audit indexes for the auditors' pages

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 17:10:00.000000

The audit browser lists a tenant's events newest first by id (keyset), and filters by tool. Without
(tenant_id, id) SQLite sorts every event of the tenant to show the first page (seconds at a million
events); (tenant_id, tool_name, id) serves the tool filter the same way.
"""
from alembic import op


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade():
    op.create_index('ix_audit_events_tenant_id_order', 'audit_events', ['tenant_id', 'id'], unique=False)
    op.create_index('ix_audit_events_tenant_tool', 'audit_events', ['tenant_id', 'tool_name', 'id'], unique=False)


def downgrade():
    op.drop_index('ix_audit_events_tenant_tool', table_name='audit_events')
    op.drop_index('ix_audit_events_tenant_id_order', table_name='audit_events')
