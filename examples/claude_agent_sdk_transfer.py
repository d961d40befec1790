"""A Claude Agent SDK agent whose tool permissions are decided on the approval desk.

The SDK asks its `can_use_tool` callback before every tool call. `desk_permissions` answers for the
tools you name (each mapped to a tool declared on the desk): it asks the desk (POST /api/calls), waits
for the reviewers, and allows the call with the arguments they approved (`updated_input`: an edit
included) or denies it with their reason, which the model reads. Other tools are left to the SDK's
own permission rules (allowed here, as the example's tools are).

    pip install claude-agent-sdk     # and the desk's desk_client.py (standard library only)
    python examples/claude_agent_sdk_transfer.py --desk http://127.0.0.1:5000 --token "$DESK_TOKEN" \
        --request "Pay supplier ACME-17 $300 for invoice 88"

The transfer tool is an in-process MCP tool of the SDK (`mcp__treasury__transfer`); the desk must know
it as `transfer` first (see examples/langgraph_transfer.py for the PUT an admin sends).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from typing import Any

from claude_agent_sdk import (
    ClaudeAgentOptions,
    ClaudeSDKClient,
    PermissionResultAllow,
    PermissionResultDeny,
    ToolPermissionContext,
    create_sdk_mcp_server,
    tool,
)

from desk_client import AsyncDesk


def desk_permissions(desk: AsyncDesk, gated: dict[str, str], context: str):
    """A `can_use_tool` callback: the SDK's tool names in `gated` (to the desk's declared tool names)
    wait for the desk's decision; the rest are allowed. `context`: what reviewers should know."""

    async def can_use_tool(
        tool_name: str, input_data: dict[str, Any], permission: ToolPermissionContext
    ) -> PermissionResultAllow | PermissionResultDeny:
        declared = gated.get(tool_name)
        if declared is None:
            return PermissionResultAllow()
        decision = await desk.ask(
            declared,
            input_data,
            context=context,
            idempotency_key=permission.tool_use_id or str(uuid.uuid4()),  # the same tool use: the same call
        )
        if decision.approved:
            return PermissionResultAllow(updated_input=decision.input)
        return PermissionResultDeny(message=f"The approval desk said {decision.status}: {decision.reason}")

    return can_use_tool


@tool(
    "transfer",
    "Send money from the treasury account to a supplier's account.",
    {
        "amount_cents": int,
        "account": str,
        "memo": str,
    },
)
async def transfer(arguments: dict[str, Any]) -> dict[str, Any]:
    sent = f"Sent ${arguments['amount_cents'] / 100:,.2f} to {arguments['account']}."
    return {"content": [{"type": "text", "text": sent}]}


async def run(desk: AsyncDesk, request: str) -> list[str]:
    options = ClaudeAgentOptions(
        mcp_servers={"treasury": create_sdk_mcp_server("treasury", tools=[transfer])},
        can_use_tool=desk_permissions(desk, {"mcp__treasury__transfer": "transfer"}, request),
    )
    said = []
    async with ClaudeSDKClient(options=options) as client:
        await client.query(request)
        async for message in client.receive_response():
            said.append(str(message))
    return said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--desk", required=True)
    parser.add_argument("--token", required=True, help="an API token of a person with the agent role")
    parser.add_argument("--request", required=True)
    args = parser.parse_args(argv)
    said = asyncio.run(run(AsyncDesk(args.desk, args.token, source="treasury-claude-agent"), args.request))
    print(json.dumps(said))
    return 0


if __name__ == "__main__":
    sys.exit(main())
