"""Invariant 11 for MCP servers: nothing a tenant's admin types starts a process on the desk's host or
sends the desk's environment to a server. Commands, a started server's variables and any $VARIABLE
are the operator's (the command line, /ops/mcp); a tenant's admin may name only the secrets the operator
granted to their tenant (tests/mcp/test_secret_grants.py). Every refused or failed add is audited. Rows
stored before these doors were closed are never started, nor their variables read, until an operator
sets them again."""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from html import unescape

import pytest
from sqlalchemy import MetaData, create_engine, select, text
from sqlalchemy.engine import make_url

from tests.clients import sign_in
from tests.mcp.conftest import SURROUNDINGS, acme, events, newest_event, person, run, servers, surroundings
from webapp.models import McpServer, McpTool
from webapp.runtime.extensions import db
from webapp.tools import mcp

ONLY_OPERATORS = "Only the desk's operator can add a server that the desk starts; ask them to run `flask mcp add"
ADD_AGAIN = "an operator must add this server again"
ADMIN, OPERATOR = "admin@acme.test", "operator@desk.test"


def stored_before_the_doors(name: str, *, url=None, command=None, headers=(), held=False) -> None:
    """A server as a tenant's admin could add it before only operators could give a command or name
    any variable: added by the admin, its command not marked as an operator's, its header unmarked."""
    server = McpServer(
        tenant_id=acme(),
        name=name,
        url=url,
        command=command,
        headers=list(headers),
        version=1,
        created_by_id=person(ADMIN),
    )
    schema = {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}
    accepted = mcp.fingerprint("How many are there.", schema, {})
    server.tools.append(
        McpTool(
            tenant_id=server.tenant_id,
            registry_name=f"mcp_{name}__lookup_stock",
            remote_name="lookup_stock",
            description="How many are there.",
            input_schema=schema,
            annotations={},
            fingerprint=accepted,
            current_description="How many are there, and more.",
            current_input_schema=schema,
            current_annotations={},
            current_fingerprint=accepted if not held else "0" * 64,
            held=held,
            accepted_by_id=person(ADMIN),
        )
    )
    db.session.add(server)
    db.session.commit()
    db.session.remove()


# --- who may start a program ------------------------------------------------------------------------


def test_a_command_a_tenant_admin_posts_starts_nothing_is_refused_in_words_and_audited(app, tmp_path):
    marker = tmp_path / "started"
    since = newest_event()
    admin = sign_in(app, ADMIN)
    typed = {"name": "inventory", "url": "", "command": f"sh -c 'touch {marker}'", "headers": ""}
    refused = admin.post("/admin/mcp", typed)

    assert not marker.exists()
    assert refused.status_code == 403
    assert ONLY_OPERATORS in unescape(refused.text)
    assert 'value="inventory"' in refused.text  # kept
    assert 'name="command"' not in refused.text  # the form has no such field
    assert servers() == []
    (event,) = events("mcp_server_add_refused", since)
    assert (event.actor_label, event.tenant_id) == (ADMIN, acme())
    assert event.data["server"] == "inventory" and event.data["command"] == typed["command"]
    assert event.data["reason"].startswith(ONLY_OPERATORS)


@pytest.mark.parametrize(
    ("extra", "status", "says"),
    [
        ({"command": ""}, 403, ONLY_OPERATORS),  # a command field is refused, even empty
        ({"command": "  "}, 403, ONLY_OPERATORS),
        ({"colour": "blue"}, 422, "This form has no field colour; reload the page."),
        ({"environment": "A=1", "working_directory": "/"}, 422, "no field environment, working_directory"),
    ],
)
def test_a_field_the_admins_form_does_not_have_is_refused_and_audited(app, warehouse, extra, status, says):
    since = newest_event()
    refused = sign_in(app, ADMIN).post("/admin/mcp", {"name": "warehouse", "url": warehouse.url, **extra})
    assert refused.status_code == status and says in unescape(refused.text)
    assert servers() == [] and warehouse.requests_headers() == []  # not even the URL was asked
    (event,) = events("mcp_server_add_refused", since)
    assert says in event.data["reason"] and event.data["url"] == warehouse.url


