"""Headers and variables of an MCP server: parsed from an admin's text, stored sealed or as $VARIABLE
references, and said in words (names only, never a value)."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy.orm import object_session

from webapp.models import McpServer
from webapp.secrets import sealing, secret_grants
from webapp.tools.mcp.base import (
    ENV_REFERENCE,
    HEADER_NAME,
    SEALING_ENVIRONMENT,
    SEALING_HEADERS,
    VARIABLE_NAME,
    McpError,
    SecretRefused,
)
from webapp.tools.mcp.transport import granted_words


def parse_header(text: str) -> tuple[str, str]:
    """("Name", "value") from "Name: value"; McpError says what to type (never repeating a value: a
    line typed without its colon may be all secret)."""
    name, colon, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not colon:
        raise McpError('A header line has no colon: type it as "Name: value", e.g. "Authorization: Bearer abc".')
    if not HEADER_NAME.match(name):
        raise McpError(f'{name!r} is not a header name: type it as "Name: value", e.g. "Authorization: Bearer abc".')
    if not value:
        raise McpError(f'The header {name} has no value: type it as "Name: value", e.g. "Authorization: Bearer abc".')
    return name, value


def parse_variable(text: str) -> tuple[str, str]:
    """("NAME", "value") from "NAME=value", a started server's variable; McpError says what to type
    (never repeating a value)."""
    name, equals, value = text.partition("=")
    name = name.strip()
    if not equals:
        raise McpError('A variable has no "=": type it as NAME=value, e.g. INVENTORY_TOKEN=abc.')
    if not VARIABLE_NAME.match(name):
        raise McpError(
            f"{name!r} is not a variable's name: use letters, digits and _, not starting with a digit, "
            "e.g. INVENTORY_TOKEN=abc."
        )
    if not value:
        raise McpError(f"The variable {name} has no value: type it as {name}=value, or leave it out.")
    return name, value


def stored_headers(
    secret_key: str, pairs: list[tuple[str, str]], *, by_operator: bool, granted: Collection[str] = ()
) -> list[dict]:
    """Headers as stored, each marked with whether an operator set it: a value written as $VARIABLE
    is read from the environment at each use (from a tenant's admin only a secret `granted` to the
    tenant; SecretRefused names the header and the granted secrets); any other value is sealed.
    Values are never stored in the clear."""
    stored = []
    for name, value in pairs:
        reference = ENV_REFERENCE.match(value)
        if reference and not by_operator and reference.group(1) not in granted:
            variable = reference.group(1)
            raise SecretRefused(
                f'"{name}: ${variable}" would send the desk\'s environment variable {variable} to the server, and '
                f"the desk's operator has not granted it to this tenant: a tenant's admin may name only the secrets "
                f"granted to their tenant ({granted_words(granted)}). Nothing was saved or sent. Name a granted "
                "secret, type the value itself to have it stored encrypted, or ask the desk's operator to grant it.",
                "",
                name,
                variable,
            )
        if reference:
            stored.append({"name": name, "env": reference.group(1), "operator": by_operator})
        else:
            stored.append(
                {"name": name, "sealed": sealing.seal(secret_key, SEALING_HEADERS, value), "operator": by_operator}
            )
    return stored


def stored_environment(secret_key: str, pairs: list[tuple[str, str]]) -> list[dict]:
    """A started server's variables as stored (only an operator gives them): NAME=$VARIABLE reads the
    desk's variable at each start; any other value is sealed. McpError when a name is given twice."""
    stored, seen = [], set()
    for name, value in pairs:
        if name in seen:
            raise McpError(f"The variable {name} is given twice; give it once.")
        seen.add(name)
        reference = ENV_REFERENCE.match(value)
        if reference:
            stored.append({"name": name, "env": reference.group(1)})
        else:
            stored.append({"name": name, "sealed": sealing.seal(secret_key, SEALING_ENVIRONMENT, value)})
    return stored


def header_words(
    server: McpServer, _secret_prefix: str | None = None, granted: Collection[str] | None = None
) -> list[str]:
    """The server's headers for people: names and where the value comes from, never the value; a header
    a tenant's admin set that reads a secret not granted to the tenant says it is not sent. `granted`:
    the tenant's secrets, read from the row's session when not given. (The second argument, the
    MCP_SECRET_PREFIX of before grants, is no longer read.)"""
    if granted is None and any("env" in header for header in server.headers or ()):
        session = object_session(server)
        granted = secret_grants.granted(session, server.tenant_id) if session is not None else ()
    said = []
    for header in server.headers or ():
        if "env" not in header:
            said.append(f"{header['name']} (stored encrypted)")
        elif header.get("operator") is True or header["env"] in granted:
            said.append(f"{header['name']} (from ${header['env']})")
        else:
            said.append(f"{header['name']} (from ${header['env']}, a secret not granted to this tenant: not sent)")
    return said


def environment_words(server: McpServer) -> list[str]:
    """A started server's variables for people: names and where each comes from, never the value."""
    return [
        f"{v['name']} (from ${v['env']})" if "env" in v else f"{v['name']} (stored encrypted)"
        for v in server.environment or ()
    ]
