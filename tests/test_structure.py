"""The house keeps its rooms small enough to read: the limits the restructure set (docs/architecture.md,
"The map"), measured on webapp/ with the migrations aside. A module, class or function that outgrows
them fails here by name, so it is split when it grows, not found later."""

from __future__ import annotations

import ast
from pathlib import Path

WEBAPP = Path(__file__).resolve().parent.parent / "webapp"

MODULE_LINES = 600
CLASS_LINES = 300
FUNCTION_LINES = 80
LONG_FUNCTIONS_ALLOWED = 3


def _sources() -> list[Path]:
    return [path for path in sorted(WEBAPP.rglob("*.py")) if "migrations" not in path.relative_to(WEBAPP).parts]


def _spans(kinds: tuple[type, ...], longer_than: int) -> list[str]:
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, kinds) and node.end_lineno - node.lineno + 1 > longer_than:
                found.append(
                    f"{path.relative_to(WEBAPP.parent)}:{node.lineno} {node.name} "
                    f"({node.end_lineno - node.lineno + 1} lines)"
                )
    return found


def test_no_module_of_webapp_is_longer_than_600_lines():
    long = [
        f"{path.relative_to(WEBAPP.parent)} ({lines} lines)"
        for path in _sources()
        if (lines := len(path.read_text().splitlines())) > MODULE_LINES
    ]
    assert long == [], "split these modules by job:\n" + "\n".join(long)


def test_no_class_of_webapp_is_longer_than_300_lines():
    long = _spans((ast.ClassDef,), CLASS_LINES)
    assert long == [], "split these classes:\n" + "\n".join(long)


def test_at_most_three_functions_of_webapp_are_longer_than_80_lines():
    long = _spans((ast.FunctionDef, ast.AsyncFunctionDef), FUNCTION_LINES)
    assert len(long) <= LONG_FUNCTIONS_ALLOWED, "shorten some of these functions:\n" + "\n".join(long)
