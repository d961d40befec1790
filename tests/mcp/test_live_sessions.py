"""A server the desk starts (stdio) is started once per worker process and kept: every call of its
tools goes over one live session, which is started again when its process dies, when the server
changes, after MCP_IDLE_SECONDS without a call, and never outlives the worker. The warehouse runs
over stdio and notes the pid of every start, so the tests count starts and stop servers themselves."""

from __future__ import annotations

import json
import os
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import wait_until
from tests.integration.test_workers import start, wait_status
from tests.mcp.conftest import StartedWarehouse, acme, context, run, running
from tests.model_server import Reply
from tests.replies import reply, tool_use
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.tools import mcp
from webapp.tools.registry import ToolError

LOOKUP, RESERVE = "mcp_local__lookup_stock", "mcp_local__reserve_stock"


def ask(api, model, message: str, *calls: dict) -> int:
    model.enqueue(Reply.message(reply(*calls)), match=message)
    return start(api, message)


@pytest.fixture
def env(env, request) -> dict[str, str]:
    """The app's settings, with a test's own (`@pytest.mark.parametrize("env", [{...}], indirect=True)`)."""
    return {**env, **getattr(request, "param", {})}


# --- one worker process, one server process ----------------------------------------------------------


def test_calls_from_one_worker_process_start_the_server_once(cli, api, workers, model, tmp_path):
    server = StartedWarehouse(tmp_path / "local").add(cli)
    listed_by_the_add = len(server.pids())
    workers()
    for sku, on_hand in (("SKU-1", 12), ("SKU-3", 250), ("SKU-2", 0)):
        conversation = ask(api, model, f"how many {sku} are there", tool_use(LOOKUP, {"sku": sku}))
        call = wait_status(api, conversation, "completed", timeout=60)["tool_calls"][0]
        assert call["status"] == "succeeded" and f'"on_hand": {on_hand}' in call["result"]
    assert len(server.pids()) == listed_by_the_add + 1  # three calls, one start
    assert running(server.pids()[-1])  # kept for the next call


def test_a_worker_stopped_with_sigterm_stops_the_servers_it_started(cli, api, workers, model, tmp_path):
    # This server takes a minute to exit after its stdin closes: only the worker stopping it ends it sooner.
    server = StartedWarehouse(tmp_path / "local", linger=60).add(cli)
    worker = workers()
    conversation = ask(api, model, "how many SKU-1", tool_use(LOOKUP, {"sku": "SKU-1"}))
    assert wait_status(api, conversation, "completed", timeout=60)["tool_calls"][0]["status"] == "succeeded"
    pid = server.pids()[-1]
    assert running(pid)
    worker.terminate()
    assert worker.wait_gone(30), worker.output()
    wait_until(lambda: not running(pid), 20, "the server the worker started to be stopped with it")
    assert "stopped 1 MCP server(s) this worker had started" in worker.output()


# --- in one process: what a slot's call finds -------------------------------------------------------


def test_a_server_killed_between_calls_is_started_again_by_the_next_call(cli, tmp_path):
    server = StartedWarehouse(tmp_path / "local").add(cli)
    assert not run(LOOKUP, {"sku": "SKU-1"}).is_error
    first = server.pids()[-1]
    assert running(first) and mcp.open_sessions() == 1
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: not running(first), 30, "the server to die")

    outcome = run(LOOKUP, {"sku": "SKU-3"})
    assert not outcome.is_error, outcome.content
    assert '"on_hand": 250' in outcome.content
    again = server.pids()[-1]
    assert again != first and running(again)
    assert not run(LOOKUP, {"sku": "SKU-2"}).is_error and server.pids()[-1] == again  # kept again


