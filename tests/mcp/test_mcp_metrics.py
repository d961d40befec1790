"""/metrics per MCP server and tool: runs, errors, latency and held tools, read from the audit log and
the catalogue, so every process answers the same; each tenant's admin sees their own servers only."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from tests.clients import session_as
from tests.conftest import desk_app, pushed
from tests.mcp.conftest import StartedWarehouse, acme
from tests.model_server import Reply
from tests.replies import reply, tool_use
from webapp.models import Conversation, McpTool
from webapp.runtime.extensions import db
from webapp.runtime.services import services

LOOKUP, RESERVE = "mcp_local__lookup_stock", "mcp_local__reserve_stock"


def converse(api, model, message: str, *calls: dict) -> None:
    """A conversation of agent@acme.test whose model asks for these calls, moved to its end in this
    process (read-only tools run at once)."""
    model.enqueue(Reply.message(reply(*calls)), match=message)
    created = api.as_("agent@acme.test").post("/api/conversations", json={"message": message}).json
    conversation = db.session.get(Conversation, created["id"])
    assert services().loop(db.session, conversation).complete() == "completed"
    db.session.commit()


def mcp_samples(app, email: str) -> dict[tuple, float]:
    """{(name, (tenant, server, tool)): value} of the MCP families of one scrape by this person (le
    joins the labels of a histogram's buckets)."""
    response = session_as(app, email).get("/metrics")
    db.session.remove()
    assert response.status_code == 200, response.text
    found = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name.startswith("desk_mcp_"):
                named = sample.labels
                bucket = [named["le"]] if "le" in named else []
                found[(sample.name, (named["tenant"], named["server"], named["tool"], *bucket))] = sample.value
    return found


def test_metrics_count_each_mcp_tools_runs_errors_latency_and_held_for_its_own_tenant(
    app, env, cli, api, model, tmp_path
):
    StartedWarehouse(tmp_path / "acme").add(cli)
    StartedWarehouse(tmp_path / "globex").add(cli, tenant="globex")  # a server of the same name elsewhere
    cli("create-user", "admin@globex.test", "--role", "admin", "--tenant", "globex", "--password", "demo-password")
    before = mcp_samples(app, "operator@desk.test")  # the audit log outlives tests: earlier runs count too
    converse(
        api,
        model,
        "how many SKU-1 and SKU-404",
        tool_use(LOOKUP, {"sku": "SKU-1"}),
        tool_use(LOOKUP, {"sku": "SKU-404"}),  # the server's error: a failed run
    )
    held = update(McpTool).where(McpTool.tenant_id == acme(), McpTool.registry_name == RESERVE).values(held=True)
    db.session.execute(held)
    db.session.commit()

    fleet = mcp_samples(app, "operator@desk.test")

    def grew(name: str, *where: str) -> float:
        return fleet[(name, where)] - before[(name, where)]

    acme_lookup, acme_reserve = ("acme", "local", LOOKUP), ("acme", "local", RESERVE)
    globex_lookup = ("globex", "local", LOOKUP)
    assert grew("desk_mcp_tool_calls_total", *acme_lookup) == 2
    assert grew("desk_mcp_tool_errors_total", *acme_lookup) == 1
    assert grew("desk_mcp_tool_call_latency_seconds_count", *acme_lookup) == 2
    assert grew("desk_mcp_tool_call_latency_seconds_bucket", *acme_lookup, "+Inf") == 2
    assert grew("desk_mcp_tool_call_latency_seconds_bucket", *acme_lookup, "30.0") == 2
    assert grew("desk_mcp_tool_call_latency_seconds_sum", *acme_lookup) > 0
    assert grew("desk_mcp_tool_calls_total", *acme_reserve) == 0  # every tool of the catalogue, run or not
    assert grew("desk_mcp_tool_calls_total", *globex_lookup) == 0  # the same names: another tenant's server
    assert fleet[("desk_mcp_tool_held", acme_lookup)] == 0 and fleet[("desk_mcp_tool_held", acme_reserve)] == 1
    assert fleet[("desk_mcp_tool_held", ("globex", "local", RESERVE))] == 0

    # A tenant's admin: their tenant's servers, with the same figures; never another tenant's.
    admins = mcp_samples(app, "admin@acme.test")
    assert admins == {key: value for key, value in fleet.items() if key[1][0] == "acme"}
    globex = mcp_samples(app, "admin@globex.test")
    assert globex == {key: value for key, value in fleet.items() if key[1][0] == "globex"} and globex

    # Another process (a fresh collector, which sums the audit log from the start) answers the same.
    with pushed(desk_app(env)) as other:
        assert mcp_samples(other, "operator@desk.test") == fleet
