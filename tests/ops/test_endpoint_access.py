"""Which tenants may use a model endpoint (issue 25, finding 8): an operator allows an endpoint for
tenants (`flask endpoint add --tenant`, `endpoint allow|disallow`, `tenant set-model`, the endpoint's
page), a tenant's admin chooses only among those (anything else refused, unchanged and audited), a
withdrawn endpoint serves no more, and an endpoint's key comes only from a MODEL_KEY_ variable: one
stored before naming any other variable is never read from it. Also the migration that allows each
endpoint for the tenants using it."""

from __future__ import annotations

from html import unescape

import pytest
import sqlalchemy as sa
from sqlalchemy import func, select, text

from tests.clients import sign_in
from tests.integration.test_workers import start, wait_status
from tests.migrations import flask_db, revision_before
from tests.model_server import ModelServer
from webapp.llm import endpoints, keys
from webapp.llm.choice import choice_for
from webapp.llm.client import ModelError
from webapp.models import EndpointGrant, ModelEndpoint, Tenant

ADMIN, OPERATOR = "admin@acme.test", "operator@desk.test"
REVISION = "0019_endpoint_tenants"


@pytest.fixture
def env(env) -> dict[str, str]:
    """The private addresses these endpoints are registered at: OUTBOUND_ALLOW names them (the guard has
    its own tests, tests/llm/test_endpoint_addresses.py; here local model servers start mid-test)."""
    return {**env, "OUTBOUND_ALLOW": "10.0.0.9:8080,127.0.0.1:*"}


def add(cli, name: str, *tenants: str, base_url: str = "http://10.0.0.9:8080", key: str = "sk-operators-key"):
    flags = [arg for slug in tenants for arg in ("--tenant", slug)]
    added = cli("endpoint", "add", name, "--base-url", base_url, "--model", f"{name}-model", "--api-key", key, *flags)
    assert added.exit_code == 0, added.output
    return added


def models_of(read, slug: str) -> tuple:
    """The names of the tenant's endpoint and small endpoint as its row holds them (None: none)."""
    rows = read(lambda s: dict(s.execute(select(ModelEndpoint.id, ModelEndpoint.name)).all()))
    tenant = read(lambda s: s.scalar(select(Tenant).where(Tenant.slug == slug)))
    return rows.get(tenant.endpoint_id), rows.get(tenant.small_endpoint_id)


def may_use(read, name: str) -> list[str]:
    query = (
        select(Tenant.slug)
        .join(EndpointGrant, EndpointGrant.tenant_id == Tenant.id)
        .join(ModelEndpoint, ModelEndpoint.id == EndpointGrant.endpoint_id)
        .where(ModelEndpoint.name == name)
        .order_by(Tenant.slug)
    )
    return read(lambda s: list(s.scalars(query)))


# --- a tenant's admin chooses among the endpoints their tenant may use ----------------------------


@pytest.mark.parametrize(
    "form",
    [
        {"endpoint": "globex-only", "small_endpoint": ""},
        {"endpoint": "default", "small_endpoint": "globex-only"},
        {"endpoint": "no-such-endpoint", "small_endpoint": ""},  # told the same: no hint of what exists
    ],
)
def test_an_admin_cannot_choose_an_endpoint_allowed_only_for_another_tenant(app, cli, read, events, form):
    add(cli, "globex-only", "globex", key="sk-globex-secret")
    admin = sign_in(app, ADMIN)

    page = admin.get("/admin/assistant").text
    assert "globex-only" not in page and "No endpoint is allowed for Acme Corp yet" in page

    forged = admin.post("/admin/assistant/model", form)
    assert forged.status_code == 403
    named = form["endpoint"] if form["endpoint"] != "default" else form["small_endpoint"]
    says = f"Acme Corp may not use an endpoint named '{named}': choose one from the list, or ask an operator"
    assert says in unescape(forged.text)
    assert "10.0.0.9" not in forged.text and "sk-globex-secret" not in forged.text
    assert models_of(read, "acme") == (None, None)
    assert events("tenant_model_set") == []
    (refused,) = events("tenant_model_refused")
    acme = read(lambda s: s.scalar(select(Tenant.id).where(Tenant.slug == "acme")))
    assert (refused.tenant_id, refused.actor_label, refused.outcome) == (acme, ADMIN, "refused")
    assert refused.data["endpoint"] == form["endpoint"] and "may not use" in refused.data["refused"]


