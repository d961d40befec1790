"""One admin cannot get past four eyes alone (issue 42, finding 4): the admin who asked for a loosening
made a second admin account (or reset another admin's password), signed in as it and approved their
own change. Now the admin role an admin gives (a person's roles, a new account asked with it, or given
back after its password was reset) waits for a second admin whose account the asker did not make or
re-key, or for the operator; and such an admin never decides the asker's changes."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from html import unescape

from sqlalchemy import select

from tests.clients import PASSWORD, sign_in
from webapp.accounts import four_eyes
from webapp.identity import create_user, get_or_create_tenant
from webapp.models import AuditEvent, RoleChange, User, UserKeying
from webapp.runtime.extensions import db

OPERATOR = "operator@desk.test"


def people(*roles: tuple[str, ...]) -> tuple[str, list[str]]:
    """A tenant of its own whose people the operator made (no one keyed anyone): its slug and the
    people's e-mails, in the order of `roles`."""
    tenant = get_or_create_tenant(db.session, f"eyes-{uuid.uuid4().hex[:8]}")
    emails = [
        create_user(db.session, f"p{n}-{tenant.slug}@eyes.test", PASSWORD, list(held), tenant).email
        for n, held in enumerate(roles)
    ]
    db.session.commit()
    db.session.remove()
    return tenant.slug, emails


def person(email: str) -> User:
    db.session.remove()
    return db.session.scalar(select(User).where(User.email == email))


@dataclass(frozen=True)
class Waiting:
    id: int
    why: str
    requested_by: str
    status: str


def pending_change(email: str) -> Waiting | None:
    """The admin role change waiting for the person, as it is stored now."""
    db.session.remove()
    change = db.session.scalar(
        select(RoleChange)
        .join(User, User.id == RoleChange.user_id)
        .where(User.email == email, RoleChange.status == "pending")
    )
    said = change and Waiting(change.id, change.why, change.requested_by.email, change.status)
    db.session.remove()
    return said


def chain(slug: str) -> list[tuple[str, dict]]:
    """The tenant's audit events of people and roles, in order: (action, data)."""
    db.session.remove()
    tenant_id = get_or_create_tenant(db.session, slug).id
    rows = db.session.scalars(
        select(AuditEvent)
        .where(AuditEvent.tenant_id == tenant_id, AuditEvent.action.not_in(("sign_in", "sign_out")))
        .order_by(AuditEvent.id)
    ).all()
    db.session.remove()
    return [(row.action, row.data) for row in rows]


def decide(browser, change_id: int, decision: str, reason: str = ""):
    return browser.post(f"/admin/users/role-changes/{change_id}", {"decision": decision, "reason": reason})


