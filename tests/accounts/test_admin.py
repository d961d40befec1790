"""The users admin page: tenant scope, the create form's errors, roles, disabling, password resets,
plain and htmx answers, and the audit events each change leaves."""

from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import func, select

from tests.clients import PASSWORD, Browser, sign_in, try_sign_in
from webapp import identity
from webapp.models import AuditEvent, Tenant, User
from webapp.runtime.extensions import db

ADMIN = "admin@acme.test"


def unique_email(tenant: str = "acme") -> str:
    return f"user-{uuid.uuid4().hex[:10]}@{tenant}.test"


@pytest.fixture
def admin(app) -> Browser:
    return sign_in(app, ADMIN)


@pytest.fixture
def make_user(app):
    """make_user(roles=["agent"], tenant="acme") -> a new user's (id, email); the demo accounts live
    for the whole test session, so tests change only users of their own."""

    def make(roles=("agent",), tenant: str = "acme") -> tuple[int, str]:
        email = unique_email(tenant)
        owner = db.session.scalar(select(Tenant).where(Tenant.slug == tenant))
        user = identity.create_user(db.session, email, PASSWORD, list(roles), owner, display_name="Test person")
        db.session.commit()
        user_id = user.id
        db.session.remove()
        return user_id, email

    return make


def user(read, user_id: int) -> User:
    return read(lambda s: s.get(User, user_id))


def user_id_of(read, email: str) -> int:
    return read(lambda s: s.scalar(select(User.id).where(User.email == email)))


def events(read, action: str, target_id: int | None = None) -> list[AuditEvent]:
    rows = read(lambda s: s.scalars(select(AuditEvent).where(AuditEvent.action == action)).all())
    return [row for row in rows if target_id is None or row.data.get("user_id") == target_id]


def assert_audited(read, action: str, target_id: int, email: str, **data) -> AuditEvent:
    (event,) = events(read, action, target_id)
    admin = read(lambda s: s.scalar(select(User).where(User.email == ADMIN)))
    assert event.tenant_id == admin.tenant_id and event.actor_id == admin.id
    assert event.data["email"] == email
    for key, value in data.items():
        assert event.data[key] == value
    return event


def counts(read) -> tuple[int, int]:
    return (
        read(lambda s: s.scalar(select(func.count(User.id)))),
        read(lambda s: s.scalar(select(func.count(AuditEvent.id)).where(AuditEvent.action == "user_created"))),
    )


def assert_row_fragment(response, user_id: int, status: int = 200) -> str:
    """The one updated row; a refused change answers 422, which base.html's htmx config swaps in."""
    body = response.text.strip()
    assert response.status_code == status
    assert body.startswith(f'<tr id="user-{user_id}"') and body.endswith("</tr>"), body[:200]
    assert body.count("<tr") == 1 and "<html" not in body
    return body


# --- who may use the page -------------------------------------------------------------------------


def test_the_list_shows_only_the_admins_tenant(app, admin, make_user, read):
    page = admin.get("/admin/users")
    assert page.status_code == 200
    for email in (ADMIN, "agent@acme.test", "reviewer@acme.test"):
        assert email in page.text
        assert f'id="user-{user_id_of(read, email)}"' in page.text
    assert "@globex.test" not in page.text

    _, globex_admin = make_user(["admin"], tenant="globex")
    page = sign_in(app, globex_admin).get("/admin/users")
    assert page.status_code == 200 and "agent@globex.test" in page.text and "@acme.test" not in page.text


@pytest.mark.parametrize("email", ["agent@acme.test", "reviewer@acme.test", "auditor@acme.test"])
def test_non_admins_get_403_and_change_nothing(app, make_user, read, email):
    target_id, _ = make_user()
    browser = sign_in(app, email)
    before = counts(read)
    assert browser.get("/admin/users").status_code == 403
    form = {"email": unique_email(), "password": "long-enough-1", "roles": ["agent"]}
    assert browser.post("/admin/users", form).status_code == 403
    for action in ("disable", "enable", "password", "roles"):
        data = {"password": "long-enough-1", "roles": ["admin"]}
        assert browser.post(f"/admin/users/{target_id}/{action}", data).status_code == 403
    assert counts(read) == before
    target = user(read, target_id)
    assert target.active and target.roles == ["agent"]


def test_signed_out_visitors_are_sent_to_sign_in(app):
    response = Browser(app).get("/admin/users")
    assert response.status_code == 302 and "/login" in response.headers["Location"]


