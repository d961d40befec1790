"""The guard that holds a changed tool: a tool whose server lists it otherwise than an admin accepted
is held (not offered, its calls refused) until an admin accepts the change; and what its hints say."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from webapp.models import McpServer, McpTool, utcnow
from webapp.tools.described import schema_problem
from webapp.tools.mcp.base import McpError
from webapp.tools.mcp.sessions import fingerprint


def record_current(row: McpTool, remote: dict, current: str) -> None:
    """What the server says the tool is now; held when that is not what an admin accepted."""
    row.current_description = remote["description"]
    row.current_input_schema = remote["input_schema"]
    row.current_annotations = remote["annotations"]
    row.current_fingerprint = current
    row.held = current != row.fingerprint


def hold_changed(session: Session, tenant_id: int, registry_name: str, listed: dict) -> bool:
    """Hold the tool whose server lists it as `listed`, which no longer matches what an admin accepted
    (found by a call): it is not offered again, and its waiting calls cannot be approved, until an
    admin accepts the change. True when this held it (False: held already, or gone). The caller
    commits."""
    row = session.scalar(select(McpTool).where(McpTool.tenant_id == tenant_id, McpTool.registry_name == registry_name))
    if row is None:
        return False
    session.execute(select(McpServer.id).where(McpServer.id == row.server_id).with_for_update())  # one at a time
    session.refresh(row)
    was_held = row.held
    record_current(row, listed, fingerprint(listed["description"], listed["input_schema"], listed["annotations"]))
    if row.held and not was_held:
        row.server.version += 1  # the tenant's registries are built again
        session.flush()
        return True
    return False


def waits_by_default(hints: dict) -> bool:
    read_only, destructive = read_only_and_destructive(hints or {})
    return not read_only or destructive


def read_only_and_destructive(hints: dict) -> tuple[bool, bool]:
    """What a server's hints say of a tool: (it only reads, it may destroy data). The MCP default for
    destructiveHint is true for a tool that does not only read."""
    read_only = hints.get("readOnlyHint") is True
    destructive = hints.get("destructiveHint") is True or (not read_only and hints.get("destructiveHint") is not False)
    return read_only, destructive


def hint_words(hints: dict) -> str:
    """What the tool's server says it does, in words for people."""
    read_only, destructive = read_only_and_destructive(hints or {})
    if read_only and destructive:
        return "Its server says it only reads, and also that it may destroy data."
    if read_only:
        return "Its server says it only reads."
    if destructive:
        return "Its server says it may destroy or overwrite data." + (
            "" if "destructiveHint" in (hints or {}) else " (It does not say otherwise.)"
        )
    return "Its server says it changes things, but destroys nothing."


def hint_changes(before: dict, after: dict) -> list[str]:
    """What a held tool's change does to its hints, in words (empty: the hints are as accepted)."""
    if read_only_and_destructive(before or {}) == read_only_and_destructive(after or {}) and (
        (before or {}).get("idempotentHint") is True
    ) == ((after or {}).get("idempotentHint") is True):
        return []
    return [f"It said: {hint_words(before)}", f"Now: {hint_words(after)}"]


def check_server(session: Session, server: McpServer, listing: list[dict]) -> tuple[list[str], list[str]]:
    """The periodic check of a server's listing against its accepted tools: a tool that changed is held
    at once (not at its next call or sync), and one changed back to what was accepted is released. It
    neither adds nor removes tools (that waits for an admin's sync). Returns (held, released) by
    registry name; the caller commits."""
    listed = {remote["name"]: remote for remote in listing}
    held, released = [], []
    for row in server.tools:
        remote = listed.get(row.remote_name)
        if remote is None:
            continue  # gone: a call says so, and the next sync removes it
        was_held = row.held
        record_current(row, remote, fingerprint(remote["description"], remote["input_schema"], remote["annotations"]))
        if row.held != was_held:
            (held if row.held else released).append(row.registry_name)
    if held or released:
        server.version += 1  # the tenant's registries are built again
        session.flush()
    return held, released


def accept_tool(session: Session, tenant_id: int, name: str, by_user_id: int | None) -> tuple[dict, dict]:
    """Accept a held tool's current definition; (before, after) for the audit log. McpError when there
    is nothing to accept or the new schema cannot be used."""
    row = session.scalar(select(McpTool).where(McpTool.tenant_id == tenant_id, McpTool.registry_name == name))
    if row is None:
        raise McpError(f"There is no MCP tool named {name!r} in this tenant.")
    if not row.held:
        raise McpError(f"{name} is not held: there is no change to accept.")
    if problem := schema_problem(row.current_input_schema):
        raise McpError(f"{name} cannot be accepted: {problem}. The server has to fix it first.")
    before = {"description": row.description, "input_schema": row.input_schema, "annotations": row.annotations}
    row.description, row.input_schema = row.current_description, row.current_input_schema
    row.annotations, row.fingerprint = row.current_annotations, row.current_fingerprint
    row.held, row.accepted_by_id, row.accepted_at = False, by_user_id, utcnow()
    row.server.version += 1
    session.flush()
    return before, {"description": row.description, "input_schema": row.input_schema, "annotations": row.annotations}