def test_an_admin_made_by_the_asker_cannot_approve_the_askers_changes(app):
    slug, (asker, second, agent) = people(("admin",), ("admin",), ("agent",))
    first = sign_in(app, asker)
    made = f"made-{slug}@eyes.test"
    created = first.post("/admin/users", {"email": made, "roles": ["agent", "admin"], "password": PASSWORD})
    change = pending_change(made)
    assert created.status_code == 303 and created.headers["Location"].endswith(f"#role-change-{change.id}")
    assert person(made).roles == ["agent"]  # made without the admin role: it waits
    assert (change.why, change.requested_by) == ("created", asker)
    page = unescape(first.get("/admin/users").text)
    assert "the admin role waits for a second admin (four eyes)" in page
    assert "Waiting for a second admin" in page and f"{asker} made their account and asked for the admin role." in page
    assert "You asked for it: another admin decides." in page
    assert decide(first, change.id, "approve").status_code == 403
    assert sign_in(app, made).get("/admin/users").status_code == 403  # not an admin until approved

    other = sign_in(app, second)
    assert decide(other, change.id, "approve").status_code == 303
    assert person(made).roles == ["agent", "admin"]

    # The finding: the asker asks for another admin; the admin they made cannot approve it.
    agent_id = person(agent).id
    asked = first.post(f"/admin/users/{agent_id}/roles", {"roles": ["agent", "admin"]}, htmx=True)
    assert asked.status_code == 200 and asked.headers["HX-Redirect"].endswith(
        f"#role-change-{pending_change(agent).id}"
    )
    assert person(agent).roles == ["agent"]
    puppet = sign_in(app, made)
    page = unescape(puppet.get("/admin/users").text)
    said = f"{asker} made or re-keyed your account, so one person may hold both"
    assert said in page and f'action="/admin/users/role-changes/{pending_change(agent).id}"' not in page
    refused = decide(puppet, pending_change(agent).id, "approve")
    assert refused.status_code == 403 and said in unescape(refused.text)
    assert person(agent).roles == ["agent"]
    assert [user.email for user in four_eyes.deciders(db.session, person(asker).tenant_id, person(asker).id)] == [
        second
    ]
    assert decide(other, pending_change(agent).id, "approve").status_code == 303
    assert person(agent).roles == ["agent", "admin"]

    events = chain(slug)
    assert [action for action, _ in events] == [
        "user_created",
        "role_change_requested",
        "role_change_decided",
        "user_roles_changed",
        "role_change_requested",
        "role_change_decided",
        "user_roles_changed",
    ]
    assert events[0][1]["roles"] == ["agent"] and events[0][1]["held"] == ["admin"]
    assert (events[1][1]["why"], events[1][1]["before"], events[1][1]["after"]) == (
        "created",
        ["agent"],
        ["agent", "admin"],
    )
    assert (events[2][1]["decision"], events[2][1]["requested_by"]) == ("approved", asker)
    granted = events[3][1]
    assert (granted["before"], granted["after"]) == (["agent"], ["agent", "admin"])
    assert (granted["requested_by"], granted["approved_by"]) == (asker, second)
    db.session.remove()
    kinds = db.session.scalars(select(UserKeying.kind).where(UserKeying.user_id == person(made).id)).all()
    assert sorted(kinds) == ["created", "role_granted"]


def test_an_admin_whose_password_the_asker_reset_loses_the_role_and_never_decides_the_askers_changes(app):
    slug, (asker, rekeyed, third, agent) = people(("admin",), ("admin",), ("admin",), ("reviewer",))
    first = sign_in(app, asker)
    rekeyed_id = person(rekeyed).id
    reset = first.post(f"/admin/users/{rekeyed_id}/password", {"password": "the-askers-own-1"})
    assert reset.status_code == 303
    assert "their admin role is taken away until a second admin gives it back" in unescape(
        first.get("/admin/users").text
    )
    assert person(rekeyed).roles == []  # at once: a tightening
    change = pending_change(rekeyed)
    assert (change.why, change.requested_by) == ("password_reset", asker)
    stripped = sign_in(app, rekeyed, "the-askers-own-1")
    assert stripped.get("/admin/users").status_code == 403
    home = stripped.get("/")  # no role for now: their home page says so, and they may sign out
    assert home.status_code == 200 and "hold no role for now" in home.text
    assert stripped.post("/logout").status_code in (302, 303)

    assert decide(sign_in(app, third), change.id, "approve").status_code == 303
    assert person(rekeyed).roles == ["admin"]
    asked = first.post(f"/admin/users/{person(agent).id}/roles", {"roles": ["reviewer", "admin"]})
    assert asked.status_code == 303
    back = sign_in(app, rekeyed, "the-askers-own-1")
    refused = decide(back, pending_change(agent).id, "approve")
    assert refused.status_code == 403 and f"{asker} made or re-keyed your account" in unescape(refused.text)
    # nor the other way round: the asker holds the re-keyed admin's password
    theirs = first.post(f"/admin/users/{person(third).id}/roles", {"roles": ["agent"]})  # a tightening: at once
    assert theirs.status_code == 303 and person(third).roles == ["agent"]
    again = back.post(f"/admin/users/{person(third).id}/roles", {"roles": ["admin", "agent"]})
    assert again.status_code == 303
    refused = decide(first, pending_change(third).id, "approve")
    assert refused.status_code == 403 and f"You made or re-keyed {rekeyed}'s account" in unescape(refused.text)
    assert person(agent).roles == ["reviewer"] and person(third).roles == ["agent"]

    events = chain(slug)
    assert [action for action, _ in events][:5] == [
        "user_password_reset",
        "user_roles_changed",
        "role_change_requested",
        "role_change_decided",
        "user_roles_changed",
    ]
    taken = events[1][1]
    assert (taken["before"], taken["after"], taken["why"]) == (["admin"], [], "password_reset")
    assert (events[4][1]["requested_by"], events[4][1]["approved_by"]) == (asker, third)