def test_another_tenants_user_is_404_and_unchanged(admin, make_user, read):
    target_id, _ = make_user(tenant="globex")
    before = user(read, target_id)
    for action in ("disable", "enable", "password", "roles"):
        response = admin.post(f"/admin/users/{target_id}/{action}", {"password": "long-enough-1", "roles": ["admin"]})
        assert response.status_code == 404
    assert admin.post("/admin/users/999999/disable").status_code == 404
    after = user(read, target_id)
    assert (after.active, after.roles, after.session_token, after.password_hash) == (
        before.active,
        before.roles,
        before.session_token,
        before.password_hash,
    )
    assert all(
        not events(read, action, target_id)
        for action in ("user_disabled", "user_enabled", "user_password_reset", "user_roles_changed")
    )


def test_posts_without_the_csrf_token_are_refused(admin, read):
    before = counts(read)
    response = admin.post(
        "/admin/users", {"email": unique_email(), "password": "long-enough-1", "roles": ["agent"]}, csrf=False
    )
    assert response.status_code == 400
    assert counts(read) == before


# --- creating -------------------------------------------------------------------------------------


def test_an_admin_adds_a_user_who_can_then_sign_in(app, admin, read):
    email = unique_email()
    response = admin.post(
        "/admin/users",
        {
            "email": "  " + email.upper(),
            "display_name": " Dana Scully ",
            "roles": ["agent", "reviewer"],
            "password": "a-new-password",
        },
    )
    new_id = user_id_of(read, email)
    assert response.status_code == 303
    assert response.headers["Location"].endswith(f"/admin/users#user-{new_id}")
    assert email in admin.get("/admin/users").text  # the flash and the new row

    created = user(read, new_id)
    admin_tenant = read(lambda s: s.scalar(select(User.tenant_id).where(User.email == ADMIN)))
    assert (created.tenant_id, created.display_name, created.roles, created.active) == (
        admin_tenant,
        "Dana Scully",
        ["agent", "reviewer"],
        True,
    )
    event = assert_audited(read, "user_created", new_id, email, roles=["agent", "reviewer"])
    assert "a-new-password" not in json.dumps(event.data)
    assert sign_in(app, email, "a-new-password").get("/").status_code == 200


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"email": "x" * 250 + "@acme.test"}, "at most 254 characters"),
        ({"email": "not-an-email"}, "Enter an email address like name@example.com."),
        ({"email": ""}, "Enter an email address."),
        ({"email": "AGENT@acme.test"}, "A user with this email already exists."),
        # Another tenant's person (or an operator): words that do not tell the e-mail has an account elsewhere.
        ({"email": "agent@globex.test"}, "That e-mail cannot be used for a new account; choose another."),
        ({"email": "operator@desk.test"}, "That e-mail cannot be used for a new account; choose another."),
        ({"display_name": "n" * 201}, "at most 200 characters"),
        ({"roles": ["agent", "superuser"]}, "Unknown role superuser"),
        ({"roles": []}, "Choose at least one role."),
        ({"password": "short"}, "The password must be 8 to 200 characters."),
        ({"password": "p" * 201}, "The password must be 8 to 200 characters."),
        ({"password": ""}, "Enter a password."),
    ],
)
def test_bad_input_shows_a_form_error_and_writes_nothing(admin, read, change, error):
    before = counts(read)
    form = {"email": unique_email(), "display_name": "Someone", "roles": ["agent"], "password": "long-enough-1"}
    response = admin.post("/admin/users", {**form, **change})
    assert response.status_code == 422
    assert error in response.text and 'class="error"' in response.text
    if change.get("email", "").endswith(("@globex.test", "@desk.test")):
        assert "already exists" not in response.text and "globex" not in response.text.replace(change["email"], "")
    assert counts(read) == before


# --- changing a user --------------------------------------------------------------------------------


def test_roles_change_is_audited_with_before_and_after(admin, make_user, read):
    target_id, email = make_user(["agent"])
    response = admin.post(f"/admin/users/{target_id}/roles", {"roles": ["auditor", "reviewer"]})
    assert response.status_code == 303 and response.headers["Location"].endswith(f"#user-{target_id}")
    assert user(read, target_id).roles == ["reviewer", "auditor"]
    assert_audited(read, "user_roles_changed", target_id, email, before=["agent"], after=["reviewer", "auditor"])

    for roles, error in ((["agent", "root"], "root is not one of them"), ([], "Choose at least one role.")):
        response = admin.post(f"/admin/users/{target_id}/roles", {"roles": roles})
        assert response.status_code == 422 and error in response.text
    assert user(read, target_id).roles == ["reviewer", "auditor"]
    assert len(events(read, "user_roles_changed", target_id)) == 1


