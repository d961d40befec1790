"""An agent that runs elsewhere, through the same inbox: a LangGraph graph written outside the repo (its
own directory, with only the standalone desk_client.py beside it) asks before a $300 transfer; a
reviewer edits it to $200 in the inbox in the browser, a second reviewer approves, and the graph runs
the $200 transfer and reports it, every step in the audit log."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import expect
from sqlalchemy import func, select

from tests.api.test_outside_calls import APPROVED_TWICE_AND_REPORTED, actions_on, declare, last_event
from tests.browser.test_decision_page import open_first_waiting_call
from tests.clients import AGENT, REVIEWER, REVIEWER2
from tests.conftest import wait_until
from webapp.models import AuditEvent, ExternalCall, ToolCall
from webapp.runtime.extensions import db

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_a_langgraph_agent_runs_the_transfer_two_reviewers_edited_and_approved(
    page_for, live_server, api, read, tmp_path
):
    before = last_event(read)
    assert declare(api, policy={"mode": "always", "approvals": 2}).status_code == 200
    ledger = tmp_path / "ledger.jsonl"
    request = ("--request", "Pay supplier ACME-17 $300 for invoice 88", "--ledger", str(ledger))
    with outside_agent("langgraph_transfer.py", tmp_path, live_server, api.token(AGENT), *request) as agent:
        asked(read)
        reviewer = page_for(REVIEWER)
        open_first_waiting_call(reviewer)
        expect(reviewer.locator("#outside-context")).to_contain_text("Asked by treasury-graph")
        expect(reviewer.locator("#outside-context")).to_contain_text("Pay supplier ACME-17 $300 for invoice 88")
        reviewer.get_by_text("Edit and approve").click()
        amount = reviewer.get_by_label("Amount ($)")
        expect(amount).to_have_value("300.00")
        amount.fill("200")
        reviewer.get_by_label("Why you changed them").fill("only $200 is due now")
        reviewer.get_by_role("button", name="Approve with these arguments").click()
        expect(reviewer.locator(".flash").first).to_contain_text("needs 1 more approval from another reviewer")
        assert agent.poll() is None  # still waiting: two people must approve

        second = page_for(REVIEWER2)
        open_first_waiting_call(second)
        expect(second.locator("#call-arguments-shown")).to_contain_text("$200.00")
        second.get_by_role("button", name=re.compile(r"^Approve")).first.click()
        expect(second.locator(".flash").first).to_contain_text("You approved")

        said = said_by(agent)
    assert said["asked"]["amount_cents"] == 30_000
    assert said["decision"]["status"] == "approved" and said["sent"]["amount_cents"] == 20_000
    assert [json.loads(line)["amount_cents"] for line in ledger.read_text().splitlines()] == [20_000]

    db.session.remove()
    call = read(lambda s: s.scalar(select(ToolCall).where(ToolCall.source == "treasury-graph")))
    assert call.status == "succeeded" and call.input["amount_cents"] == 20_000
    assert call.original_input["amount_cents"] == 30_000
    actions = actions_on(read, call.id, before, AuditEvent.action != "approval_viewed")
    assert actions == APPROVED_TWICE_AND_REPORTED


def test_the_client_asks_waits_and_reports_as_a_coroutine_and_says_what_the_desk_refused(live_server, api, app):
    from desk_client import AsyncDesk, Desk, DeskError

    declare(api)
    desk = AsyncDesk(live_server.url, api.token(AGENT), source="payments-loop")

    reviewer = api.as_(REVIEWER)  # (its token made here; the calls below run in other threads)

    def first_waiting() -> int | None:
        with app.app_context():
            waiting = reviewer.get("/api/approvals").json["approvals"]
        return waiting[0]["id"] if waiting else None

    def reject(call_id: int) -> None:
        with app.app_context():
            reviewer.post(f"/api/approvals/{call_id}", json={"decision": "reject", "reason": "Not ours."})

    async def ask_and_report():
        asked = asyncio.create_task(
            desk.ask("transfer", {"amount_cents": 4_000, "account": "ACME-9"}, context="Refund a double charge.")
        )
        call_id = await asyncio.to_thread(wait_until, first_waiting, 60, "the call to wait")
        await asyncio.to_thread(reject, call_id)
        decision = await asked
        return decision

    # (in a thread of its own: the session's Playwright keeps an event loop running in this one)
    with ThreadPoolExecutor(1) as thread:
        decision = thread.submit(asyncio.run, ask_and_report()).result(timeout=120)
    assert decision.status == "rejected" and decision.reason == "Not ours." and not decision.approved
    with pytest.raises(DeskError) as refused:
        Desk(live_server.url, api.token(AGENT), source="payments-loop").report(decision, ok=True, summary="Sent.")
    assert refused.value.status == 409 and refused.value.code == "not_approved"
    with pytest.raises(DeskError) as unknown:
        Desk(live_server.url, api.token(AGENT), source="payments-loop").ask("wire", {}, context="x", timeout=0)
    assert unknown.value.code == "unknown_tool" and "transfer" in unknown.value.message

    waiting = Desk(live_server.url, api.token(AGENT), source="payments-loop").ask(
        "transfer", {"amount_cents": 100, "account": "ACME-9"}, context="A second try.", timeout=0
    )
    assert waiting.waiting
    given_up = Desk(live_server.url, api.token(AGENT), source="payments-loop").cancel(waiting, "Not needed.")
    assert given_up.status == "cancelled"


@contextmanager
def outside_agent(program: str, tmp_path: Path, live_server, token: str, *extra: str) -> Iterator[subprocess.Popen]:
    """An example agent running outside the repo (run_outside), killed if the test ends before it does."""
    agent = run_outside(program, tmp_path, live_server, token, *extra)
    try:
        yield agent
    finally:
        if agent.poll() is None:
            agent.kill()


def asked(read) -> None:
    """Wait until the outside agent has asked the desk."""
    wait_until(
        lambda: read(lambda s: s.scalar(select(func.count(ExternalCall.tool_call_id)))) == 1, 60, "the agent to ask"
    )


def said_by(agent: subprocess.Popen) -> dict:
    """The agent's last line of output, once it ended well."""
    out, err = agent.communicate(timeout=120)
    assert agent.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def run_outside(program: str, tmp_path: Path, live_server, token: str, *extra: str) -> subprocess.Popen:
    """An example agent from examples/, copied outside the repo with the client beside it, started."""
    where = tmp_path / "team-repo"
    where.mkdir(exist_ok=True)
    shutil.copy(ROOT / "examples" / program, where / "agent.py")
    shutil.copy(ROOT / "desk_client" / "__init__.py", where / "desk_client.py")
    return subprocess.Popen(
        [sys.executable, str(where / "agent.py"), "--desk", live_server.url, "--token", token, *extra],
        cwd=where,
        env={"PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1", "OPENAI_AGENTS_DISABLE_TRACING": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_an_agents_sdk_run_stops_for_the_desk_and_runs_the_edited_transfer(live_server, api, read, tmp_path):
    assert declare(api).status_code == 200
    ledger = tmp_path / "ledger.jsonl"
    request = ("--request", "Pay supplier ACME-17 $300 for invoice 88", "--ledger", str(ledger), "--scripted")
    with outside_agent("openai_agents_transfer.py", tmp_path, live_server, api.token(AGENT), *request) as agent:
        asked(read)
        call_id = api.as_(REVIEWER).get("/api/approvals").json["approvals"][0]["id"]
        edited = {"amount_cents": 20_000, "account": "ACME-17", "memo": "invoice 88"}
        decided = api.as_(REVIEWER).post(f"/api/approvals/{call_id}", json={"decision": "approve", "input": edited})
        assert decided.status_code == 200, decided.json
        said = said_by(agent)
    assert said["sent"] == edited and "Sent $200.00 to ACME-17." in said["final_output"]
    assert [json.loads(line) for line in ledger.read_text().splitlines()] == [edited]
    shown = api.as_(AGENT).get(f"/api/calls/{call_id}").json
    assert shown["source"] == "treasury-agents-sdk" and shown["outcome"]["summary"] == "Sent $200.00 to ACME-17."


def test_the_claude_agent_sdk_callback_allows_the_edited_call_and_denies_with_the_reviewers_reason(
    live_server, api, app
):
    import claude_agent_sdk as sdk  # (the dev extras install LangGraph and both Agents SDKs: none is skipped)

    spec = importlib.util.spec_from_file_location("claude_example", ROOT / "examples" / "claude_agent_sdk_transfer.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    from desk_client import AsyncDesk

    declare(api)
    desk = AsyncDesk(live_server.url, api.token(AGENT), source="treasury-claude-agent")
    can_use_tool = example.desk_permissions(desk, {"mcp__treasury__transfer": "transfer"}, "Invoice 88 is due.")
    reviewer = api.as_(REVIEWER)
    asked = {"amount_cents": 30_000, "account": "ACME-17", "memo": "invoice 88"}

    def decide(body: dict) -> None:
        def first_waiting():
            with app.app_context():
                waiting = reviewer.get("/api/approvals").json["approvals"]
            return waiting[0]["id"] if waiting else None

        call_id = wait_until(first_waiting, 60, "the call to wait")
        with app.app_context():
            assert reviewer.post(f"/api/approvals/{call_id}", json=body).status_code == 200

    async def ask(tool_use_id: str, body: dict):
        answer = asyncio.create_task(
            can_use_tool("mcp__treasury__transfer", asked, sdk.ToolPermissionContext(tool_use_id=tool_use_id))
        )
        await asyncio.to_thread(decide, body)
        return await answer

    async def walk():
        other = await can_use_tool("Read", {"file_path": "/tmp/x"}, sdk.ToolPermissionContext(tool_use_id="toolu_0"))
        edited = await ask("toolu_1", {"decision": "approve", "input": {**asked, "amount_cents": 20_000}})
        refused = await ask("toolu_2", {"decision": "reject", "reason": "Paid already."})
        return other, edited, refused

    with ThreadPoolExecutor(1) as thread:  # (the session's Playwright keeps an event loop in this thread)
        other, edited, refused = thread.submit(asyncio.run, walk()).result(timeout=120)
    assert isinstance(other, sdk.PermissionResultAllow) and other.updated_input is None  # not gated: not asked
    assert isinstance(edited, sdk.PermissionResultAllow) and edited.updated_input["amount_cents"] == 20_000
    assert isinstance(refused, sdk.PermissionResultDeny) and "rejected: Paid already." in refused.message
