"""Structured logs: JSON lines carrying the ids of what they are about, from a worker subprocess, a
web request and bound blocks."""

from __future__ import annotations

import io
import json
import logging
import threading

import pytest
from sqlalchemy import select

from tests.clients import session_as
from tests.conftest import wait_until
from webapp import logs
from webapp.config import Config
from webapp.models import Conversation
from webapp.runtime.extensions import db


def lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture
def captured(base_env):
    """configure() onto a buffer, as a process would at boot; the root logger is restored after."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    buffer = io.StringIO()

    def install(**env) -> io.StringIO:
        logs.configure(Config.from_env({**base_env, **env}), stream=buffer)
        return buffer

    yield install
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


def test_bound_ids_reach_every_json_line_inside_the_block_and_no_further(captured):
    buffer = captured(LOG_FORMAT="json")
    log = logging.getLogger("tests.logs.bound")
    log.info("before")
    with logs.bind(conversation_id=7, job_id="move-7-v3"):
        log.info("moving")
        with logs.bind(tool_call_id=12):
            log.warning("running %s", "issue_refund", extra={"tool": "issue_refund"})
        log.info("after the call")
    log.info("outside")
    before, moving, running, after, outside = lines(buffer.getvalue())
    assert {"conversation_id", "tool_call_id", "job_id"}.isdisjoint(before)
    assert moving["message"] == "moving" and moving["conversation_id"] == 7 and moving["job_id"] == "move-7-v3"
    assert "tool_call_id" not in moving
    assert running["tool_call_id"] == 12 and running["conversation_id"] == 7 and running["tool"] == "issue_refund"
    assert running["level"] == "WARNING" and running["logger"] == "tests.logs.bound"
    assert running["message"] == "running issue_refund" and running["time"].endswith("Z")
    assert "tool_call_id" not in after and after["conversation_id"] == 7
    assert "conversation_id" not in outside
    with pytest.raises(TypeError, match="unknown log id conversaton_id"):
        with logs.bind(conversaton_id=1):
            pass


def test_threads_never_see_each_others_ids(captured):
    buffer = captured(LOG_FORMAT="json")
    log = logging.getLogger("tests.logs.threads")
    barrier = threading.Barrier(2)

    def work(conversation_id: int) -> None:
        with logs.bind(conversation_id=conversation_id):
            barrier.wait(5)  # both bound at once
            log.info("in %s", conversation_id)

    threads = [threading.Thread(target=work, args=(n,)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert sorted((line["message"], line["conversation_id"]) for line in lines(buffer.getvalue())) == [
        ("in 1", 1),
        ("in 2", 2),
    ]


def test_the_text_format_stays_readable_and_keeps_the_ids(captured):
    buffer = captured(LOG_FORMAT="text")
    with logs.bind(conversation_id=5):
        logging.getLogger("tests.logs.text").error("it broke")
    line = buffer.getvalue().strip()
    assert " ERROR tests.logs.text it broke conversation_id=5" in line and not line.startswith("{")


def test_a_bad_log_format_stops_the_boot_with_a_sentence(base_env):
    from webapp.config import ConfigError

    with pytest.raises(ConfigError, match="LOG_FORMAT must be one of json, text, got 'yaml'"):
        Config.from_env({**base_env, "LOG_FORMAT": "yaml"})
    with pytest.raises(ConfigError, match="LOG_LEVEL must be one of"):
        Config.from_env({**base_env, "LOG_LEVEL": "chatty"})


def test_a_web_request_logs_its_request_id_and_the_conversation_of_its_url(app, api, captured, monkeypatch):
    # (the migrations' logging.config call disables loggers that existed before it, in this process only)
    monkeypatch.setattr(logging.getLogger("desk.request"), "disabled", False)
    created = api.as_("agent@acme.test").post("/api/conversations", json={"message": "hello"}).json
    buffer = captured(LOG_FORMAT="json")
    client = session_as(app, "agent@acme.test")
    response = client.get(f"/conversations/{created['id']}", headers={"X-Request-ID": "abc-123"})
    assert response.status_code == 200 and response.headers["X-Request-ID"] == "abc-123"
    (line,) = [line for line in lines(buffer.getvalue()) if line["logger"] == "desk.request"]
    assert line["request_id"] == "abc-123" and line["conversation_id"] == created["id"]
    assert line["status"] == 200 and line["method"] == "GET" and line["endpoint"] == "conversations.show"
    generated = client.get("/conversations", headers={"X-Request-ID": "<script>"})  # not echoed as given
    assert generated.headers["X-Request-ID"] != "<script>" and len(generated.headers["X-Request-ID"]) == 16
    db.session.remove()


@pytest.mark.slow
def test_a_worker_writes_json_lines_carrying_the_conversation_and_job_ids(app, api, workers):
    worker = workers(via_cli=True, LOG_FORMAT="json", LOG_LEVEL="INFO")  # the command itself
    created = api.as_("agent@acme.test").post("/api/conversations", json={"message": "hello"}).json
    conversation_id = created["id"]

    def finished() -> bool:
        status = db.session.scalar(select(Conversation.status).where(Conversation.id == conversation_id))
        db.session.remove()  # on SQLite an open transaction holds the write lock the worker needs
        return status == "completed"

    wait_until(finished, 60, "the worker to complete the conversation")
    worker.stop()
    output = worker.output()
    parsed = lines(output)  # every line of the worker is one JSON object
    assert parsed, output
    moves = [line for line in parsed if line["logger"] == "desk.jobs" and line.get("job") == "advance_conversation"]
    assert moves, output[-3000:]
    assert all(line["conversation_id"] == conversation_id for line in moves)
    assert all(line["job_id"].startswith(f"move-{conversation_id}-v") for line in moves)
    assert all(line["outcome"] and line["message"].startswith("advance_conversation done: ") for line in moves)
    # What the move itself logged (here the SDK's HTTP client) carries the same ids.
    model_requests = [line for line in parsed if "/v1/messages" in line["message"]]
    assert model_requests and all(line["conversation_id"] == conversation_id for line in model_requests)
    assert all(isinstance(line["duration_ms"], float) for line in moves)
