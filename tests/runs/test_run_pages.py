"""Runs for people: a file uploaded on the Runs page (a bad one said and what was typed kept), the
command line's run-batch, a run's page with its counts and cost, and a run's calls decided together
from the inbox: grouped by tool and policy, each bound to the arguments it was shown with and
audited on its own, a call someone else decided meanwhile left as it is."""

from __future__ import annotations

import io
import re
from html import unescape

from sqlalchemy import func, select

from tests.clients import session_as
from tests.runs.test_batch_runs import settle_run, start_run, statuses
from webapp.models import AuditEvent, Conversation, Run, ToolCall
from webapp.runtime.extensions import db


def csrf(html: str, form_id: str) -> str:
    form = re.search(rf'<form[^>]*id="{form_id}".*?</form>', html, re.S).group(0)
    return re.search(r'name="csrf_token" value="([^"]+)"', form).group(1)


def upload(client, data: bytes, filename: str, **fields):
    token = csrf(client.get("/runs").get_data(as_text=True), "run-form")
    return client.post(
        "/runs",
        data={"csrf_token": token, "file": (io.BytesIO(data), filename), **fields},
        content_type="multipart/form-data",
    )


def test_an_agent_starts_a_run_from_a_file_and_a_bad_file_is_said_with_the_name_kept(app, model):
    agent = session_as(app, "agent@acme.test")
    bad = upload(
        agent, b'{"message": "Show invoices for customer 4471"}\n{"text": "oops"}\n', "items.jsonl", title="Q3"
    )
    assert bad.status_code == 422
    html = unescape(bad.get_data(as_text=True))
    assert 'Line 2 must be an object with one field, "message", holding text. Choose the file again.' in html
    assert 'value="Q3"' in html  # what was typed stays
    assert db.session.scalar(select(func.count(Run.id))) == 0  # nothing half-written

    csv = b"message,customer\nShow invoices for customer 4471,4471\nShow invoices for customer 4401,4401\n"
    started = upload(agent, csv, "incident.csv", batch="1")
    assert started.status_code == 303
    run = db.session.scalar(select(Run))
    assert started.location.endswith(f"/runs/{run.id}")
    assert (run.items, run.batch, run.title) == (2, True, "incident.csv")

    settle_run(run.id)
    page = unescape(agent.get(f"/runs/{run.id}").get_data(as_text=True))
    assert re.search(r'id="run-count-completed"><strong>2</strong>', page)
    assert "2 of 2 done." in page
    assert re.search(r"Cost so far: <strong>\$[\d.]+</strong> for 4 model calls \(4 by batch\)", page)
    # the run's conversations are on its page, not in the agent's list of chats
    listed = agent.get("/conversations").get_data(as_text=True)
    assert "Show invoices for customer 4401" not in listed
    assert "Show invoices for customer 4401" in page


def test_the_command_line_starts_a_run_from_a_file_and_refuses_what_it_cannot_run(app, model, tmp_path):
    items = tmp_path / "tickets.jsonl"
    items.write_text('{"message": "Show invoices for customer 4471"}\n')
    runner = app.test_cli_runner()
    done = runner.invoke(args=["run-batch", str(items), "--tenant", "acme", "--as", "agent@acme.test"])
    assert done.exit_code == 0, done.output
    run = db.session.scalar(select(Run))
    assert f"Run {run.id} started: 1 item(s) of agent@acme.test, model moves by Message Batch." in done.output
    assert run.batch and run.title == "tickets.jsonl"

    refused = runner.invoke(args=["run-batch", str(items), "--tenant", "acme", "--as", "auditor@acme.test"])
    assert refused.exit_code == 2 and "auditor@acme.test is no agent" in refused.output
    empty = tmp_path / "empty.csv"
    empty.write_text("message\n")
    nothing = runner.invoke(args=["run-batch", str(empty), "--tenant", "acme", "--as", "agent@acme.test"])
    assert nothing.exit_code == 2 and "A run needs at least one item." in nothing.output
    assert db.session.scalar(select(func.count(Run.id))) == 1


REFUND = "Refund $60 on invoice {}, the delivery was late"


