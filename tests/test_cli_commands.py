"""The command line's commands and options are a contract (scripts, cron jobs and runbooks name them):
each feature registers its own (`webapp/<package>/cli.py`, listed by webapp/cli.py), and this pins the
whole tree, so a feature whose commands stop being registered, or a renamed option, fails here."""

from __future__ import annotations

import click

# `flask --app webapp COMMAND ...` -> its options and arguments (Flask's own db, routes, run and shell aside)
COMMANDS = {
    "audit anchor": ("--out",),
    "audit generate": ("--days", "--tenant", "COUNT"),
    "audit verify": ("--against", "--chain"),
    "ceiling list": (),
    "ceiling set": ("AMOUNT", "TOOL"),
    "create-operator": ("--name", "--password", "EMAIL"),
    "create-token": ("--expires-days", "--name", "EMAIL"),
    "create-user": ("--name", "--password", "--role", "--tenant", "EMAIL"),
    "desk redis start": (),
    "desk redis stop": (),
    "desk scheduler": ("--once",),
    "endpoint add": (
        "--api-key",
        "--api-key-env",
        "--base-url",
        "--context-window",
        "--model",
        "--protocol",
        "--tenant",
        "NAME",
    ),
    "endpoint allow": ("--tenant", "NAME"),
    "endpoint disallow": ("--tenant", "NAME"),
    "endpoint list": (),
    "endpoint update": (
        "--api-key",
        "--api-key-env",
        "--base-url",
        "--context-window",
        "--forget-key",
        "--model",
        "--protocol",
        "NAME",
    ),
    "mcp add": ("--command", "--cwd", "--env", "--header", "--tenant", "--url", "NAME"),
    "mcp list": ("--tenant",),
    "mcp map": ("--amount", "--facts", "--facts-arg", "--subject", "--tenant", "--unit", "TOOL"),
    "mcp remove": ("--tenant", "NAME"),
    "mcp sync": ("--tenant", "NAME"),
    "outbox": ("--last",),
    "policy-change approve": ("--reason", "CHANGE_ID"),
    "policy-change list": ("--status", "--tenant"),
    "policy-change reject": ("--reason", "CHANGE_ID"),
    "policy-defaults accept": ("TOOL",),
    "policy-defaults list": (),
    "revoke-token": ("TOKEN",),
    "role-change approve": ("--reason", "CHANGE_ID"),
    "role-change list": ("--status", "--tenant"),
    "role-change reject": ("--reason", "CHANGE_ID"),
    "run-batch": ("--as", "--batch", "--tenant", "--title", "FILE"),
    "secret grant": ("--tenant", "NAME"),
    "secret list": ("--tenant",),
    "secret revoke": ("--tenant", "NAME"),
    "seed-demo": (),
    "sweep": (),
    "tenant set-model": ("--endpoint", "--small-endpoint", "SLUG"),
    "worker": ("--burst", "--concurrency", "--name", "--people-only"),
}


def commands(group: click.Group, context: click.Context, path: tuple[str, ...] = ()) -> dict[str, tuple[str, ...]]:
    found = {}
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if not path and name in ("db", "routes", "run", "shell"):
            continue
        if isinstance(command, click.Group):
            found |= commands(command, click.Context(command, info_name=name), (*path, name))
        else:
            said = (p.opts[0] if isinstance(p, click.Option) else p.name.upper() for p in command.params)
            found[" ".join((*path, name))] = tuple(sorted(said))
    return found


def test_every_command_and_option_of_the_command_line_is_registered(app):
    assert commands(app.cli, click.Context(app.cli, info_name="flask")) == COMMANDS


def test_every_command_says_what_it_does(app, cli):
    for command in COMMANDS:
        shown = cli(*command.split(), "--help")
        assert shown.exit_code == 0 and "Usage: " in shown.output, command
        assert len(shown.output.split("\n\n", 2)) == 3, f"flask {command} --help says nothing of what it does"
