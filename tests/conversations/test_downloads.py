"""A finished export downloads from its card: for the people who may see its conversation (the same
rule as the chat page), as an attachment named for the file; for anyone else, and for anything that
is not a file the call made, not found."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.accounts.people import new_user
from tests.clients import session_as
from tests.integration.test_workers import AGENT, start, wait_status
from webapp.runtime.extensions import db

pytestmark = pytest.mark.slow


@pytest.fixture
def export(app, api, workers) -> dict:
    """A conversation of agent@acme.test whose export of customer 4471 finished, written by a worker."""
    workers(EXPORT_STEP_SECONDS="0")
    conversation_id = start(api, "Export customer 4471's data")
    done = wait_status(api, conversation_id, "completed", timeout=60)
    call = done["tool_calls"][0]
    assert call["name"] == "export_customer_data" and call["status"] == "succeeded"
    return {
        "conversation_id": conversation_id,
        "call_id": call["id"],
        "url": f"/conversations/{conversation_id}/tool-calls/{call['id']}/file",
        "file": f"customer-4471-export-{call['id']}.json",
    }


def download(app, email: str, url: str):
    response = session_as(app, email).get(url)
    db.session.remove()
    return response


def test_the_owner_and_their_tenants_reviewers_download_the_file_from_the_card(app, export, env):
    card = session_as(app, AGENT).get(f"/conversations/{export['conversation_id']}").get_data(as_text=True)
    assert export["url"] in card and f"Download {export['file']}" in card

    for email in (AGENT, "reviewer@acme.test", "auditor@acme.test", "admin@acme.test"):
        response = download(app, email, export["url"])
        assert response.status_code == 200, (email, response.status_code)
        assert response.mimetype == "application/json"
        assert response.headers["Content-Disposition"] == f"attachment; filename={export['file']}"
        data = json.loads(response.get_data())
        assert data["profile"]["id"] == 4471 and data["tenant_id"] == 1

    (Path(env["INSTANCE_PATH"]) / "exports" / "1" / export["file"]).unlink()  # removed since: said so
    response = download(app, AGENT, export["url"])
    assert response.status_code == 404
    assert "it may have been removed" in response.get_data(as_text=True)


def test_anyone_the_conversation_page_refuses_and_anything_not_a_file_of_the_call_is_not_found(app, api, export):
    another_agent = new_user(("agent",))  # same tenant: the chat page refuses them (another agent's)
    assert session_as(app, another_agent.email).get(f"/conversations/{export['conversation_id']}").status_code == 403
    for email in (another_agent.email, "agent@globex.test", "reviewer@globex.test"):
        response = download(app, email, export["url"])
        assert response.status_code == 404, (email, response.status_code)
        assert b"customer-4471" not in response.get_data()
        assert "No such file in your account" in response.get_data(as_text=True)

    conversation_id, call_id = export["conversation_id"], export["call_id"]
    other = start(api, "hello")  # a conversation of the same agent, without the call
    for url in (
        f"/conversations/{conversation_id}/tool-calls/999999/file",  # no such call
        f"/conversations/999999/tool-calls/{call_id}/file",  # no such conversation
        f"/conversations/{other}/tool-calls/{call_id}/file",  # the call is another conversation's
        f"/conversations/{conversation_id}/tool-calls/{call_id}/file?file=../../../etc/passwd",  # never read
    ):
        response = download(app, AGENT, url)
        if "?file=" in url:  # the request names no file: the call's own result does
            assert response.status_code == 200 and json.loads(response.get_data())["profile"]["id"] == 4471
        else:
            assert response.status_code == 404, url