def test_once_an_operator_allows_it_the_admin_sees_and_chooses_it(app, cli, read, events):
    add(cli, "globex-only", "globex")
    add(cli, "mini", "acme")
    admin = sign_in(app, ADMIN)
    assert admin.post("/admin/assistant/model", {"endpoint": "globex-only", "small_endpoint": ""}).status_code == 403

    allowed = cli("endpoint", "allow", "globex-only", "--tenant", "acme")
    assert allowed.exit_code == 0 and allowed.output == "acme may now use globex-only.\n"
    page = admin.get("/admin/assistant").text
    assert "globex-only: globex-only-model" in page and "mini: mini-model" in page
    chosen = admin.post("/admin/assistant/model", {"endpoint": "globex-only", "small_endpoint": "mini"})
    assert chosen.status_code == 303
    assert models_of(read, "acme") == ("globex-only", "mini")
    (granted,) = events("endpoint_access_changed")
    assert granted.tenant_id is None and granted.actor_label == "command line"
    assert granted.data["allowed"] == ["acme"] and granted.data["may_use_now"] == ["acme", "globex"]


# --- operators: the command line -----------------------------------------------------------------


def test_an_operator_allows_and_withdraws_an_endpoint_from_the_command_line(cli, read, events):
    add(cli, "big", "acme", "globex")
    add(cli, "mini", "globex")
    assert "may be used by acme, globex; serves no tenant" in cli("endpoint", "list").output

    again = cli("endpoint", "allow", "big", "--tenant", "acme")
    assert again.exit_code == 0 and again.output == "Nothing changed.\nacme could use big already.\n"
    assert events("endpoint_access_changed") == []  # (nothing happened, so nothing is audited)

    # The operator's own choice of a model allows the endpoint for the tenant, and says so.
    routed = cli("tenant", "set-model", "acme", "--endpoint", "big", "--small-endpoint", "mini")
    assert routed.exit_code == 0, routed.output
    assert "acme may now use mini: it was not allowed for it before." in routed.output
    assert may_use(read, "mini") == ["acme", "globex"] and models_of(read, "acme") == ("big", "mini")
    assert events("endpoint_access_changed")[-1].data["allowed"] == ["acme"]

    # Withdrawing an endpoint a tenant uses puts it back on the default model, said and audited.
    withdrawn = cli("endpoint", "disallow", "big", "--tenant", "acme", "--tenant", "globex")
    assert withdrawn.exit_code == 0, withdrawn.output
    assert withdrawn.output.splitlines() == [
        "acme and globex may no longer use big.",
        "acme was served by big: it is now served by the default model (claude-sonnet-5).",
    ]
    assert models_of(read, "acme") == (None, "mini") and may_use(read, "big") == []
    lost = cli("endpoint", "disallow", "mini", "--tenant", "acme")
    assert "acme routed simple questions to mini: it no longer routes by difficulty." in lost.output
    assert models_of(read, "acme") == (None, None)

    access = [e.data for e in events("endpoint_access_changed")]
    assert access[-2]["disallowed"] == ["acme", "globex"] and access[-2]["moved_to_default"] == ["acme"]
    assert access[-1]["lost_routing"] == ["acme"] and access[-1]["may_use_now"] == ["globex"]
    acme_id = read(lambda s: s.scalar(select(Tenant.id).where(Tenant.slug == "acme")))
    on_acme = [e for e in events("tenant_model_set") if e.tenant_id == acme_id]  # the tenant's auditors see why
    assert on_acme[-2].data == {
        "endpoint": "default",
        "small_endpoint": "mini",
        "because": "an operator withdrew endpoint big from acme",
    }
    assert on_acme[-1].data["small_endpoint"] is None


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["endpoint", "allow", "big", "--tenant", "nowhere"], "There is no tenant 'nowhere'; check the slug."),
        (["endpoint", "allow", "big", "--tenant", "~operations"], "There is no tenant '~operations' to serve"),
        (["endpoint", "disallow", "big", "--tenant", "acme", "--tenant", "nowhere"], "There is no tenant 'nowhere'"),
        (["endpoint", "allow", "big"], "Name a tenant with --tenant SLUG"),
        (["endpoint", "disallow", "nope", "--tenant", "acme"], "There is no endpoint 'nope' (registered: big)."),
        (
            ["endpoint", "add", "other", "--base-url", "http://h:1", "--model", "m", "--tenant", "nowhere"],
            "There is no tenant 'nowhere'",
        ),
    ],
)
def test_a_tenant_or_endpoint_that_cannot_be_named_is_refused_in_words_and_nothing_changes(
    cli, read, events, args, says
):
    add(cli, "big", "acme")
    refused = cli(*args)
    assert refused.exit_code == 2 and says in refused.output
    assert may_use(read, "big") == ["acme"]
    assert read(lambda s: s.scalar(select(func.count()).select_from(ModelEndpoint))) == 1
    assert events("endpoint_access_changed") == []


