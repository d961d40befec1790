"""MCP tools get what a built-in tool declares, mapped by an admin per tool (issue 26 item 3): which
argument is the money a call moves (and its unit), which names what it acts on, and a read-only tool of
the same server whose live result the decision page shows as the facts."""

from __future__ import annotations

from html import unescape

from sqlalchemy import select

from tests.approvals.test_decision_page import section, words
from tests.clients import second_admin_approves, sign_in
from tests.mcp.test_gate import converse
from tests.mcp.test_mcp_tools import LOOKUP, RESERVE, add_warehouse
from tests.replies import tool_use
from webapp.models import AuditEvent, McpTool
from webapp.runtime.extensions import db
from webapp.tools import mcp

ADMIN = "admin@acme.test"


def reserve(sku: str, quantity: int) -> dict:
    return tool_use(RESERVE, {"sku": sku, "quantity": quantity})


def test_an_admin_maps_the_amount_subject_and_facts_and_the_gate_and_the_reviewer_use_them(
    app, cli, api, model, warehouse
):
    add_warehouse(cli, warehouse)
    mapped = cli(
        "mcp", "map", RESERVE, "--tenant", "acme", "--amount", "quantity", "--unit", "cents", "--subject", "sku",
        "--facts", "lookup_stock", "--facts-arg", "sku=sku",
    )  # fmt: skip
    assert mapped.exit_code == 0, mapped.output
    assert "Money: quantity (cents); Acts on: sku; Facts from: lookup_stock (sku = sku)" in mapped.output
    assert db.session.scalar(select(AuditEvent.action).order_by(AuditEvent.id.desc())) == "mcp_tool_mapped"
    db.session.remove()

    # With an amount, the tool may have an amount rule (a loosening: four eyes) and limits per subject.
    admin = api.as_(ADMIN)
    asked = admin.put(f"/api/policies/{RESERVE}", json={"mode": "above_amount", "threshold_cents": 5})
    assert asked.status_code == 202, asked.json
    second_admin_approves(app, RESERVE)
    stricter = admin.put(
        f"/api/policies/{RESERVE}",
        json={"mode": "above_amount", "threshold_cents": 5, "limits": {"subject_day_count": 1}},
    )
    assert stricter.status_code == 200, stricter.json

    small, large = converse(api, model, "two reservations", reserve("SKU-1", 3), reserve("SKU-3", 9))
    assert (small.status, small.money_cents, small.subject) == ("succeeded", 3, "sku:SKU-1")
    assert large.status == "awaiting_approval" and large.money_cents == 9
    (again,) = converse(api, model, "the same sku", reserve("SKU-1", 1))
    assert again.status == "awaiting_approval"
    assert again.policy["limit"] == (
        f"1 {RESERVE} call already ran without a person for sku SKU-1 in 24 hours; the limit is 1."
    )

    reviewer = sign_in(app, "reviewer@acme.test")
    panel = words(section(unescape(reviewer.get(f"/approvals/{large.id}").text), "decision-panel"))
    assert "lookup_stock (warehouse), read now Sku SKU-3 On hand 250" in panel  # live, from the server

    # What the policy weighs cannot be remapped under it.
    refused = cli("mcp", "map", RESERVE, "--tenant", "acme", "--amount", "sku", "--unit", "dollars")
    assert refused.exit_code == 2 and "policy weighs the money its calls move" in refused.output


def test_mappings_that_cannot_be_are_refused_in_words_on_the_page_and_keep_what_was_typed(app, cli, warehouse):
    add_warehouse(cli, warehouse)
    admin = sign_in(app, ADMIN)
    for form, says in (
        ({"amount": "price"}, f"{RESERVE} has no argument 'price'; its arguments: sku, quantity."),
        ({"amount": "sku", "unit": "cents"}, "sku is string in"),
        ({"facts_tool": "reserve_stock"}, "is not another tool of the server warehouse"),
        ({"facts_tool": "lookup_stock"}, "lookup_stock needs sku: say which of"),
        ({"facts_tool": "lookup_stock", "facts_arguments": "sku"}, "is not “its argument = this call's argument”"),
        ({"colour": "red"}, "This form has no field colour"),
    ):
        answer = admin.post(f"/admin/mcp/tools/{RESERVE}/map", {"unit": "cents", **form})
        assert answer.status_code == 422 and says in unescape(answer.text), (form, unescape(answer.text)[:300])
    typed = admin.post(f"/admin/mcp/tools/{RESERVE}/map", {"amount": "price", "unit": "dollars", "subject": "sku"})
    assert 'id="map-mcp_warehouse__reserve_stock" open' in typed.text and 'value="price"' in typed.text
    # A writing tool cannot give facts: the desk calls the facts tool whenever a reviewer opens a call.
    flipped = admin.post(
        f"/admin/mcp/tools/{LOOKUP}/map",
        {"unit": "cents", "facts_tool": "reserve_stock", "facts_arguments": "sku = sku"},
    )
    assert flipped.status_code == 422 and "must be a tool its server marks read-only" in unescape(flipped.text)
    assert db.session.scalar(select(McpTool.mapping).where(McpTool.registry_name == RESERVE)) is None
    saved = admin.post(
        f"/admin/mcp/tools/{RESERVE}/map",
        {"amount": "quantity", "unit": "cents", "facts_tool": "lookup_stock", "facts_arguments": "sku = sku"},
    )
    assert saved.status_code == 303
    assert "Facts from: lookup_stock (sku = sku)" in unescape(admin.get("/admin/mcp").text)


def test_money_in_dollars_or_cents_is_read_as_cents():
    assert [mcp.money_in_cents(v, "dollars") for v in ("12.50", 12.5, 12, "1e2", "12.505", "x", True, None)] == [
        1250, 1250, 1200, 10000, None, None, None, None,
    ]  # fmt: skip
    assert [mcp.money_in_cents(v, "cents") for v in (1250, "1250", 12.5, False)] == [1250, None, None, None]