def test_no_request_of_a_tenant_admin_starts_a_process(app, tmp_path):
    """Every MCP form of the admin's page, on a server whose command an admin set before the doors
    closed, and what runs without a person: the periodic check and a call of its tool."""
    from jobs.mcp import check_servers as check_mcp_servers

    marker = tmp_path / "started"
    command = f"sh -c 'touch {marker}'"
    stored_before_the_doors("legacy", command=command, held=True)
    admin = sign_in(app, ADMIN)

    page = admin.get("/admin/mcp")
    added = admin.post("/admin/mcp", {"name": "again", "command": command})
    synced = admin.post("/admin/mcp/legacy/sync")
    accepted = admin.post("/admin/mcp/tools/mcp_legacy__lookup_stock/accept")
    checked = check_mcp_servers()
    called = run("mcp_legacy__lookup_stock", {"sku": "SKU-1"})
    removed = admin.post("/admin/mcp/legacy/remove")

    assert not marker.exists()
    said = unescape(page.text)
    assert "Not started" in said and "Ask the desk's operator to add it again." in said
    assert added.status_code == 403
    assert synced.status_code == 422 and ADD_AGAIN in unescape(synced.text) and "Nothing was started." in synced.text
    assert accepted.status_code == 303
    assert checked == "1 server(s) checked: 0 tool(s) held, 0 released"
    assert called.is_error and ADD_AGAIN in called.content
    assert removed.status_code == 303 and servers() == []


def test_every_failed_add_from_the_page_leaves_its_audit_event_and_never_a_header_value(app):
    since = newest_event()
    admin = sign_in(app, ADMIN)
    secret = {"headers": "Authorization: Bearer s3cret-value"}
    for typed in (
        {"name": "warehouse", "url": "http://127.0.0.1:1/mcp", **secret},
        {"name": "Big Name", "url": "http://127.0.0.1:1/mcp", **secret},
        {"name": "warehouse", "url": "ftp://example.com", **secret},
        {"name": "warehouse", "url": "http://127.0.0.1:1/mcp", "headers": "Bearer s3cret-value"},
        {"name": "warehouse", "url": "ftp://mcp\x00.example/mcp"},  # a NUL: still recorded, never a 500
        {"name": "warehouse", "url": "http://mcp\x00.example/mcp"},
    ):
        assert admin.post("/admin/mcp", typed).status_code == 422
    refused = events("mcp_server_add_refused", since)
    assert [(e.data["server"], e.data["url"], e.data["headers"]) for e in refused] == [
        ("warehouse", "http://127.0.0.1:1/mcp", ["Authorization"]),
        ("Big Name", "http://127.0.0.1:1/mcp", ["Authorization"]),
        ("warehouse", "ftp://example.com", ["Authorization"]),
        ("warehouse", "http://127.0.0.1:1/mcp", []),  # a line without its colon may be all secret
        ("warehouse", "ftp://mcp\\x00.example/mcp", []),
        ("warehouse", "http://mcp\\x00.example/mcp", []),
    ]
    reasons = [e.data["reason"] for e in refused]
    assert "The address http://127.0.0.1:1 was refused: private address (127.0.0.1, loopback)." in reasons[0]
    assert "is not a server name" in reasons[1] and "is not a server URL" in reasons[2]
    assert reasons[3].startswith("A header line has no colon")
    assert {(e.actor_label, e.tenant_id) for e in refused} == {(ADMIN, acme())}
    assert "s3cret" not in json.dumps([e.data for e in refused]) and servers() == []


# --- secrets from the environment -------------------------------------------------------------------


def test_a_header_naming_a_variable_of_the_desk_is_refused_on_the_page_and_never_reaches_the_server(app, warehouse):
    since = newest_event()
    admin = sign_in(app, ADMIN)
    refused = admin.post("/admin/mcp", {"name": "warehouse", "url": warehouse.url, "headers": "X-Leak: $PATH"})
    said = unescape(refused.text)
    assert refused.status_code == 422
    assert '"X-Leak: $PATH" would send the desk\'s environment variable PATH to the server' in said
    assert "a tenant's admin may name only the secrets granted to their tenant (no secret is granted to it)" in said
    assert "X-Leak: $PATH</textarea>" in said  # kept, to fix
    assert servers() == []
    assert not any("x-leak" in request for request in warehouse.requests_headers())
    assert os.environ["PATH"] not in json.dumps(warehouse.requests_headers())
    (event,) = events("mcp_server_add_refused", since)
    assert event.data["headers"] == ["X-Leak"] and os.environ["PATH"] not in json.dumps(event.data)