# --- operators: the endpoint's page --------------------------------------------------------------

GOOD = {"name": "local-qwen", "base_url": "http://127.0.0.1:11434", "model": "qwen3:8b", "protocol": "tools"}


def test_the_endpoints_page_shows_and_ticks_who_may_use_an_endpoint(app, cli, read, events):
    operator = sign_in(app, OPERATOR)
    assert operator.post("/ops/endpoints", {**GOOD, "tenant": ["acme"]}).status_code == 303
    listing = operator.get("/ops/endpoints").text
    assert "acme may use local-qwen." in listing and "<td>acme</td>" in listing
    assert cli("tenant", "set-model", "acme", "--endpoint", "local-qwen").exit_code == 0

    page = operator.get("/ops/endpoints/local-qwen").text
    assert 'value="acme" checked' in page and 'value="globex" >' in page and "served by it" in page
    assert "~operations" not in page

    ticked = operator.post("/ops/endpoints/local-qwen/tenants", {"listed": ["acme", "globex"], "tenant": ["globex"]})
    assert ticked.status_code == 303
    said = unescape(operator.get(ticked.location).text)
    assert "globex may now use local-qwen. acme may no longer use local-qwen." in said
    assert "acme was served by local-qwen: it is now served by the default model" in said
    assert may_use(read, "local-qwen") == ["globex"] and models_of(read, "acme") == (None, None)
    (event,) = events("endpoint_access_changed")
    assert event.actor_label == OPERATOR and event.data["moved_to_default"] == ["acme"]

    # A tenant the form did not list is left as it is (allowed meanwhile from the command line).
    cli("endpoint", "allow", "local-qwen", "--tenant", "acme")
    operator.post("/ops/endpoints/local-qwen/tenants", {"listed": ["globex"], "tenant": []})
    assert may_use(read, "local-qwen") == ["acme"]


@pytest.mark.parametrize(
    ("form", "says"),
    [
        ({"listed": ["acme", "nowhere"], "tenant": ["nowhere"]}, "There is no tenant 'nowhere'; check the slug."),
        ({"listed": ["~operations"], "tenant": ["~operations"]}, "There is no tenant '~operations' to serve"),
        ({"listed": ["globex"], "tenant": ["acme"]}, "This form has no tenant acme; reload the page."),
        ({"listed": ["acme"], "tenant": [], "colour": "blue"}, "This form has no field colour; reload the page."),
    ],
)
def test_a_forged_or_stale_tenants_form_is_refused_in_words_and_nothing_changes(app, read, events, form, says):
    operator = sign_in(app, OPERATOR)
    operator.post("/ops/endpoints", {**GOOD, "tenant": ["acme"]})
    refused = operator.post("/ops/endpoints/local-qwen/tenants", form)
    assert refused.status_code == 422 and says in unescape(refused.text)
    assert may_use(read, "local-qwen") == ["acme"] and events("endpoint_access_changed") == []


def test_registering_for_a_tenant_that_does_not_exist_stores_nothing(app, read):
    operator = sign_in(app, OPERATOR)
    refused = operator.post("/ops/endpoints", {**GOOD, "tenant": ["acme", "nowhere"]})
    assert refused.status_code == 422 and "There is no tenant &#39;nowhere&#39;" in refused.text
    assert 'aria-describedby="tenant-error"' in refused.text and 'value="acme" checked' in refused.text
    assert read(lambda s: s.scalar(select(func.count()).select_from(ModelEndpoint))) == 0


