"""A LangGraph agent that asks the approval desk before it moves money.

The graph plans a transfer from a request, then its `transfer` node calls LangGraph's `interrupt()`
with the call it wants to make. This program answers each interrupt with the desk: it asks
(POST /api/calls), waits for the reviewers' decision, and resumes the graph with it
(`Command(resume=...)`). The node runs the transfer only when approved, with the arguments the
reviewers approved (an edit included), then tells the desk what it did.

    pip install langgraph        # and the desk's desk_client.py (standard library only)
    python examples/langgraph_transfer.py --desk http://127.0.0.1:5000 --token "$DESK_TOKEN" \
        --request "Pay supplier ACME-17 $300 for invoice 88" --ledger /tmp/ledger.jsonl

The desk must know the tool first (an admin, once):

    curl -X PUT http://127.0.0.1:5000/api/external-tools/transfer -H "Authorization: Bearer $ADMIN_TOKEN" \
        -H 'Content-Type: application/json' -d '{"description": "Send money to a supplier.",
        "input_schema": {"type": "object", "properties": {"amount_cents": {"type": "integer"},
        "account": {"type": "string"}, "memo": {"type": "string"}}, "required": ["amount_cents", "account"]},
        "amount": "amount_cents", "subject": "account"}'

It prints one JSON line: what was asked, what the desk decided and what was sent.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from desk_client import Desk


class State(TypedDict, total=False):
    request: str
    planned: dict
    decision: dict
    sent: dict | None


def plan(state: State) -> State:
    """What a model would decide from the request (kept plain here: an amount and an account)."""
    dollars = re.search(r"\$(\d+(?:\.\d{2})?)", state["request"])
    account = re.search(r"\b([A-Z]+-\d+)\b", state["request"])
    return {
        "planned": {
            "amount_cents": round(float(dollars.group(1)) * 100) if dollars else 0,
            "account": account.group(1) if account else "unknown",
            "memo": state["request"][:200],
        }
    }


def make_transfer_node(ledger: str):
    def transfer(state: State) -> State:
        # Pauses the graph; the answer is what the desk decided (see answer_with_desk below).
        decision = interrupt({"tool": "transfer", "input": state["planned"], "context": state["request"]})
        if decision["status"] != "approved":
            return {"decision": decision, "sent": None}
        sent = dict(decision["input"])  # the approved arguments: a reviewer may have changed them
        with open(ledger, "a") as book:  # the side effect: money leaves, once
            book.write(json.dumps(sent) + "\n")
        return {"decision": decision, "sent": sent}

    return transfer


def build(ledger: str):
    graph = StateGraph(State)
    graph.add_node("plan", plan)
    graph.add_node("transfer", make_transfer_node(ledger))
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "transfer")
    graph.add_edge("transfer", END)
    return graph.compile(checkpointer=InMemorySaver())


def answer_with_desk(graph, desk: Desk, thread: str, first_input: dict) -> dict:
    """Run the graph; each interrupt is a call to ask the desk about, and its decision resumes it."""
    config = {"configurable": {"thread_id": thread}}
    result: Any = graph.invoke(first_input, config)
    while result.get("__interrupt__"):
        (pending,) = result["__interrupt__"]
        asked = pending.value
        decision = desk.ask(
            asked["tool"],
            asked["input"],
            context=asked["context"],
            idempotency_key=f"{thread}:{pending.id}",  # a restarted agent gets the same call back
        )
        result = graph.invoke(
            Command(
                resume={
                    "id": decision.id,
                    "status": decision.status,
                    "input": decision.input,
                    "reason": decision.reason,
                }
            ),
            config,
        )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--desk", required=True, help="the desk's address, e.g. http://127.0.0.1:5000")
    parser.add_argument("--token", required=True, help="an API token of a person with the agent role")
    parser.add_argument("--request", required=True)
    parser.add_argument("--ledger", required=True, help="where transfers are written (one JSON line each)")
    parser.add_argument("--thread", default="transfer-1")
    args = parser.parse_args(argv)

    desk = Desk(args.desk, args.token, source="treasury-graph")
    result = answer_with_desk(build(args.ledger), desk, args.thread, {"request": args.request})
    decision, sent = result["decision"], result.get("sent")
    if sent is not None:
        desk.report(
            decision["id"],
            ok=True,
            summary=f"Sent ${sent['amount_cents'] / 100:,.2f} to {sent['account']}.",
            output=sent,
        )
    print(json.dumps({"asked": result["planned"], "decision": decision, "sent": sent}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