def test_a_secret_granted_to_the_tenant_is_read_for_its_admin_and_delivered(app, cli, warehouse, monkeypatch):
    monkeypatch.setenv("MCP_SECRET_WAREHOUSE", "t0ken-from-the-desk")
    assert cli("secret", "grant", "MCP_SECRET_WAREHOUSE", "--tenant", "acme").exit_code == 0
    admin = sign_in(app, ADMIN)
    added = admin.post(
        "/admin/mcp", {"name": "warehouse", "url": warehouse.url, "headers": "X-Key: $MCP_SECRET_WAREHOUSE"}
    )
    assert added.status_code == 303, unescape(added.text)
    page = admin.get("/admin/mcp").text
    assert "X-Key (from $MCP_SECRET_WAREHOUSE)" in page and "t0ken-from-the-desk" not in page
    (server,) = servers()
    assert server.headers == [{"name": "X-Key", "env": "MCP_SECRET_WAREHOUSE", "operator": False}]
    assert {request.get("x-key") for request in warehouse.requests_headers()} == {"t0ken-from-the-desk"}

    monkeypatch.setenv("MCP_SECRET_WAREHOUSE", "changed-since")  # read at each use
    assert admin.post("/admin/mcp/warehouse/sync").status_code == 303
    assert warehouse.requests_headers()[-1]["x-key"] == "changed-since"


def test_a_header_an_admin_stored_before_the_doors_is_not_read_and_the_call_says_which_to_set_again(app, warehouse):
    from jobs.mcp import check_servers as check_mcp_servers

    stored_before_the_doors("warehouse", url=warehouse.url, headers=[{"name": "X-Leak", "env": "PATH"}])
    admin = sign_in(app, ADMIN)
    assert "X-Leak (from $PATH, a secret not granted to this tenant: not sent)" in admin.get("/admin/mcp").text
    synced = admin.post("/admin/mcp/warehouse/sync")
    assert synced.status_code == 422
    assert "The X-Leak header of the MCP server warehouse reads $PATH" in unescape(synced.text)
    assert check_mcp_servers() == "1 server(s) checked: 0 tool(s) held, 0 released"
    called = run("mcp_warehouse__lookup_stock", {"sku": "SKU-1"})
    assert called.is_error and "add it again with the X-Leak header set again" in called.content
    assert warehouse.requests_headers() == []  # nothing at all was sent


def test_the_command_line_names_any_variable_of_the_desk(cli, warehouse):
    added = cli("mcp", "add", "warehouse", "--url", warehouse.url, "--tenant", "acme", "--header", "X-Path: $PATH")
    assert added.exit_code == 0, added.output
    assert servers()[0].headers == [{"name": "X-Path", "env": "PATH", "operator": True}]
    assert {request["x-path"] for request in warehouse.requests_headers()} == {os.environ["PATH"]}


# --- a started server gets PATH and its own variables ----------------------------------------------


