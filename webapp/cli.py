"""Command-line entry points (`flask --app webapp ...`). Their names and arguments are a contract.

Each feature registers its own commands (`<package>/cli.py`); this is the list of them, and then the
commands the tool packs loaded with EXTRA_TOOLS bring (a pack module's `COMMANDS`): the desk's own
packages know none of a pack's."""

from __future__ import annotations

import copy
import importlib
from collections.abc import Iterable

import click
from flask import Flask
from flask.cli import with_appcontext

from webapp.accounts import cli as accounts
from webapp.audit import cli as audit
from webapp.ops import cli as ops
from webapp.runs import cli as runs
from webapp.runtime import cli as runtime
from webapp.settings import cli as settings


def register(app: Flask, pack_entries: Iterable[str] = ()) -> None:
    """Every feature's commands, then those of the packs named by `pack_entries` (EXTRA_TOOLS entries)."""
    accounts.register(app)  # create-user, create-operator, create-token, revoke-token, role-change
    audit.register(app)  # audit verify, audit anchor
    ops.register(app)  # endpoint, ceiling, secret
    runs.register(app)  # run-batch
    runtime.register(app)  # worker, desk scheduler, desk redis, sweep
    settings.register(app)  # tenant set-model, policy-change, mcp
    _register_packs(app, pack_entries)  # the billing demo's: seed-demo, outbox, audit generate


def _register_packs(app: Flask, pack_entries: Iterable[str]) -> None:
    """The click commands each pack module offers as `COMMANDS`, by the group they join ("" for `flask`
    itself, else a group of the desk's, e.g. "audit"), each run in the app's context as the desk's own
    are. A module named by several entries brings its commands once."""
    modules = dict.fromkeys(entry.partition(":")[0] for entry in pack_entries)
    for module_name in modules:
        offered = getattr(importlib.import_module(module_name), "COMMANDS", {})  # (loaded already: EXTRA_TOOLS)
        for group_name, commands in offered.items():
            group = app.cli.commands[group_name] if group_name else app.cli
            if not isinstance(group, click.Group):
                raise TypeError(f"{module_name}.COMMANDS names {group_name!r}, which is not a group of commands")
            for command in commands:
                group.add_command(_in_app_context(command))


def _in_app_context(command: click.Command) -> click.Command:
    """A copy of the pack's command whose callback runs in the app's context (the pack's own object
    stays as it is: every app of the process registers it afresh)."""
    registered = copy.copy(command)
    registered.callback = with_appcontext(command.callback)
    return registered
