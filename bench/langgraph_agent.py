"""The same scripted agent twice, timed per step in-process: once in LangGraph 1.x with its SQLite
checkpointer, once as the desk's moves (advance()), so the benchmark can say what a durable step
costs in each.

The script, on both sides: the model asks for customer 4471's invoices (lookup_invoices), the tool
answers, the model asks to refund $60 on the paid invoice (issue_refund, above the $50 gate), the
refund waits for a person's approval, is approved, runs, and the model answers in words. That is
three model steps, two tool steps and one step that parks for the approval.

LangGraph (`pip install -e '.[bench]'`; without it the part says so and is skipped):

- a `model` node: a deterministic fake model in plain Python (no LangChain, no network) returning
  that sequence from the messages it is given;
- a `tools` node: runs the calls of the last model message; a refund above $50 calls interrupt()
  and goes on once resumed with Command(resume="approve");
- SqliteSaver on a file (WAL, and synchronous=NORMAL like the desk's SQLite), durability="sync":
  every step's checkpoint is written before the next step starts.

Timed two ways: "one invoke per step" (interrupt_after every node, so each step is its own call that
loads the thread's latest checkpoint, runs one node and writes a checkpoint: what a worker picking up
a thread for one step would do, like a desk move), and "one stream per run" (a stream() call runs
steps back to back with the state in memory, one checkpoint written per step; a step is the time
between two updates).

The desk: advance() on its database (SQLite or PostgreSQL), move after move, with the real SDK over
the in-process demo model, the real tools on the billing tables, the audit chain; the approval is
recorded with the agent's decisions.decide() and a commit (timed apart: it is not a move).
"""

from __future__ import annotations

import json
import operator
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Annotated, TypedDict

from sqlalchemy import select

from bench.common import stats

SCRIPT = "Refund $60 to customer 4471 for the late delivery"  # the demo model: lookup, refund (waits), answer
WARM_UP_RUNS = 3  # the first runs warm caches and connections on both sides; not counted


def available() -> str | None:
    """None when LangGraph and its SQLite checkpointer import, else why not."""
    try:
        import langgraph  # noqa: F401
        from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: F401
    except ImportError as error:
        return f"{error.name or error} is not installed (pip install -e '.[bench]')"
    return None


def versions() -> dict:
    from importlib.metadata import version

    return {name: version(name) for name in ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite")}


# --- the LangGraph agent ----------------------------------------------------------------------------


class State(TypedDict):
    messages: Annotated[list[dict], operator.add]


INVOICES = [
    {"id": 4470, "amount_cents": 2500, "status": "open"},
    {"id": 4471, "amount_cents": 12000, "refunded_cents": 0, "status": "paid"},
]


def fake_model(state: State) -> dict:
    """Deterministic: ask for the invoices, then refund $60 on the paid one, then answer."""
    results = [m for m in state["messages"] if m["role"] == "tool"]
    if not results:
        reply = {
            "role": "assistant",
            "content": "I'll look up customer 4471's invoices first, to find what to refund.",
            "tool_calls": [{"id": "call_1", "name": "lookup_invoices", "args": {"customer_id": 4471}}],
        }
    elif len(results) == 1:
        invoices = json.loads(results[0]["content"])["invoices"]
        paid = next(inv for inv in invoices if inv["status"] == "paid")
        reply = {
            "role": "assistant",
            "content": f"Invoice {paid['id']} is paid, so I'll refund $60.00 on it.",
            "tool_calls": [
                {
                    "id": "call_2",
                    "name": "issue_refund",
                    "args": {"invoice_id": paid["id"], "amount_cents": 6000, "reason": "late delivery"},
                }
            ],
        }
    else:
        refund = json.loads(results[-1]["content"])
        reply = {"role": "assistant", "content": f"Refund {refund['refund_id']} of $60.00 issued.", "tool_calls": []}
    return {"messages": [reply]}


def tools(state: State) -> dict:
    """Run the last model message's calls; a refund above $50 waits for a person (interrupt())."""
    from langgraph.types import interrupt

    out = []
    for call in state["messages"][-1]["tool_calls"]:
        args = call["args"]
        if call["name"] == "lookup_invoices":
            content = {"customer_id": args["customer_id"], "invoices": INVOICES}
        elif call["name"] == "issue_refund":
            decision = "approve"
            if args["amount_cents"] > 5000:
                decision = interrupt({"tool": call["name"], "input": args})
            if decision == "approve":
                content = {"refund_id": f"re_{call['id']}", "invoice_id": args["invoice_id"], **args}
            else:
                content = {"error": f"Declined by a person: {decision}"}
        else:
            content = {"error": f"unknown tool {call['name']}"}
        out.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(content)})
    return {"messages": out}


def _route(state: State) -> str:
    from langgraph.graph import END

    return "tools" if state["messages"][-1].get("tool_calls") else END


def build(checkpointer):
    from langgraph.graph import START, StateGraph

    graph = StateGraph(State)
    graph.add_node("model", fake_model)
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", _route, ["tools", "__end__"])
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=checkpointer)


def _kind(chunk: dict) -> str:
    if "__interrupt__" in chunk:
        return "park"
    [node] = chunk
    return {"model": "model", "tools": "tool"}[node]