def test_a_runs_refunds_are_decided_together_each_bound_to_what_was_shown_and_audited_alone(app, api, model):
    run_id = start_run(api, [REFUND.format(n) for n in (4471, 4401, 4402)])
    assert set(settle_run(run_id).values()) == {"awaiting_approval"}
    calls = db.session.scalars(select(ToolCall).order_by(ToolCall.id)).all()
    assert [call.name for call in calls] == ["issue_refund"] * 3

    reviewer = session_as(app, "reviewer@acme.test")
    inbox = unescape(reviewer.get(f"/approvals?run={run_id}&group=1").get_data(as_text=True))
    assert re.search(r"issue_refund · policy v\d+: .* · 3 calls", inbox)
    picks = re.findall(r'name="call" value="(\d+:[0-9a-f]+)"', inbox)
    assert [int(pick.split(":")[0]) for pick in picks] == [call.id for call in calls]
    other_run = unescape(reviewer.get(f"/approvals?run={run_id + 1}").get_data(as_text=True))
    assert "Nothing waits for a decision with these filters" in other_run

    # meanwhile another reviewer decides the first, and the second's arguments are not what was shown
    decided = api.as_("reviewer2@acme.test").post(
        f"/api/approvals/{calls[0].id}", json={"decision": "approve", "arguments_hash": picks[0].split(":")[1]}
    )
    assert decided.status_code == 200, decided.json
    stale = f"{calls[1].id}:{'0' * 64}"
    before = db.session.scalar(select(func.max(AuditEvent.id)))
    answer = reviewer.post(
        "/approvals/bulk",
        data={
            "csrf_token": csrf(inbox, "bulk-form"),
            "decision": "approve",
            "call": [picks[0], stale, picks[2]],
            "back": f"/approvals?run={run_id}&group=1",
        },
    )
    assert answer.status_code == 303 and answer.location.endswith(f"/approvals?run={run_id}&group=1")
    said = unescape(reviewer.get(answer.location).get_data(as_text=True))
    assert "You approved 1 call." in said
    assert f"#{calls[0].id}: Already decided by" in said
    assert f"#{calls[1].id}: The call's arguments changed since you looked; reload it." in said
    db.session.remove()
    assert [db.session.get(ToolCall, call.id).status for call in calls][1] == "awaiting_approval"
    decisions = db.session.execute(
        select(AuditEvent.tool_call_id, AuditEvent.actor_label).where(
            AuditEvent.id > before, AuditEvent.action == "approval_decided"
        )
    ).all()
    assert decisions == [(calls[2].id, "reviewer@acme.test")]  # one event for the one call it decided

    # the approved calls run, and their conversations answer by batch
    final = settle_run(run_id)
    assert sorted(final.values()) == ["awaiting_approval", "completed", "completed"]
    assert model.requests == []
    run = api.as_("agent@acme.test").get(f"/api/runs/{run_id}").json
    assert run["counts"]["awaiting_approval"] == 1 and run["counts"]["completed"] == 2


def test_selecting_nothing_or_no_decision_decides_nothing_and_says_what_to_do(app, api, model):
    run_id = start_run(api, [REFUND.format(4471)])
    settle_run(run_id)
    reviewer = session_as(app, "reviewer@acme.test")
    inbox = unescape(reviewer.get("/approvals").get_data(as_text=True))
    token = csrf(inbox, "bulk-form")
    nothing = reviewer.post("/approvals/bulk", data={"csrf_token": token, "decision": "approve"})
    assert "Select the calls to decide first; nothing was decided." in unescape(
        reviewer.get(nothing.location).get_data(as_text=True)
    )
    pick = re.search(r'name="call" value="([^"]+)"', inbox).group(1)
    no_decision = reviewer.post("/approvals/bulk", data={"csrf_token": token, "call": pick, "decision": "maybe"})
    assert "Choose Approve selected or Reject selected." in unescape(
        reviewer.get(no_decision.location).get_data(as_text=True)
    )
    odd = reviewer.post(
        "/approvals/bulk", data={"csrf_token": token, "call": ["99999999999:ab", "x:1"], "decision": "approve"}
    )
    said = unescape(reviewer.get(odd.location).get_data(as_text=True))
    assert "#99999999999: “99999999999:ab” names no call." in said and "#x: “x:1” names no call." in said
    bare = reviewer.post(
        "/approvals/bulk", data={"csrf_token": token, "call": pick.split(":")[0], "decision": "approve"}
    )
    assert "sent without the arguments it was shown with; reload." in unescape(
        reviewer.get(bare.location).get_data(as_text=True)
    )  # never whatever the call became since it was shown
    no_reason = reviewer.post("/approvals/bulk", data={"csrf_token": token, "call": pick, "decision": "reject"})
    assert "Say why you reject this call" in unescape(reviewer.get(no_reason.location).get_data(as_text=True))
    db.session.remove()
    assert set(statuses(run_id).values()) == {"awaiting_approval"}
    assert db.session.scalar(select(Conversation.status)) == "awaiting_approval"


def test_a_run_of_ten_thousand_items_is_taken_whole_by_the_api_and_the_page(app, api, model):
    """Far past the 64 KB every other request may carry: a bulk run's body is its items."""
    items = [{"message": f"Show invoices for customer {4400 + n % 100}, ticket {n}"} for n in range(10_000)]
    created = api.as_("agent@acme.test").post("/api/runs", json={"items": items})
    assert created.status_code == 201, created.json
    run = db.session.get(Run, created.json["id"])
    assert run.items == 10_000 and not run.batch
    too_many = api.as_("agent@acme.test").post("/api/runs", json={"items": [*items, {"message": "one more"}]})
    assert too_many.status_code == 422 and "10,000" in too_many.json["message"]

    lines = "".join(f'{{"message": "Show invoices for customer 4471, ticket {n}"}}\n' for n in range(10_000))
    uploaded = upload(session_as(app, "agent@acme.test"), lines.encode(), "tickets.jsonl")
    assert uploaded.status_code == 303
    assert db.session.scalar(select(func.max(Run.items))) == 10_000
    elsewhere = api.as_("agent@acme.test").post("/api/conversations", json={"message": "x" * 70_000})
    assert elsewhere.status_code == 413  # the other routes keep their limit
