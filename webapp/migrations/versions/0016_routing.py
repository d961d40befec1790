"""Routing by difficulty: a tenant's small endpoint, the routing rules of its assistant settings,
the route of a conversation's current run, and why each model call went where it went.

Revision ID: 0016_routing
Revises: 0015_notifications
"""
import sqlalchemy as sa
from alembic import op

revision = '0016_routing'
down_revision = '0015_notifications'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('tenants') as batch:
        batch.add_column(
            sa.Column(
                'small_endpoint_id',
                sa.Integer(),
                sa.ForeignKey('model_endpoints.id', name='fk_tenants_small_endpoint_id_model_endpoints'),
                nullable=True,
            )
        )
    with op.batch_alter_table('assistant_settings') as batch:
        batch.add_column(sa.Column('complex_words', sa.Text(), nullable=True))
        batch.add_column(sa.Column('complex_length', sa.Integer(), nullable=True))
    with op.batch_alter_table('conversations') as batch:
        batch.add_column(sa.Column('route', sa.String(16), nullable=True))
        batch.add_column(sa.Column('route_reason', sa.String(160), nullable=True))
    with op.batch_alter_table('model_calls') as batch:
        batch.add_column(sa.Column('route', sa.String(160), nullable=True))


def downgrade():
    with op.batch_alter_table('model_calls') as batch:
        batch.drop_column('route')
    with op.batch_alter_table('conversations') as batch:
        batch.drop_column('route_reason')
        batch.drop_column('route')
    with op.batch_alter_table('assistant_settings') as batch:
        batch.drop_column('complex_length')
        batch.drop_column('complex_words')
    with op.batch_alter_table('tenants') as batch:
        batch.drop_column('small_endpoint_id')
