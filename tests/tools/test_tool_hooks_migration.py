"""Migration 0021: calls made before the tools declared their amount and subject keep both (the amount
the core used to read, the customer they acted on), and policies keep their limits per customer as
limits per subject."""

from __future__ import annotations

import json

import sqlalchemy as sa
from sqlalchemy import text

from tests.migrations import flask_db, insert_row, revision_before

REVISION = "0021_tool_hooks"


def _json(value):
    return json.loads(value) if isinstance(value, str) else value


def test_calls_and_limits_made_before_keep_their_amount_subject_and_limits(base_env, blank_database):
    before = revision_before(REVISION)
    flask_db(base_env, blank_database, "upgrade", before)
    engine = sa.create_engine(blank_database)
    with engine.begin() as connection:
        insert_row(connection, "tenants", id=1, slug="acme", name="Acme")
        insert_row(connection, "users", id=1, tenant_id=1, email="a@acme.test", roles=["agent"])
        insert_row(connection, "conversations", id=1, tenant_id=1, user_id=1, status="completed")
        insert_row(connection, "messages", id=1, conversation_id=1, seq=1, role="assistant", content=[])
        for id_, arguments, customer in (
            (1, {"invoice_id": 7, "amount_cents": 4200, "reason": "late"}, 4471),
            (2, {"customer_id": 8, "subject": "Hello", "body": "b"}, 8),
            (3, {"amount_cents": "12.00"}, None),  # not a whole number of cents: no amount
        ):
            insert_row(
                connection, "tool_calls", id=id_, conversation_id=1, tenant_id=1, message_id=1, position=id_,
                tool_use_id=f"toolu_{id_}", name="tool", input=arguments, status="succeeded", acting_user_id=1,
                customer_id=customer,
            )  # fmt: skip
        limits = {"conversation_count": 3, "customer_day_cents": 20000, "tenant_day_cents": None}
        insert_row(
            connection, "tool_policies", id=1, tenant_id=1, tool_name="issue_refund", mode="always", limits=limits
        )

    flask_db(base_env, blank_database, "upgrade", REVISION)
    with engine.connect() as connection:
        calls = connection.execute(text("SELECT id, money_cents, subject FROM tool_calls ORDER BY id")).all()
        stored = _json(connection.scalar(text("SELECT limits FROM tool_policies")))
    assert [tuple(row) for row in calls] == [(1, 4200, "customer:4471"), (2, None, "customer:8"), (3, None, None)]
    assert stored == {"conversation_count": 3, "subject_day_cents": 20000, "tenant_day_cents": None}

    flask_db(base_env, blank_database, "downgrade", before)
    with engine.connect() as connection:
        customers = connection.execute(text("SELECT id, customer_id FROM tool_calls ORDER BY id")).all()
        stored = _json(connection.scalar(text("SELECT limits FROM tool_policies")))
    assert [tuple(row) for row in customers] == [(1, 4471), (2, 8), (3, None)]
    assert stored["customer_day_cents"] == 20000 and "subject_day_cents" not in stored
    engine.dispose()