def test_a_call_sent_when_its_server_dies_is_not_sent_again_and_the_next_call_works(app, cli, tmp_path):
    server = StartedWarehouse(tmp_path / "local").add(cli)
    server.hold.touch()

    def slot_calls(name: str, arguments: dict):
        with app.app_context():  # a session of its own, as each worker slot has
            return run(name, arguments)

    with ThreadPoolExecutor(1) as slot:
        reserving = slot.submit(slot_calls, RESERVE, {"sku": "SKU-3", "quantity": 5})
        wait_until(lambda: server.received() == 1, 60, "the call to reach the server")
        os.kill(server.pids()[-1], signal.SIGKILL)
        outcome = reserving.result(timeout=60)
    assert outcome.is_error
    assert "The MCP server local stopped answering after reserve_stock was sent" in outcome.content
    assert "its process exited or closed its output" in outcome.content
    assert "It was not sent again" in outcome.content
    assert server.received() == 1  # sent once: never to the server started after

    server.hold.unlink()
    assert not run(LOOKUP, {"sku": "SKU-1"}).is_error
    reserved = run(RESERVE, {"sku": "SKU-1", "quantity": 2})
    assert not reserved.is_error and "Reserved 2 of SKU-1." in reserved.content
    assert server.reserved() == [{"sku": "SKU-1", "quantity": 2}]


def test_slots_calling_one_server_at_once_share_its_session(cli, tmp_path):
    server = StartedWarehouse(tmp_path / "local").add(cli)
    registry, call = services().tools_for(db.session, acme()), context(acme())
    lookup, reserve = registry.get(LOOKUP), registry.get(RESERVE)
    db.session.remove()  # the tools are called as a slot's MCP client calls them, outside any transaction
    assert "on_hand" in str(lookup.execute({"sku": "SKU-1"}, call))
    live = server.pids()[-1]
    server.hold.touch()

    with ThreadPoolExecutor(2) as slots:
        reserving = slots.submit(reserve.execute, {"sku": "SKU-3", "quantity": 1}, call)
        wait_until(lambda: server.received() == 1, 60, "the first call to reach the server")
        # The first call waits inside the server; the second goes over the same session meanwhile.
        looking = slots.submit(lookup.execute, {"sku": "SKU-3"}, call)
        assert '"on_hand": 250' in str(looking.result(timeout=60))
        assert not reserving.done()
        server.hold.unlink()
        assert "Reserved 1 of SKU-3." in str(reserving.result(timeout=60))
    assert server.pids()[-1] == live and running(live)


def test_a_changed_server_gets_a_new_session_and_the_old_one_is_closed(cli, tmp_path):
    server = StartedWarehouse(tmp_path / "local").add(cli)
    assert not run(LOOKUP, {"sku": "SKU-1"}).is_error
    first = server.pids()[-1]

    synced = cli("mcp", "sync", "local", "--tenant", "acme")  # a new version of the server's row
    assert synced.exit_code == 0, synced.output
    assert not run(LOOKUP, {"sku": "SKU-1"}).is_error
    second = server.pids()[-1]
    assert second != first and running(second)
    wait_until(lambda: not running(first), 30, "the old session's server to be stopped")

    # Another command under the same name (removed and added again by the operator).
    assert cli("mcp", "remove", "local", "--tenant", "acme").exit_code == 0
    other = StartedWarehouse(tmp_path / "other").add(cli)
    assert not run(LOOKUP, {"sku": "SKU-1"}).is_error
    third = other.pids()[-1]
    assert running(third) and server.pids()[-1] == second
    wait_until(lambda: not running(second), 30, "the old command's server to be stopped")
    wait_until(lambda: mcp.open_sessions() == 1, 30, "the old command's session to end")


@pytest.mark.parametrize("env", [{"MCP_TIMEOUT_SECONDS": "10"}], indirect=True)
def test_a_server_that_did_not_answer_in_time_is_started_afresh_for_the_next_call(cli, tmp_path):
    server = StartedWarehouse(tmp_path / "local").add(cli)
    server.hold.touch()  # reserve_stock never answers
    outcome = run(RESERVE, {"sku": "SKU-3", "quantity": 1})
    assert outcome.is_error
    assert "stopped answering after reserve_stock was sent (it did not answer in time)" in outcome.content
    stuck = server.pids()[-1]
    wait_until(lambda: not running(stuck), 30, "the server that did not answer to be stopped")

    server.hold.unlink()
    assert not run(LOOKUP, {"sku": "SKU-1"}).is_error
    assert server.pids()[-1] != stuck and server.received() == 1