def test_tenant_people_may_not_change_who_may_use_an_endpoint(app, cli, read):
    add(cli, "big", "globex")
    admin = sign_in(app, ADMIN)
    assert admin.post("/ops/endpoints/big/tenants", {"listed": ["acme"], "tenant": ["acme"]}).status_code == 403
    assert may_use(read, "big") == ["globex"]


# --- at use: a withdrawn endpoint serves no more -------------------------------------------------


@pytest.mark.slow
def test_a_tenant_left_pointing_at_an_endpoint_it_may_not_use_is_served_by_the_default_model(
    api, cli, engine, workers, model
):
    """A row that escaped the checks (a choice racing a withdrawal, a hand edit): the worker serves
    the tenant from the default model, and the endpoint's server hears nothing."""
    with ModelServer() as theirs:
        add(cli, "globex-only", "globex", base_url=theirs.url)
        with engine.begin() as connection:
            connection.execute(
                text(
                    "UPDATE tenants SET endpoint_id = (SELECT id FROM model_endpoints WHERE name = 'globex-only'),"
                    " small_endpoint_id = (SELECT id FROM model_endpoints WHERE name = 'globex-only')"
                    " WHERE slug = 'acme'"
                )
            )
        workers()
        ours = start(api, "Look up ada@example.com")
        assert wait_status(api, ours, "completed", "failed")["status"] == "completed"
        assert theirs.requests == [] and theirs.counted == [] and model.requests


# --- keys come only from MODEL_KEY_ variables ----------------------------------------------------


@pytest.mark.parametrize("variable", ["HOME", "ANTHROPIC_API_KEY", "DATABASE_URL", "MODEL_KEY_"])
def test_a_key_variable_not_named_model_key_is_refused_by_the_command_line_and_the_page(app, cli, read, variable):
    says = f"'{variable}' cannot hold an endpoint's key: the desk reads keys only from variables named MODEL_KEY_..."
    added = cli("endpoint", "add", "q", "--base-url", "http://h:1", "--model", "m", "--api-key-env", variable)
    assert added.exit_code == 2 and says in added.output
    page = sign_in(app, OPERATOR).post("/ops/endpoints", {**GOOD, "api_key_env": variable})
    assert (
        page.status_code == 422 and says in unescape(page.text) and 'aria-describedby="api_key_env-error"' in page.text
    )
    assert read(lambda s: s.scalar(select(func.count()).select_from(ModelEndpoint))) == 0

    add(cli, "big", "acme")
    changed = cli("endpoint", "update", "big", "--api-key-env", variable)
    assert changed.exit_code == 2 and says in changed.output
    assert read(lambda s: s.scalar(select(ModelEndpoint.api_key_env))) is None


@pytest.mark.slow
def test_an_endpoint_stored_with_another_variable_is_never_read_from_it(app, api, cli, engine, read, workers):
    """An endpoint registered before this rule, its key from $HOME: the worker fails the run with the
    sentence that says how to set the key again, before the endpoint's server hears anything."""
    with ModelServer() as local:
        add(cli, "old", "acme", base_url=local.url)
        with engine.begin() as connection:
            connection.execute(text("UPDATE model_endpoints SET api_key_encrypted = NULL, api_key_env = 'HOME'"))
        assert cli("tenant", "set-model", "acme", "--endpoint", "old").exit_code == 0
        listing = cli("endpoint", "list").output
        assert "old: old-model at http" in listing and "key from $HOME, never read" in listing
        page = sign_in(app, OPERATOR).get("/ops/endpoints/old").text
        assert "The key of endpoint old is set to come from $HOME" in page and 'id="key-problem"' in page

        workers()
        ours = start(api, "Look up ada@example.com")
        failed = wait_status(api, ours, "completed", "failed")
        assert failed["status"] == "failed" and local.requests == [] and local.counted == []
        assert failed["error"]["code"] == "endpoint_unusable"
        assert "the desk reads keys only from variables named MODEL_KEY_..." in failed["error"]["message"]
        assert "flask endpoint update old --api-key-env MODEL_KEY_..." in failed["error"]["message"]

        fixed = cli("endpoint", "update", "old", "--api-key-env", "MODEL_KEY_OLD")
        assert fixed.exit_code == 0 and "key from $MODEL_KEY_OLD" in fixed.output
        endpoint = read(lambda s: s.scalar(select(ModelEndpoint)))
        assert keys.key_problem(endpoint) is None