def test_a_started_server_gets_only_path_and_the_variables_an_operator_gave_it(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("DESK_INVENTORY_TOKEN", "from-the-desk")
    monkeypatch.setenv("SMTP_PASSWORD", "the-desks-own-secret")  # one of the desk's: never passed on
    workdir = tmp_path / "inventory"
    workdir.mkdir()
    since = newest_event()
    added = cli(
        "mcp", "add", "inventory", "--tenant", "acme", "--command", f"{sys.executable} {SURROUNDINGS}",
        "--env", "INVENTORY_TOKEN=s3cret-typed", "--env", "FROM_DESK=$DESK_INVENTORY_TOKEN", "--cwd", str(workdir),
    )  # fmt: skip
    assert added.exit_code == 0, added.output

    seen = surroundings("mcp_inventory__surroundings", "INVENTORY_TOKEN", "FROM_DESK", "PATH")
    assert seen["names"] == ["FROM_DESK", "INVENTORY_TOKEN", "PATH"]
    assert seen["values"] == {
        "INVENTORY_TOKEN": "s3cret-typed",
        "FROM_DESK": "from-the-desk",
        "PATH": os.environ["PATH"],
    }
    assert seen["working_directory"] == str(workdir)

    (server,) = servers()
    assert "s3cret-typed" not in json.dumps(server.environment) and server.command_by_operator
    assert server.environment[1] == {"name": "FROM_DESK", "env": "DESK_INVENTORY_TOKEN"}
    listed = cli("mcp", "list", "--tenant", "acme").output
    assert (
        "variables: INVENTORY_TOKEN (stored encrypted), FROM_DESK (from $DESK_INVENTORY_TOKEN)" in listed
        and f"in {workdir}" in listed
        and "s3cret" not in listed
    )
    (event,) = events("mcp_server_added", since)
    assert event.data["environment"] == ["INVENTORY_TOKEN", "FROM_DESK"] and "s3cret" not in json.dumps(event.data)

    monkeypatch.setenv("DESK_INVENTORY_TOKEN", "changed-since")  # read at each start
    assert surroundings("mcp_inventory__surroundings", "FROM_DESK")["values"] == {"FROM_DESK": "changed-since"}
    monkeypatch.delenv("DESK_INVENTORY_TOKEN")
    gone = run("mcp_inventory__surroundings", {"values_of": []})
    assert gone.is_error and "reads $DESK_INVENTORY_TOKEN, which is not set in the desk's environment" in gone.content


# --- rows stored before the doors ---------------------------------------------------------------------


@pytest.fixture
def fresh_database(base_env, tmp_path):
    """An empty database of the kind the tests run on, for a migration to run from the start."""
    url = base_env["DATABASE_URL"]
    if not url.startswith("postgresql"):
        yield f"sqlite:///{tmp_path / 'migrating.db'}"
        return
    given = make_url(url)
    name = f"{given.database}_migrating"
    admin = create_engine(given, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    yield given.set(database=name).render_as_string(hide_password=False)
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def test_the_migration_leaves_only_what_the_command_line_added_to_the_operator(base_env, fresh_database):
    from flask_migrate import upgrade

    from webapp import create_app
    from webapp.config import Config

    app = create_app(Config.from_env({**base_env, "DATABASE_URL": fresh_database}))
    with app.app_context():
        upgrade(revision="0017_mcp")
        with db.engine.begin() as connection:  # rows as the schema of 0017_mcp held them
            before = MetaData()
            before.reflect(connection, only=["tenants", "users", "mcp_servers"])
            tenants, users, mcp_servers = (before.tables[n] for n in ("tenants", "users", "mcp_servers"))
            then = datetime(2026, 1, 1, tzinfo=UTC)
            connection.execute(tenants.insert(), {"id": 1, "slug": "acme", "name": "Acme", "created_at": then})
            connection.execute(
                users.insert(),
                {"id": 1, "tenant_id": 1, "email": ADMIN, "display_name": "", "password_hash": "", "roles": ["admin"],
                 "active": True, "session_token": "x", "created_at": then},
            )  # fmt: skip
            leak = [{"name": "X-Leak", "env": "PATH"}]
            for name, url, command, by in [
                ("typed-command", None, "sh -c id", 1),
                ("cli-command", None, "python -m inventory", None),
                ("typed-url", "http://mcp.example/mcp", None, 1),
                ("cli-url", "http://mcp.example/mcp", None, None),
            ]:
                connection.execute(
                    mcp_servers.insert(),
                    {"tenant_id": 1, "name": name, "url": url, "command": command, "headers": leak if url else [],
                     "version": 1, "created_by_id": by, "created_at": then},
                )  # fmt: skip
        upgrade(revision="0020_mcp_doors")
        columns = (McpServer.name, McpServer.command_by_operator, McpServer.headers, McpServer.environment)
        found = {name: rest for name, *rest in db.session.execute(select(*columns, McpServer.working_directory))}
        db.session.remove()
        db.engine.dispose()
    assert found == {
        "typed-command": [False, [], [], None],  # a tenant's admin set it: never started
        "cli-command": [True, [], [], None],
        "typed-url": [False, [{"name": "X-Leak", "env": "PATH", "operator": False}], [], None],
        "cli-url": [False, [{"name": "X-Leak", "env": "PATH", "operator": True}], [], None],
    }
