"""Ask the approval desk before an agent runs a sensitive tool: a small client for agents that run
outside the desk (LangGraph graphs, OpenAI Agents SDK apps, Claude Agent SDK apps, plain loops).

    from desk_client import Desk

    desk = Desk("https://desk.example.com", token="...", source="treasury-bot")
    decision = desk.ask("transfer", {"amount_cents": 30000, "account": "ACME-17"},
                        context="Supplier invoice 88 is due today.", facts={"Balance": "$12,000.00"})
    if decision.approved:
        receipt = transfer(**decision.input)          # the arguments a reviewer may have edited
        desk.report(decision, ok=True, summary=f"Sent {receipt.amount} to ACME-17.", output=receipt.as_dict())
    else:
        print(decision.status, decision.reason)        # rejected, expired or cancelled: do not run it

`ask` sends POST /api/calls and then waits (GET /api/calls/<id>?wait=60, again and again) until a
person decides, or `timeout` seconds pass (then the decision is "waiting"). Give the same
`idempotency_key` again (say, your graph's thread id and the tool call's id) and a restarted agent
gets the same call back instead of asking twice. `AsyncDesk` has the same methods as coroutines.

It needs nothing beyond Python's standard library, and it imports nothing of the desk: copy this file
into a project, or install the desk's package and import it.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AsyncDesk", "Decision", "Desk", "DeskError"]

LONGEST_WAIT = 60  # seconds the desk holds one GET ?wait= open


class DeskError(Exception):
    """The desk refused a request: `status` (HTTP), `code` (stable, e.g. "invalid_input"), `message` in
    words, and `fields` naming what to change."""

    def __init__(self, status: int, code: str, message: str, fields: list | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.fields = status, code, message, fields or []


@dataclass(frozen=True)
class Decision:
    """A call as the desk decided it (or as it stands, while it waits)."""

    id: int
    status: str  # waiting | approved | rejected | expired | cancelled
    input: dict  # the arguments to run with: a reviewer's edit, if one was made
    asked_input: dict  # the arguments the agent asked for
    edited: bool
    reason: str | None
    decided_by: str | None
    raw: dict = field(repr=False, default_factory=dict)  # the whole answer (see the desk's API document)

    @property
    def approved(self) -> bool:
        """Run it (with `input`), then report what happened."""
        return self.status == "approved"

    @property
    def waiting(self) -> bool:
        return self.status == "waiting"

    @classmethod
    def of(cls, body: dict) -> Decision:
        return cls(
            id=body["id"],
            status=body["status"],
            input=body["input"],
            asked_input=body.get("asked_input", body["input"]),
            edited=body.get("edited", False),
            reason=body.get("reason"),
            decided_by=body.get("decided_by"),
            raw=body,
        )


class Desk:
    """The desk at `url`, asked with an API token of a person with the agent role, as `source` (the
    agent's name reviewers see)."""

    def __init__(self, url: str, token: str, source: str, *, request_timeout: float = LONGEST_WAIT + 15) -> None:
        self.url, self.token, self.source = url.rstrip("/"), token, source
        self.request_timeout = request_timeout

    def ask(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        context: str,
        facts: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        timeout: float | None = None,
    ) -> Decision:
        """Ask about a call of a declared tool and wait for the decision (for ever, unless `timeout`
        seconds: then as it stands). Approved at once when its policy lets it run."""
        body = {
            "source": self.source,
            "tool": tool,
            "input": dict(arguments),
            "context": context,
            "facts": [{"label": label, "value": str(value)} for label, value in (facts or {}).items()] or None,
            "idempotency_key": idempotency_key or str(uuid.uuid4()),
        }
        decision = Decision.of(self._request("POST", "/api/calls", body))
        return self.wait(decision, timeout)

    def wait(self, decision: Decision | int, timeout: float | None = None) -> Decision:
        """The call once decided (or as it stands after `timeout` seconds)."""
        call_id = decision if isinstance(decision, int) else decision.id
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = LONGEST_WAIT if deadline is None else max(0, min(LONGEST_WAIT, int(deadline - time.monotonic())))
            current = Decision.of(self._request("GET", f"/api/calls/{call_id}?wait={left}"))
            if not current.waiting or left == 0:
                return current

    def get(self, call_id: int) -> Decision:
        return Decision.of(self._request("GET", f"/api/calls/{call_id}"))

    def report(self, decision: Decision | int, *, ok: bool, summary: str, output: Any = None) -> Decision:
        """Tell the desk what running an approved call did (reviewers and the audit log read it)."""
        call_id = decision if isinstance(decision, int) else decision.id
        body = {"ok": ok, "summary": summary, "output": output}
        return Decision.of(self._request("POST", f"/api/calls/{call_id}/outcome", body))

    def cancel(self, decision: Decision | int, reason: str = "") -> Decision:
        """Give up a call that still waits (it leaves the reviewers' inbox)."""
        call_id = decision if isinstance(decision, int) else decision.id
        return Decision.of(self._request("POST", f"/api/calls/{call_id}/cancel", {"reason": reason or None}))

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.request_timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                refused = json.loads(exc.read())
            except ValueError:
                refused = {}
            raise DeskError(
                exc.code, refused.get("error", "http_error"), refused.get("message", str(exc)), refused.get("fields")
            ) from None


class AsyncDesk:
    """Desk's methods as coroutines (each request runs in a thread, so the event loop never blocks)."""

    def __init__(self, url: str, token: str, source: str, **options: Any) -> None:
        self.desk = Desk(url, token, source, **options)

    async def ask(self, tool: str, arguments: Mapping[str, Any], **options: Any) -> Decision:
        return await asyncio.to_thread(self.desk.ask, tool, arguments, **options)

    async def wait(self, decision: Decision | int, timeout: float | None = None) -> Decision:
        return await asyncio.to_thread(self.desk.wait, decision, timeout)

    async def get(self, call_id: int) -> Decision:
        return await asyncio.to_thread(self.desk.get, call_id)

    async def report(self, decision: Decision | int, **outcome: Any) -> Decision:
        return await asyncio.to_thread(self.desk.report, decision, **outcome)

    async def cancel(self, decision: Decision | int, reason: str = "") -> Decision:
        return await asyncio.to_thread(self.desk.cancel, decision, reason)