def test_with_one_admin_the_operator_decides_on_the_page_and_the_command_line(app, cli):
    slug, (solo, agent) = people(("admin",), ("agent",))
    admin = sign_in(app, solo)
    agent_id = person(agent).id
    assert admin.post(f"/admin/users/{agent_id}/roles", {"roles": ["agent", "admin"]}).status_code == 303
    change_id = pending_change(agent).id
    page = unescape(admin.get("/admin/users").text)
    assert "Only the desk's operator can decide this: your organisation has no other admin" in page

    operator = sign_in(app, OPERATOR)
    page = unescape(operator.get("/ops/policy-changes").text)
    assert f'id="role-change-{change_id}"' in page and "you are the second pair of eyes" in page
    assert f"{solo} asked to give them the admin role." in page
    unreasoned = operator.post(f"/ops/policy-changes/roles/{change_id}", {"decision": "reject"})
    assert unreasoned.status_code == 422 and "Say why you reject the change" in unescape(unreasoned.text)
    assert operator.post(f"/ops/policy-changes/roles/{change_id}", {"decision": "approve"}).status_code == 303
    assert person(agent).roles == ["agent", "admin"]
    assert "No admin role waits for a decision." in operator.get("/ops/policy-changes").text
    assert sign_in(app, solo).get("/ops/policy-changes").status_code == 403

    # The agent is an admin now, but one the solo admin made an admin: still only the operator decides.
    assert admin.post(f"/admin/users/{agent_id}/password", {"password": "solo-knows-it-1"}).status_code == 303
    change_id = pending_change(agent).id
    listed = cli("role-change", "list", "--tenant", slug)
    assert f"#{change_id} {slug} admin for {agent}: pending; asked by {solo}" in listed.output
    assert "may decide: only the operator" in listed.output and "reset their password" in listed.output
    assert cli("role-change", "reject", str(change_id)).exit_code != 0  # a rejection needs --reason
    approved = cli("role-change", "approve", str(change_id))
    assert approved.exit_code == 0 and f"Approved #{change_id}: {agent} has the roles agent, admin." in approved.output
    assert "already approved by command line" in cli("role-change", "approve", str(change_id)).output

    events = chain(slug)
    approvals = [data for action, data in events if action == "user_roles_changed" and "approved_by" in data]
    assert [data["approved_by"] for data in approvals] == [OPERATOR, "command line"]
    decided = [data["decision"] for action, data in events if action == "role_change_decided"]
    assert decided == ["approved", "approved"]


def test_the_asker_withdraws_another_admin_rejects_and_an_admin_only_account_holds_no_role_meanwhile(app):
    slug, (asker, second) = people(("admin",), ("admin",))
    first, other = sign_in(app, asker), sign_in(app, second)
    only_admin = f"only-{slug}@eyes.test"
    assert (
        first.post("/admin/users", {"email": only_admin, "roles": ["admin"], "password": PASSWORD}).status_code == 303
    )
    assert person(only_admin).roles == []
    change_id = pending_change(only_admin).id
    assert other.post(f"/admin/users/role-changes/{change_id}/withdraw").status_code == 403  # only the asker
    assert decide(other, change_id, "reject", "  ").status_code == 422
    assert decide(other, change_id, "maybe", "x").status_code == 422
    assert decide(other, change_id, "approve", "ok").status_code == 303
    assert person(only_admin).roles == ["admin"]
    assert decide(other, change_id, "reject", "late").status_code == 409

    target = person(only_admin).id
    assert first.post(f"/admin/users/{target}/roles", {"roles": ["auditor"]}).status_code == 303  # at once
    assert first.post(f"/admin/users/{target}/roles", {"roles": ["auditor", "admin"]}).status_code == 303
    twice = first.post(f"/admin/users/{target}/roles", {"roles": ["auditor", "admin"]})
    assert twice.status_code == 303 and "already waits for a second admin" in unescape(first.get("/admin/users").text)
    change_id = pending_change(only_admin).id
    assert decide(other, change_id, "reject", "not this one").status_code == 303
    assert person(only_admin).roles == ["auditor"]
    assert first.post(f"/admin/users/{target}/roles", {"roles": ["auditor", "admin"]}).status_code == 303
    change_id = pending_change(only_admin).id
    assert first.post(f"/admin/users/role-changes/{change_id}/withdraw").status_code == 303
    assert pending_change(only_admin) is None and person(only_admin).roles == ["auditor"]
    assert other.post("/admin/users/role-changes/999999", {"decision": "approve"}).status_code == 404

    decided = [(data["decision"], data["reason"]) for action, data in chain(slug) if action == "role_change_decided"]
    assert decided == [("approved", "ok"), ("rejected", "not this one"), ("withdrawn", None)]


