"""An MCP server's tool as a desk `Tool`: offered to the model, gated like any other, called on its server."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from webapp import audit_chain
from webapp.models import McpTool
from webapp.tools import presenting
from webapp.tools.described import DescribedTool, money_in_cents
from webapp.tools.mcp.base import ERROR_CHARS, Lost, McpError, SecretRefused, Unreachable
from webapp.tools.mcp.guard import hold_changed, read_only_and_destructive
from webapp.tools.mcp.mapping import FACTS_SECONDS, facts_of
from webapp.tools.mcp.sessions import fingerprint, list_all_tools, plain_tool, run_on_server
from webapp.tools.mcp.transport import Access
from webapp.tools.registry import (
    Fact,
    Record,
    Review,
    ToolContext,
    ToolError,
    wrap_output,
)

if TYPE_CHECKING:  # the SDK is imported where a server is reached: it costs every process a second to load
    from mcp.client.client import Client


def _record_at_call(context: ToolContext, action: str, **fields: Any) -> None:
    """Audit what a call found before it sent anything (on the tenant's chain, as at call time)."""
    audit_chain.record(
        context.session,
        action,
        tenant_id=context.tenant_id,
        actor_label="call time",
        tool_call_id=context.tool_call_id,
        **fields,
    )


class _SecretRefusedAtCall(ToolError):
    """A call refused because its server's header names a secret not granted to the tenant: nothing
    was sent, and the refusal is audited (`mcp_secret_refused`) though the call's writes are undone."""

    def __init__(self, refused: SecretRefused) -> None:
        super().__init__(str(refused))
        self.refused = refused

    def record(self, context: ToolContext) -> None:
        _record_at_call(context, "mcp_secret_refused", data=self.refused.audit_data("call"))


class _Changed(ToolError):
    """The server's listing no longer matches the accepted definition (found just before a call):
    nothing was sent, and the tool is held at once (no longer offered, its waiting calls not
    approvable) although the call's own writes are undone. `listed`: the tool as listed now."""

    def __init__(self, message: str, tool: McpRemoteTool, listed: dict) -> None:
        super().__init__(message)
        self.tool, self.listed = tool, listed

    def record(self, context: ToolContext) -> None:
        if hold_changed(context.session, context.tenant_id, self.tool.name, self.listed):
            _record_at_call(context, "mcp_tool_held", tool_name=self.tool.name, data={"server": self.tool.server})


class McpRemoteTool(DescribedTool):
    """One tool of an MCP server as its tenant's registry holds it: the definition an admin accepted,
    run on the server through the MCP client."""

    writes_database = False  # it waits on its server: no transaction (nor SQLite's write lock) meanwhile

    def __init__(self, row: McpTool, access: Access, *, as_changed: bool = False) -> None:
        """The tool as an admin accepted it; `as_changed`: as its server describes it now (a held
        tool's change, to say what accepting it would change for the gate)."""
        self.access = access
        self.name = row.registry_name
        self.remote_name = row.remote_name
        self.server = access.server
        description = row.current_description if as_changed else row.description
        hints = (row.current_annotations if as_changed else row.annotations) or {}
        self.hints = hints
        self.title = f"{hints.get('title') or row.remote_name} ({access.server})"
        self.description = (
            f"{(description or '').strip() or row.remote_name} "
            f"(A tool of the MCP server {access.server}; its results are external data.)"
        )
        self.use_schema(row.current_input_schema if as_changed else row.input_schema)
        self._accepted = row.current_fingerprint if as_changed else row.fingerprint
        self.held = row.held and not as_changed
        self.read_only, self.destructive = read_only_and_destructive(hints)
        # Read-only tools run at once by default; every other waits, and so does any tool its server
        # says may destroy data (even one that also says it only reads).
        self.sensitive = not self.read_only or self.destructive
        self.repeatable = (self.read_only and not self.destructive) or hints.get("idempotentHint") is True
        self.mapping = row.mapping or {}
        self.companion: McpRemoteTool | None = None  # the read-only tool whose result is the facts (tenant_tools)

    # What an admin mapped of its arguments (set_mapping): the money, the subject, the facts.

    def moves_money(self) -> bool:
        return "amount" in self.mapping

    def amount(self, input: dict) -> int | None:  # noqa: A002
        mapped = self.mapping.get("amount")
        return money_in_cents(input.get(mapped["argument"]), mapped["unit"]) if mapped else None

    def money_argument(self) -> str | None:
        return (self.mapping.get("amount") or {}).get("argument")

    def reading(self) -> dict:
        return {"amount": self.mapping.get("amount"), "subject": self.mapping.get("subject")}

    def subject(self, input: dict, context: ToolContext) -> str | None:  # noqa: A002
        mapped = self.mapping.get("subject")
        value = input.get(mapped["argument"]) if mapped else None
        return f"{mapped['argument']}:{value}"[:200] if value not in (None, "") else None

    def review(self, input: dict, context: ToolContext) -> Review:  # noqa: A002
        """The facts an admin mapped: the live result of a read-only tool of the same server, called with
        arguments taken from this call's (none mapped: no facts)."""
        facts = self.mapping.get("facts")
        if not facts:
            return Review()
        title = f"{facts['tool']} ({self.server}), read now"
        companion = self.companion
        if companion is None or companion.unavailable() or not companion.read_only or companion.destructive:
            why = "it is no longer a read-only tool of this server that the desk may call; an admin must map it again"
            return Review(records=(Record("facts", 0, title, (Fact("Not read", f"{facts['tool']}: {why}."),)),))
        arguments = {theirs: input[ours] for theirs, ours in facts["arguments"].items() if ours in input}
        try:
            result = companion.read(arguments)
        except (ToolError, McpError) as exc:
            return Review(records=(Record("facts", 0, title, (Fact("Not read", presenting.shorten(str(exc), 500)),)),))
        return Review(records=(Record("facts", 0, title, tuple(facts_of(result))),))

    def read(self, arguments: dict) -> Any:
        """Call this read-only tool for a reviewer's facts: once, within a short time, its result as
        data. ToolError or McpError say why not."""
        quick = replace(self.access, timeout=min(self.access.timeout, FACTS_SECONDS), tries=1)
        try:
            result = run_on_server(quick, lambda client, sent: self._call(client, arguments, sent))
        except (Unreachable, Lost) as exc:
            raise McpError(f"The MCP server {self.server} could not be read ({exc}).") from None
        return self._output(result)

    def unavailable(self) -> str | None:
        if self.held:
            return (
                f"The tool {self.name} is held: its MCP server ({self.server}) changed what it says it does since "
                "an admin accepted it, and an admin has to look at the change first. It was not called."
            )
        return None

    def execute(self, input: dict, context: ToolContext) -> Any:  # noqa: A002 - the API's word
        tries, wait, last = self.access.tries, self.access.retry_seconds, ""
        for attempt in range(1, tries + 1):
            try:
                result = run_on_server(self.access, lambda client, sent: self._call(client, input, sent), live=True)
            except McpError as exc:
                raise (_SecretRefusedAtCall(exc) if isinstance(exc, SecretRefused) else ToolError(str(exc))) from None
            except Unreachable as exc:
                last = str(exc)
            except Lost as exc:
                if not self.repeatable:
                    raise ToolError(
                        f"The MCP server {self.server} stopped answering after {self.remote_name} was sent "
                        f"({exc}), so it may or may not have taken effect. It was not sent again: the server does "
                        "not mark this tool safe to repeat. Check before asking for it again."
                    ) from None
                last = str(exc)
            else:
                return self._output(result)
            if attempt < tries:
                time.sleep(wait)
                wait *= 2
        raise ToolError(
            f"The MCP server {self.server} could not be reached after {tries} tries ({last}); nothing was done. "
            "It may be down: try again later."
        )

    async def _call(self, client: Client, arguments: dict, sent: list) -> Any:
        """Compare the server's listing with the accepted definition, then call (never when it changed)."""
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        listed = next((t for t in await list_all_tools(client) if t.name == self.remote_name), None)
        if listed is None:
            raise ToolError(f"The MCP server {self.server} no longer offers {self.remote_name}; nothing was done.")
        now = plain_tool(listed)
        if fingerprint(now["description"], now["input_schema"], now["annotations"]) != self._accepted:
            raise _Changed(
                f"The MCP server {self.server} changed {self.remote_name} (its description, schema or hints) since "
                "an admin accepted it, so it was not called, and the tool is held until an admin accepts the "
                "change on the MCP servers page.",
                self,
                now,
            )
        sent.append(True)
        try:
            return await client.call_tool(self.remote_name, arguments)
        except MCPError as exc:
            if exc.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):  # no answer: the call is lost, not refused
                raise
            # the server refused the request itself (an unknown tool, bad arguments)
            raise ToolError(self._fenced(f"The MCP server {self.server} refused the call:", str(exc))) from None

    def _output(self, result: Any) -> Any:
        text = "\n".join(
            block.text if getattr(block, "type", None) == "text" else f"[{getattr(block, 'type', 'other')} content]"
            for block in result.content
        )
        if result.is_error:
            raise ToolError(self._fenced(f"The MCP server {self.server} reported an error:", text or "(no details)"))
        return result.structured_content if result.structured_content is not None else text

    def _fenced(self, sentence: str, text: str) -> str:
        return f"{sentence}\n{wrap_output(self.name, text, ERROR_CHARS)}"
