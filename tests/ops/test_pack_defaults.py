"""A pack reloaded with new defaults asks the gate (issue 42): a release whose default policy for a tool
is looser than the one in force is held (the tenants that set no policy keep the stricter one) until an
operator accepts it; a stricter one is in force at once. Three releases of one tool
(tests/packs/payouts.py), each loaded as a deploy would load it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import select

from jobs import moves as move_jobs
from tests.conftest import BILLING, desk_app, pushed
from webapp.agent.policies import policy_for
from webapp.models import AuditEvent, Tenant
from webapp.runtime.extensions import db
from webapp.runtime.services import services


@contextmanager
def release(env: dict, number: int) -> Iterator:
    with pushed(desk_app({**env, "EXTRA_TOOLS": f"{BILLING},tests.packs.payouts:Release{number}"})) as app:
        yield app


def in_force():
    """The payout policy acme has (it set none: the default in force)."""
    tenant_id = db.session.scalar(select(Tenant.id).where(Tenant.slug == "acme"))
    policy = policy_for(db.session, tenant_id, services().tools_for(db.session, tenant_id).get("payout"))
    db.session.remove()
    return policy


def command(app, *args: str) -> str:
    result = app.test_cli_runner().invoke(args=["policy-defaults", *args])
    db.session.remove()
    assert result.exit_code == 0, result.output
    return result.output


def held_events() -> list[AuditEvent]:
    events = list(db.session.scalars(select(AuditEvent).where(AuditEvent.action == "tool_default_held")))
    db.session.remove()
    return events


def test_a_release_whose_default_is_looser_is_held_until_the_operator_accepts_it(env, clean):
    with release(env, 1) as app:
        assert "payout: Every payout call needs one approval" in command(app, "list")  # recorded as in force

    with release(env, 2) as app:  # the new release lets payouts up to $500 run at once
        assert in_force().mode == "always"  # held: the recorded default stays in force
        said = command(app, "list")
        assert "payout: Every payout call needs one approval within 24 hours. HELD: this release says:" in said
        assert "The rule goes from “always waits” to “waits above an amount”." in said
        move_jobs.sweep()  # the sweep records it too, and the hold is audited once
        (event,) = held_events()
        assert event.tenant_id is None and event.data["release"]["mode"] == "above_amount"

    with release(env, 3) as app:  # stricter than what is in force: at once, and recorded
        assert in_force().approvals_required == 2
        assert "HELD" not in command(app, "list")

    with release(env, 2) as app:  # looser than release 3's: held again, until accepted
        assert (in_force().mode, in_force().approvals_required) == ("always", 2)
        accepted = command(app, "accept", "payout")
        assert "this release's default is in force" in accepted and "Approvals needed go from 2 to 1" in accepted
        assert (in_force().mode, in_force().amount_threshold_cents) == ("above_amount", 50_000)
        refused = app.test_cli_runner().invoke(args=["policy-defaults", "accept", "payout"])
        assert refused.exit_code == 2 and "nothing to accept" in refused.output
        accepted_events = db.session.scalars(select(AuditEvent.action).where(AuditEvent.tool_name == "payout")).all()
        assert accepted_events[-1] == "tool_default_accepted"