def test_disabling_ends_open_sessions_and_api_tokens_at_once(app, admin, make_user, read):
    target_id, email = make_user(["agent"])
    theirs = sign_in(app, email)
    assert theirs.get("/").status_code == 200
    token = identity.create_token(db.session, db.session.get(User, target_id))
    db.session.commit()
    db.session.remove()
    api = Browser(app)
    bearer = {"Authorization": f"Bearer {token}"}
    assert api.get("/api/conversations/1", headers=bearer).status_code != 401

    response = admin.post(f"/admin/users/{target_id}/disable")
    assert response.status_code == 303
    assert "is disabled" in admin.get("/admin/users").text
    assert not user(read, target_id).active

    response = theirs.get("/")
    assert response.status_code == 302 and "/login" in response.headers["Location"]
    assert api.get("/api/conversations/1", headers=bearer).status_code == 401
    assert try_sign_in(app, email)[1].status_code == 401
    assert_audited(read, "user_disabled", target_id, email)

    assert admin.post(f"/admin/users/{target_id}/enable").status_code == 303
    assert user(read, target_id).active
    assert sign_in(app, email).get("/").status_code == 200
    assert_audited(read, "user_enabled", target_id, email)


def test_a_password_reset_ends_sessions_and_the_new_password_works(app, admin, make_user, read):
    target_id, email = make_user(["reviewer"])
    theirs = sign_in(app, email)

    response = admin.post(f"/admin/users/{target_id}/password", {"password": "short"})
    assert response.status_code == 422 and "at least 8 characters" in response.text
    assert theirs.get("/").status_code == 200  # a refused reset changes nothing

    response = admin.post(f"/admin/users/{target_id}/password", {"password": "fresh-password-9"})
    assert response.status_code == 303
    response = theirs.get("/")
    assert response.status_code == 302 and "/login" in response.headers["Location"]
    assert try_sign_in(app, email, PASSWORD)[1].status_code == 401
    assert sign_in(app, email, "fresh-password-9").get("/").status_code == 200
    event = assert_audited(read, "user_password_reset", target_id, email)
    assert "fresh-password-9" not in json.dumps(event.data) and "password" not in event.data


def test_an_admin_resetting_their_own_password_stays_signed_in_here_only(app, make_user, read):
    admin_id, email = make_user(["admin"])
    here, elsewhere = sign_in(app, email), sign_in(app, email)
    assert here.post(f"/admin/users/{admin_id}/password", {"password": "fresh-password-9"}).status_code == 303
    assert here.get("/admin/users").status_code == 200
    assert elsewhere.get("/").status_code == 302


def test_an_admin_cannot_disable_themself_or_drop_their_admin_role(admin, read):
    admin_id = user_id_of(read, ADMIN)
    before = user(read, admin_id)
    response = admin.post(f"/admin/users/{admin_id}/disable")
    assert response.status_code == 422 and "cannot disable your own account" in response.text
    response = admin.post(f"/admin/users/{admin_id}/roles", {"roles": ["agent"]})
    assert response.status_code == 422 and "cannot remove your own admin role" in response.text
    response = admin.post(f"/admin/users/{admin_id}/disable", htmx=True)
    assert "cannot disable your own account" in assert_row_fragment(response, admin_id, status=422)

    after = user(read, admin_id)
    assert (after.active, after.roles, after.session_token) == (True, before.roles, before.session_token)
    assert admin.get("/admin/users").status_code == 200
    assert not events(read, "user_disabled", admin_id) and not events(read, "user_roles_changed", admin_id)


# --- htmx -------------------------------------------------------------------------------------------


def test_htmx_requests_get_the_updated_row_and_plain_posts_a_redirect(admin, make_user, read):
    target_id, email = make_user(["agent"])
    url = f"/admin/users/{target_id}"

    body = assert_row_fragment(admin.post(f"{url}/roles", {"roles": ["agent", "auditor"]}, htmx=True), target_id)
    assert 'value="auditor" checked' in body and "now has the roles agent, auditor" in body
    body = assert_row_fragment(admin.post(f"{url}/disable", htmx=True), target_id)
    assert "Disabled" in body and f"{url}/enable" in body
    body = assert_row_fragment(admin.post(f"{url}/enable", htmx=True), target_id)
    assert "Active" in body and f"{url}/disable" in body
    body = assert_row_fragment(admin.post(f"{url}/password", {"password": "fresh-password-9"}, htmx=True), target_id)
    assert "has a new password" in body
    body = assert_row_fragment(admin.post(f"{url}/roles", {"roles": []}, htmx=True), target_id, status=422)
    assert 'class="error"' in body and "Choose at least one role." in body

    # htmx sends the CSRF token as the X-CSRFToken header (base.html's hx-headers), not a form field.
    response = admin.client.post(f"{url}/disable", headers={"HX-Request": "true", "X-CSRFToken": admin.csrf_token()})
    db.session.remove()
    assert_row_fragment(response, target_id)

    response = admin.post(f"{url}/enable")
    assert response.status_code == 303 and response.headers["Location"].endswith(f"/admin/users#user-{target_id}")
    assert [
        len(events(read, action, target_id))
        for action in ("user_roles_changed", "user_disabled", "user_enabled", "user_password_reset")
    ] == [1, 2, 2, 1]