def measure_langgraph(runs: int) -> dict:
    """Per-step times of the script in LangGraph, both ways (see the module docstring)."""
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.types import Command

    samples = {mode: {"model": [], "tool": [], "park": []} for mode in ("step", "stream")}
    with tempfile.TemporaryDirectory(prefix="bench-langgraph-") as tmp:
        connection = sqlite3.connect(Path(tmp) / "checkpoints.db", check_same_thread=False)
        try:
            saver = SqliteSaver(connection)
            saver.setup()  # tables, and WAL
            connection.execute("PRAGMA synchronous=NORMAL")  # as the desk's SQLite
            graph = build(saver)
            for n in range(runs + WARM_UP_RUNS):
                counted = n >= WARM_UP_RUNS
                # One invoke per step: each call loads the checkpoint, runs one node, writes one.
                config = {"configurable": {"thread_id": f"step-{n}"}}
                pending = {"messages": [{"role": "user", "content": SCRIPT}]}
                steps = 0
                while True:
                    started = time.perf_counter()
                    chunks = list(
                        graph.stream(pending, config, stream_mode="updates", interrupt_after="*", durability="sync")
                    )
                    elapsed = (time.perf_counter() - started) * 1000
                    if sum("__interrupt__" not in c for c in chunks) > 1:
                        raise RuntimeError(f"expected one step per invoke, got {chunks}")
                    steps += 1
                    if counted:
                        samples["step"][_kind(chunks[0])].append(elapsed)
                    if "__interrupt__" in chunks[0]:
                        pending = Command(resume="approve")
                    elif graph.get_state(config).next:
                        pending = None  # go on from the checkpoint
                    else:
                        break
                _check(graph, config, steps)
                # One stream per run: steps back to back, a checkpoint written after each.
                config = {"configurable": {"thread_id": f"stream-{n}"}}
                for inp in ({"messages": [{"role": "user", "content": SCRIPT}]}, Command(resume="approve")):
                    last = time.perf_counter()
                    for chunk in graph.stream(inp, config, stream_mode="updates", durability="sync"):
                        now = time.perf_counter()
                        if counted:
                            samples["stream"][_kind(chunk)].append((now - last) * 1000)
                        last = now
                _check(graph, config, None)
        finally:
            connection.close()
    return {mode: _summary(by_kind) for mode, by_kind in samples.items()}


def _check(graph, config, steps: int | None) -> None:
    state = graph.get_state(config)
    last = state.values["messages"][-1]
    if state.next or last["role"] != "assistant" or "issued" not in last["content"]:
        raise RuntimeError(f"the LangGraph run did not finish as scripted: {state.next} {last}")
    if steps is not None and steps != 6:
        raise RuntimeError(f"the LangGraph run took {steps} steps, not 6")


def _summary(by_kind: dict[str, list[float]]) -> dict:
    return {
        "model steps": stats(by_kind["model"]),
        "tool steps": stats(by_kind["tool"]),
        "step that parks for the approval": stats(by_kind["park"]),
        "all steps": stats(by_kind["model"] + by_kind["tool"] + by_kind["park"]),
    }


# --- the desk -------------------------------------------------------------------------------------


def measure_desk(app, runs: int, new_conversations) -> dict:
    """The same script as the desk's moves: advance() in-process, move after move; the approval by
    decisions.decide() and a commit. `new_conversations(app, count, question)` makes queued ones."""
    from webapp.agent import decisions
    from webapp.agent.moves import advance
    from webapp.models import ModelCall, ToolCall, User
    from webapp.runtime.extensions import db
    from webapp.runtime.services import services

    kinds = {"generate": "model", "run_tool": "tool", "wait": "park"}
    samples: dict[str, list[float]] = {"model": [], "tool": [], "park": [], "sdk": [], "decision": []}
    made = new_conversations(app, runs + WARM_UP_RUNS, SCRIPT)
    with app.app_context():
        desk = services()
        reviewer = db.session.scalar(select(User).where(User.email == "reviewer@acme.test"))
        for n, (conversation_id, version) in enumerate(made):
            counted = n >= WARM_UP_RUNS
            seen = []
            while True:
                if version is None:  # parked: approve the waiting refund, as a reviewer would
                    call = db.session.scalar(
                        select(ToolCall).where(
                            ToolCall.conversation_id == conversation_id, ToolCall.status == "awaiting_approval"
                        )
                    )
                    if call is None:
                        break
                    started = time.perf_counter()
                    version = decisions.decide(
                        db.session, call, reviewer, approve=True, arguments_seen=decisions.arguments_hash(call.input)
                    )
                    db.session.commit()
                    if counted:
                        samples["decision"].append((time.perf_counter() - started) * 1000)
                    continue
                started = time.perf_counter()
                result = advance(
                    db.session, conversation_id, version, owner="bench", make_loop=desk.loop, lease_seconds=30
                )
                elapsed = (time.perf_counter() - started) * 1000
                seen.append(result.outcome)
                version = result.next_version
                if not counted:
                    continue
                samples[kinds[result.outcome]].append(elapsed)
                if result.outcome == "generate":
                    samples["sdk"].append(
                        db.session.scalar(
                            select(ModelCall.latency_ms)
                            .where(ModelCall.conversation_id == conversation_id)
                            .order_by(ModelCall.id.desc())
                            .limit(1)
                        )
                    )
            if seen != ["generate", "run_tool", "generate", "wait", "run_tool", "generate"]:
                raise RuntimeError(f"the desk's run did not follow the script: {seen}")
        db.session.remove()
    summary = _summary(samples)
    minus_sdk = [m - s for m, s in zip(samples["model"], samples["sdk"], strict=True)]
    summary["model steps minus the SDK call"] = stats(minus_sdk)
    summary["recording the approval (not a step)"] = stats(samples["decision"])
    return summary