def test_another_tenants_admin_cannot_see_or_decide_a_role_change(app):
    slug, (asker, agent) = people(("admin",), ("agent",))
    assert sign_in(app, asker).post(f"/admin/users/{person(agent).id}/roles", {"roles": ["admin"]}).status_code == 303
    change_id = pending_change(agent).id
    stranger = sign_in(app, "admin@acme.test")
    assert f"role-change-{change_id}" not in stranger.get("/admin/users").text
    assert decide(stranger, change_id, "approve").status_code == 404
    assert stranger.post(f"/admin/users/role-changes/{change_id}/withdraw").status_code == 404
    assert person(agent).roles == [] and pending_change(agent).status == "pending"


def test_an_admin_made_by_the_asker_cannot_approve_the_askers_policy_change(app, api):
    slug, (asker, second) = people(("admin",), ("admin",))
    made = f"made-{slug}@eyes.test"
    assert (
        sign_in(app, asker).post("/admin/users", {"email": made, "roles": ["admin"], "password": PASSWORD}).status_code
        == 303
    )
    assert decide(sign_in(app, second), pending_change(made).id, "approve").status_code == 303
    asked = api.as_(asker).put("/api/policies/delete_account", json={"mode": "always", "approvals": 1})
    assert asked.status_code == 202, asked.json
    refused = api.as_(made).post(f"/api/policy-changes/{asked.json['change']['id']}", json={"decision": "approve"})
    said = four_eyes.why_not_decide(db.session, person(made), person(asker).id)
    assert said and re.match(rf"{re.escape(asker)} made or re-keyed your account", said)
    assert refused.status_code == 403 and said in refused.json["message"]
    page = unescape(sign_in(app, made).get("/admin/policies").text)  # told why, and offered no Approve
    change = page[page.index(f'id="change-{asked.json["change"]["id"]}"') :].split("</article>")[0]
    assert said in change and 'value="approve"' not in change and 'value="reject"' in change
    assert 'value="approve"' in unescape(sign_in(app, second).get("/admin/policies").text)


def test_the_admin_role_is_not_given_to_a_person_disabled_since_it_was_asked(app):
    slug, (asker, second) = people(("admin",), ("admin",))
    made = f"disabled-{slug}@eyes.test"
    first = sign_in(app, asker)
    assert first.post("/admin/users", {"email": made, "roles": ["admin"], "password": PASSWORD}).status_code == 303
    change = pending_change(made)
    assert first.post(f"/admin/users/{person(made).id}/disable").status_code in (200, 303)
    refused = decide(sign_in(app, second), change.id, "approve")
    assert refused.status_code == 409 and "was disabled since this was asked" in unescape(refused.text)
    assert person(made).roles == [] and pending_change(made) is not None


def test_when_every_other_admin_was_made_by_the_asker_the_policies_page_says_only_the_operator_decides(app, api, cli):
    slug, (asker,) = people(("admin",))
    made = f"only-{slug}@eyes.test"
    assert sign_in(app, asker).post("/admin/users", {"email": made, "roles": ["admin"], "password": PASSWORD})
    assert cli("role-change", "approve", str(pending_change(made).id)).exit_code == 0  # the operator decides
    asked = api.as_(asker).put("/api/policies/delete_account", json={"mode": "always", "approvals": 1})
    assert asked.status_code == 202, asked.json
    page = " ".join(unescape(sign_in(app, asker).get("/admin/policies").text).split())
    assert "Only the desk's operator can decide this" in page