def test_reading_the_key_of_an_endpoint_stored_with_another_variable_refuses(app, monkeypatch):
    endpoint = ModelEndpoint(name="old", base_url="http://h:1", model="m", api_key_env="HOME")
    monkeypatch.setenv("HOME", "the-host-home")
    refused = r"sets it again with `flask endpoint update old --api-key-env MODEL_KEY_"
    with pytest.raises(endpoints.EndpointError, match=refused):
        keys.api_key(endpoint, app.extensions["desk"].config)
    monkeypatch.setenv("MODEL_KEY_OLD", "sk-from-the-right-variable")
    endpoint.api_key_env = "MODEL_KEY_OLD"
    assert keys.api_key(endpoint, app.extensions["desk"].config) == "sk-from-the-right-variable"


def test_an_endpoint_whose_stored_key_cannot_be_read_fails_each_call_for_good_in_words(app, cli, engine):
    """The same door for a key sealed under another SECRET_KEY: the run fails with what to do, rather
    than the job failing on every retry."""
    from webapp.runtime.extensions import db

    add(cli, "sealed", "acme")
    assert cli("tenant", "set-model", "acme", "--endpoint", "sealed").exit_code == 0
    with engine.begin() as connection:
        connection.execute(text("UPDATE model_endpoints SET api_key_encrypted = 'sealed-under-another-key'"))
    acme = db.session.scalar(select(Tenant.id).where(Tenant.slug == "acme"))
    choice = choice_for(db.session, app.extensions["desk"].config, acme)
    with pytest.raises(ModelError) as failed:
        choice.client.generate(system=[], messages=[{"role": "user", "content": "hi"}])
    assert (failed.value.code, failed.value.transient) == ("endpoint_unusable", False)
    assert "SECRET_KEY changed since it was stored" in failed.value.message and choice.client.endpoint == "sealed"
    db.session.remove()


# --- the migration --------------------------------------------------------------------------------


def test_the_migration_allows_each_endpoint_for_the_tenants_using_it(base_env, blank_database):
    before = revision_before(REVISION)
    flask_db(base_env, blank_database, "upgrade", before)
    engine = sa.create_engine(blank_database)
    now = sa.func.current_timestamp()
    columns = ("id", "name", "base_url", "model", "protocol", "created_at", "updated_at")
    endpoints_table = sa.table("model_endpoints", *(sa.column(c) for c in columns))
    columns = ("id", "slug", "name", "created_at", "endpoint_id", "small_endpoint_id")
    tenants = sa.table("tenants", *(sa.column(c) for c in columns))
    with engine.begin() as connection:  # acme uses big and mini (small), globex big, initech none
        for id_, name in ((1, "big"), (2, "mini"), (3, "unused")):
            connection.execute(
                endpoints_table.insert().values(
                    id=id_,
                    name=name,
                    base_url="http://h:1",
                    model=name,
                    protocol="tools",
                    created_at=now,
                    updated_at=now,
                )
            )
        for id_, slug, endpoint_id, small_id in ((1, "acme", 1, 2), (2, "globex", 1, None), (3, "initech", None, None)):
            connection.execute(
                tenants.insert().values(
                    id=id_, slug=slug, name=slug, created_at=now, endpoint_id=endpoint_id, small_endpoint_id=small_id
                )
            )

    flask_db(base_env, blank_database, "upgrade", REVISION)
    with engine.connect() as connection:
        grants = set(connection.execute(text("SELECT endpoint_id, tenant_id FROM endpoint_tenants")))
        stamped = connection.scalar(text("SELECT count(*) FROM endpoint_tenants WHERE granted_at IS NOT NULL"))
    assert grants == {(1, 1), (2, 1), (1, 2)} and stamped == 3

    flask_db(base_env, blank_database, "downgrade", before)
    assert "endpoint_tenants" not in sa.inspect(engine).get_table_names()
    engine.dispose()
