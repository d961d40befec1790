"""One gate, every path: amounts as 64-bit money, the reviewer whose edit widened a call, idempotency
keys per asker, secrets granted to tenants, who keyed whom, the admin role held for four eyes, and the
default policies in force for the packs' tools.

Revision ID: 0027_one_gate
Revises: 0026_runs
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0027_one_gate'
down_revision = '0026_runs'
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')


def upgrade():
    with op.batch_alter_table('tool_calls') as batch:
        batch.alter_column('money_cents', type_=sa.BigInteger(), existing_type=sa.Integer(), existing_nullable=True)
        batch.add_column(sa.Column('widened_by_id', sa.Integer(), nullable=True))
        batch.create_foreign_key('fk_tool_calls_widened_by_id_users', 'users', ['widened_by_id'], ['id'])
    with op.batch_alter_table('external_calls') as batch:
        batch.add_column(sa.Column('asked_by_id', sa.Integer(), nullable=True))
    op.execute(
        'UPDATE external_calls SET asked_by_id = '
        '(SELECT acting_user_id FROM tool_calls WHERE tool_calls.id = external_calls.tool_call_id)'
    )
    with op.batch_alter_table('external_calls') as batch:
        batch.alter_column('asked_by_id', existing_type=sa.Integer(), nullable=False)
        batch.create_foreign_key('fk_external_calls_asked_by_id_users', 'users', ['asked_by_id'], ['id'])
        batch.drop_constraint('uq_external_calls_tenant_key', type_='unique')
        batch.create_unique_constraint(
            'uq_external_calls_asker_key', ['tenant_id', 'asked_by_id', 'idempotency_key']
        )
    op.create_table(
        'secret_grants',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('name', sa.String(length=128), nullable=False),
        sa.Column('tenant_id', sa.Integer(), nullable=False),
        sa.Column('granted_by_id', sa.Integer(), nullable=True),
        sa.Column('granted_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name='fk_secret_grants_tenant_id_tenants'),
        sa.ForeignKeyConstraint(['granted_by_id'], ['users.id'], name='fk_secret_grants_granted_by_id_users'),
        sa.PrimaryKeyConstraint('id', name='pk_secret_grants'),
        sa.UniqueConstraint('name', 'tenant_id', name='uq_secret_grants_name_tenant'),
    )
    op.create_index('ix_secret_grants_tenant_id', 'secret_grants', ['tenant_id'])
    op.create_table(
        'user_keyings',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('tenant_id', sa.Integer(), nullable=False),
        sa.Column('user_id', sa.Integer(), nullable=False),
        sa.Column('by_user_id', sa.Integer(), nullable=False),
        sa.Column('kind', sa.String(length=32), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name='fk_user_keyings_tenant_id_tenants'),
        sa.ForeignKeyConstraint(['user_id'], ['users.id'], name='fk_user_keyings_user_id_users'),
        sa.ForeignKeyConstraint(['by_user_id'], ['users.id'], name='fk_user_keyings_by_user_id_users'),
        sa.PrimaryKeyConstraint('id', name='pk_user_keyings'),
    )
    op.create_index('ix_user_keyings_tenant_id', 'user_keyings', ['tenant_id'])
    op.create_index('ix_user_keyings_user_id', 'user_keyings', ['user_id'])
    op.create_index('ix_user_keyings_by_user_id', 'user_keyings', ['by_user_id'])
    op.create_table(
        'role_changes',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('tenant_id', sa.Integer(), nullable=False),
        sa.Column('user_id', sa.Integer(), nullable=False),
        sa.Column('role', sa.String(length=32), nullable=False),
        sa.Column('why', sa.String(length=32), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('requested_by_id', sa.Integer(), nullable=True),
        sa.Column('requested_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('decided_by_id', sa.Integer(), nullable=True),
        sa.Column('decided_by_label', sa.String(length=255), nullable=True),
        sa.Column('decided_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('reason', sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], name='fk_role_changes_tenant_id_tenants'),
        sa.ForeignKeyConstraint(['user_id'], ['users.id'], name='fk_role_changes_user_id_users'),
        sa.ForeignKeyConstraint(['requested_by_id'], ['users.id'], name='fk_role_changes_requested_by_id_users'),
        sa.ForeignKeyConstraint(['decided_by_id'], ['users.id'], name='fk_role_changes_decided_by_id_users'),
        sa.PrimaryKeyConstraint('id', name='pk_role_changes'),
    )
    op.create_index('ix_role_changes_tenant_id', 'role_changes', ['tenant_id'])
    op.create_table(
        'tool_defaults',
        sa.Column('tool_name', sa.String(length=128), nullable=False),
        sa.Column('settings', JSON, nullable=False),
        sa.Column('held', JSON, nullable=True),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('tool_name', name='pk_tool_defaults'),
    )


def downgrade():
    op.drop_table('tool_defaults')
    op.drop_table('role_changes')
    op.drop_table('user_keyings')
    op.drop_table('secret_grants')
    with op.batch_alter_table('external_calls') as batch:
        batch.drop_constraint('uq_external_calls_asker_key', type_='unique')
        batch.create_unique_constraint('uq_external_calls_tenant_key', ['tenant_id', 'idempotency_key'])
        batch.drop_constraint('fk_external_calls_asked_by_id_users', type_='foreignkey')
        batch.drop_column('asked_by_id')
    with op.batch_alter_table('tool_calls') as batch:
        batch.drop_constraint('fk_tool_calls_widened_by_id_users', type_='foreignkey')
        batch.drop_column('widened_by_id')
        batch.alter_column('money_cents', type_=sa.Integer(), existing_type=sa.BigInteger(), existing_nullable=True)
