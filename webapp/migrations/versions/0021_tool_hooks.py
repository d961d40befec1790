"""The core names no tool: each tool call keeps the money it moves (`money_cents`, from the tool's
`amount`) and what it acts on (`subject`, "customer:4471", from the tool's `subject`) instead of a
customer id; limits per customer become limits per subject.

Revision ID: 0021_tool_hooks
Revises: 0020_mcp_doors
"""
import json

import sqlalchemy as sa
from alembic import op

revision = '0021_tool_hooks'
down_revision = '0020_mcp_doors'
branch_labels = None
depends_on = None

RENAMED = {'customer_day_count': 'subject_day_count', 'customer_day_cents': 'subject_day_cents'}


def upgrade():
    with op.batch_alter_table('tool_calls') as batch:
        batch.add_column(sa.Column('money_cents', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('subject', sa.String(length=200), nullable=True))
    bind = op.get_bind()
    # Calls made before: the amount the core used to read (an integer `amount_cents` argument), and
    # the customer a call acted on as its subject.
    if bind.dialect.name == 'postgresql':
        op.execute(
            "UPDATE tool_calls SET money_cents = (input->>'amount_cents')::bigint "
            "WHERE jsonb_typeof(input->'amount_cents') = 'number' "
            "AND (input->>'amount_cents') ~ '^-?[0-9]{1,9}$'"
        )
    else:
        op.execute(
            "UPDATE tool_calls SET money_cents = json_extract(input, '$.amount_cents') "
            "WHERE json_type(input, '$.amount_cents') = 'integer'"
        )
    op.execute("UPDATE tool_calls SET subject = 'customer:' || customer_id WHERE customer_id IS NOT NULL")
    with op.batch_alter_table('tool_calls') as batch:
        batch.drop_column('customer_id')
    _rename_limits(bind, RENAMED)


def downgrade():
    bind = op.get_bind()
    _rename_limits(bind, {new: old for old, new in RENAMED.items()})
    with op.batch_alter_table('tool_calls') as batch:
        batch.add_column(sa.Column('customer_id', sa.Integer(), nullable=True))
    if bind.dialect.name == 'postgresql':
        op.execute(
            "UPDATE tool_calls SET customer_id = split_part(subject, ':', 2)::int WHERE subject ~ '^customer:[0-9]{1,9}$'"
        )
    else:
        op.execute(
            "UPDATE tool_calls SET customer_id = CAST(substr(subject, 10) AS INTEGER) WHERE subject LIKE 'customer:%'"
        )
    with op.batch_alter_table('tool_calls') as batch:
        batch.drop_column('subject')
        batch.drop_column('money_cents')


def _rename_limits(bind, names: dict) -> None:
    """Policies and waiting changes keep their limits under the new names."""
    policies = sa.table('tool_policies', sa.column('id', sa.Integer), sa.column('limits', sa.JSON))
    for row_id, limits in bind.execute(sa.select(policies.c.id, policies.c.limits)).all():
        limits = _loaded(limits)
        if isinstance(limits, dict) and any(name in limits for name in names):
            bind.execute(policies.update().where(policies.c.id == row_id).values(limits=_renamed(limits, names)))
    changes = sa.table(
        'policy_changes', sa.column('id', sa.Integer), sa.column('proposed', sa.JSON), sa.column('before', sa.JSON)
    )
    for row_id, proposed, before in bind.execute(sa.select(changes.c.id, changes.c.proposed, changes.c.before)).all():
        proposed, before = _loaded(proposed), _loaded(before)
        bind.execute(
            changes.update()
            .where(changes.c.id == row_id)
            .values(
                proposed={**proposed, 'limits': _renamed(proposed.get('limits') or {}, names)},
                before={**before, 'limits': _renamed(before.get('limits') or {}, names)},
            )
        )


def _loaded(value):
    return json.loads(value) if isinstance(value, str) else value


def _renamed(limits: dict, names: dict) -> dict:
    return {names.get(key, key): value for key, value in limits.items()}
