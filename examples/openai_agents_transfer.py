"""An OpenAI Agents SDK agent whose `needs_approval` tool is decided on the approval desk.

The `transfer` tool is declared with `needs_approval=True`, so a run stops with an interruption before
it runs. This program answers each interruption with the desk (POST /api/calls, then wait for the
reviewers), approves or rejects it in the run's state (`state.approve` / `state.reject`, the reason
going back to the model), and runs on. The SDK's approval carries no arguments, so the decision is
kept in the run's context by the tool call's id, and the tool runs with the arguments the reviewers
approved (an edit included), then tells the desk what it did.

    pip install openai-agents        # and the desk's desk_client.py (standard library only)
    python examples/openai_agents_transfer.py --desk http://127.0.0.1:5000 --token "$DESK_TOKEN" \
        --request "Pay supplier ACME-17 $300 for invoice 88" --ledger /tmp/ledger.jsonl

`--scripted` answers with a scripted model (no OpenAI key, no network: what the tests run); without
it the agent uses the SDK's default OpenAI model, and OPENAI_API_KEY. The desk must know the tool
first: see examples/langgraph_transfer.py for the PUT /api/external-tools/transfer an admin sends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from dataclasses import dataclass, field

from agents import Agent, ModelResponse, Runner, Usage, function_tool
from agents.models.interface import Model
from agents.tool_context import ToolContext
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from desk_client import AsyncDesk, Decision


@dataclass
class DeskRun:
    """The run's context: the ledger, and the desk's decisions by tool call id."""

    ledger: str
    decisions: dict[str, Decision] = field(default_factory=dict)
    sent: list[dict] = field(default_factory=list)


@function_tool(needs_approval=True)
def transfer(ctx: ToolContext[DeskRun], amount_cents: int, account: str, memo: str) -> str:
    """Send money from the treasury account to a supplier's account.

    Args:
        amount_cents: How much, in cents.
        account: The supplier's account, e.g. ACME-17.
        memo: What the payment is for.
    """
    decision = ctx.context.decisions.get(ctx.tool_call_id)
    arguments = decision.input if decision else {"amount_cents": amount_cents, "account": account, "memo": memo}
    with open(ctx.context.ledger, "a") as book:  # the side effect: money leaves, once
        book.write(json.dumps(arguments) + "\n")
    ctx.context.sent.append(arguments)
    return f"Sent ${arguments['amount_cents'] / 100:,.2f} to {arguments['account']}."


async def answer_with_desk(agent: Agent, desk: AsyncDesk, request: str, run: DeskRun, thread: str):
    """Run the agent; each interruption is asked about on the desk and approved or rejected as decided."""
    result = await Runner.run(agent, request, context=run)
    while result.interruptions:
        state = result.to_state()
        for item in result.interruptions:
            decision = await desk.ask(
                item.name,
                json.loads(item.arguments or "{}"),
                context=request,
                idempotency_key=f"{thread}:{item.call_id}",  # a restarted agent gets the same call back
            )
            run.decisions[item.call_id] = decision
            if decision.approved:
                state.approve(item)
            else:
                state.reject(item, rejection_message=f"The desk said {decision.status}: {decision.reason}")
        result = await Runner.run(agent, state, context=run)
    return result


class ScriptedModel(Model):
    """A model that asks for the transfer the request names, then says what happened (no network)."""

    async def get_response(
        self,
        system_instructions,
        input,
        model_settings,
        tools,
        output_schema,
        handoffs,
        tracing,
        *,
        previous_response_id=None,
        conversation_id=None,
        prompt=None,
    ):
        outputs = [item for item in input if isinstance(item, dict) and item.get("type") == "function_call_output"]
        if outputs:  # the tool ran (or was refused): say so
            text = ResponseOutputText(type="output_text", text=str(outputs[-1].get("output")), annotations=[])
            message = ResponseOutputMessage(
                id="msg_2", type="message", role="assistant", status="completed", content=[text]
            )
            return ModelResponse(output=[message], usage=Usage(), response_id=None)
        request = input if isinstance(input, str) else json.dumps(input)
        dollars = re.search(r"\$(\d+(?:\.\d{2})?)", request)
        account = re.search(r"\b([A-Z]+-\d+)\b", request)
        arguments = {
            "amount_cents": round(float(dollars.group(1)) * 100) if dollars else 0,
            "account": account.group(1) if account else "unknown",
            "memo": "invoice 88",
        }
        call = ResponseFunctionToolCall(
            type="function_call",
            id="fc_1",
            call_id="call_1",
            name="transfer",
            arguments=json.dumps(arguments),
            status="completed",
        )
        return ModelResponse(output=[call], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the scripted model does not stream")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--desk", required=True)
    parser.add_argument("--token", required=True, help="an API token of a person with the agent role")
    parser.add_argument("--request", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--thread", default="agents-sdk-1")
    parser.add_argument("--scripted", action="store_true", help="a scripted model instead of OpenAI's")
    args = parser.parse_args(argv)

    agent = Agent(
        name="Treasury",
        instructions="Pay suppliers as asked, with the transfer tool.",
        tools=[transfer],
        model=ScriptedModel() if args.scripted else None,
    )
    desk = AsyncDesk(args.desk, args.token, source="treasury-agents-sdk")
    run = DeskRun(ledger=args.ledger)
    result = asyncio.run(answer_with_desk(agent, desk, args.request, run, args.thread))
    decision = next(iter(run.decisions.values()), None)
    if decision is not None and run.sent:
        sent = run.sent[-1]
        asyncio.run(
            desk.report(decision, ok=True, summary=f"Sent ${sent['amount_cents'] / 100:,.2f} to {sent['account']}.")
        )
    print(
        json.dumps(
            {
                "decision": decision.raw if decision else None,
                "sent": run.sent[-1] if run.sent else None,
                "final_output": str(result.final_output),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