@pytest.mark.parametrize("env", [{"MCP_IDLE_SECONDS": "1"}], indirect=True)
def test_a_server_idle_for_mcp_idle_seconds_is_stopped_and_the_next_call_starts_it(cli, tmp_path):
    server = StartedWarehouse(tmp_path / "local").add(cli)
    assert not run(LOOKUP, {"sku": "SKU-1"}).is_error
    first = server.pids()[-1]
    wait_until(lambda: not running(first), 30, "the idle server to be stopped")
    wait_until(lambda: mcp.open_sessions() == 0, 30, "its session to end")
    assert not run(LOOKUP, {"sku": "SKU-1"}).is_error
    assert server.pids()[-1] != first


@pytest.mark.parametrize("env", [{"MCP_IDLE_SECONDS": "0"}], indirect=True)
def test_with_mcp_idle_seconds_0_every_call_starts_the_server_and_stops_it(cli, tmp_path):
    server = StartedWarehouse(tmp_path / "local").add(cli)
    listed_by_the_add = len(server.pids())
    for _ in range(2):
        assert not run(LOOKUP, {"sku": "SKU-1"}).is_error
        assert not running(server.pids()[-1])  # stopped with its call
    assert len(server.pids()) == listed_by_the_add + 2 and mcp.open_sessions() == 0


def test_a_forked_process_starts_with_no_sessions_of_its_parent(cli, tmp_path):
    server = StartedWarehouse(tmp_path / "local").add(cli)
    tool, call = services().tools_for(db.session, acme()).get(LOOKUP), context(acme())
    assert not run(LOOKUP, {"sku": "SKU-1"}).is_error
    parents = server.pids()[-1]
    seen = tmp_path / "seen-by-the-child.json"

    child = os.fork()
    if child == 0:  # the child: what it holds, then a call of its own, then its servers stopped
        code = 1
        try:
            before = mcp.open_sessions()
            result = tool.execute({"sku": "SKU-3"}, call)
            seen.write_text(json.dumps({"sessions": before, "result": str(result)}))
            mcp.close_sessions()
            code = 0
        finally:
            os._exit(code)
    wait_until(lambda: os.waitpid(child, os.WNOHANG)[0] == child, 60, "the forked process to end")
    told = json.loads(seen.read_text())
    assert told["sessions"] == 0
    assert '"on_hand": 250' in told["result"]
    childs = server.pids()[-1]
    assert childs != parents and not running(childs)  # its own server, stopped with it

    assert running(parents)  # the parent's session is untouched: its next call starts nothing
    assert not run(LOOKUP, {"sku": "SKU-2"}).is_error
    assert server.pids()[-1] == childs


def test_a_stopping_worker_starts_no_server_for_a_move_still_running(cli, tmp_path):
    server = StartedWarehouse(tmp_path / "local").add(cli)
    tool, call = services().tools_for(db.session, acme()).get(LOOKUP), context(acme())
    listed_by_the_add = len(server.pids())
    seen = tmp_path / "seen-by-the-child.json"

    child = os.fork()  # a process of its own: stopping is for good
    if child == 0:
        code = 1
        try:
            mcp.close_sessions(stopping=True)  # what the worker's shutdown does
            try:
                tool.execute({"sku": "SKU-1"}, call)
                said = "it ran"
            except ToolError as exc:
                said = str(exc)
            seen.write_text(json.dumps(said))
            code = 0
        finally:
            os._exit(code)
    wait_until(lambda: os.waitpid(child, os.WNOHANG)[0] == child, 60, "the forked process to end")
    said = json.loads(seen.read_text())
    assert said.startswith("This worker process is stopping, so it did not start the MCP server local")
    assert "nothing was sent" in said
    assert len(server.pids()) == listed_by_the_add
