"""The API's OpenAPI document is the one it was before webapp/api was split by resource (issue 43):
tests/api/openapi_before.json holds the document the unsplit code built. Only ordering may differ: the
order of a dict's keys, of `paths`, of `components.schemas` and of an operation's `tags`. Every
operation, parameter, status code, schema, description, `required` list and enum stays as it was.

To see what differs: the failure lists each place (a path of keys) where the two documents part."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from webapp.api.openapi import build

BEFORE = Path(__file__).with_name("openapi_before.json")


def without_ordering(document: Any) -> Any:
    """The document with the orders that may change put in one order: dicts compare without their
    keys' order already, so only the operations' `tags` lists are sorted."""
    if isinstance(document, dict):
        return {key: sorted(value) if key == "tags" else without_ordering(value) for key, value in document.items()}
    if isinstance(document, list):
        return [without_ordering(item) for item in document]
    return document


def differences(before: Any, after: Any, where: str = "") -> list[str]:
    """Each place where the two documents part, as a path of keys and what each holds there."""
    if isinstance(before, dict) and isinstance(after, dict):
        found = [f"{where}/{key}: only before" for key in sorted(before.keys() - after.keys())]
        found += [f"{where}/{key}: only after" for key in sorted(after.keys() - before.keys())]
        for key in sorted(before.keys() & after.keys()):
            found += differences(before[key], after[key], f"{where}/{key}")
        return found
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        pairs = enumerate(zip(before, after, strict=True))
        return [line for index, pair in pairs for line in differences(*pair, f"{where}[{index}]")]
    return [] if before == after else [f"{where}: {before!r} before, {after!r} after"]


def test_the_document_is_the_one_before_the_split_but_for_ordering(app):
    before = without_ordering(json.loads(BEFORE.read_text()))
    after = without_ordering(json.loads(json.dumps(build(app))))  # as served: JSON, tuples as lists
    found = differences(before, after)
    assert not found, "the OpenAPI document changed:\n" + "\n".join(found[:50])
