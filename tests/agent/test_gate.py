"""The gate is one module: no other module of the desk compares a call's amount with a threshold, a
ceiling or a limit, or writes a tool's policy (issue 42). Read from the code, so a new door that weighs
calls on its own fails here."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GATE = ROOT / "webapp" / "agent" / "gate.py"
POLICY_STORE = ROOT / "webapp" / "agent" / "policies.py"
AMOUNTS = {"money_cents", "amount", "amount_cents"}  # a call's amount, as the code names it
RULE_WORDS = ("threshold", "ceiling", "limit", "most_cents")  # a rule's number


def _names(node: ast.AST) -> set[str]:
    said = set()
    for part in ast.walk(node):
        if isinstance(part, ast.Name):
            said.add(part.id)
        elif isinstance(part, ast.Attribute):
            said.add(part.attr)
    return said


def _weighs(compare: ast.Compare) -> bool:
    """An order comparison with an amount on one side and a rule's number on the other."""
    if not any(isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE) for op in compare.ops):
        return False
    sides = [compare.left, *compare.comparators]
    amounts = [bool(_names(side) & AMOUNTS) for side in sides]
    rules = [any(word in name for name in _names(side) for word in RULE_WORDS) for side in sides]
    return any(a and r for i, a in enumerate(amounts) for j, r in enumerate(rules) if i != j)


def _modules():
    for path in sorted((ROOT / "webapp").rglob("*.py")):
        if "migrations" not in path.parts:
            yield path, ast.parse(path.read_text(), str(path))


def _places(found, outside) -> list[str]:
    """Where in webapp (outside the module `outside`) a node is that `found` picks out: "path:line"."""
    return [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path, tree in _modules()
        if path != outside
        for node in ast.walk(tree)
        if found(node)
    ]


def test_only_the_gate_compares_a_calls_amount_with_a_threshold_a_ceiling_or_a_limit():
    found = _places(lambda node: isinstance(node, ast.Compare) and _weighs(node), outside=GATE)
    assert found == []


def test_the_check_finds_a_comparison_written_anywhere_else():
    tree = ast.parse("if call.money_cents > policy.amount_threshold_cents:\n    pass\n")
    assert any(isinstance(node, ast.Compare) and _weighs(node) for node in ast.walk(tree))


def test_only_the_policy_store_writes_a_tools_policy():
    writers = _places(
        lambda node: isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "ToolPolicy",
        outside=POLICY_STORE,
    )
    assert writers == []


def test_what_a_policy_reads_may_not_change_under_a_rule_that_runs_calls_by_it():
    from webapp.agent import gate
    from webapp.agent.policies import Limits, Policy

    was, now = {"amount": "amount_cents", "amount_unit": "cents"}, {"amount": "fee_cents", "amount_unit": "cents"}
    # Under "runs at once" the operator's ceiling reads the amount too: a remap could let a call past it.
    assert gate.reading_loosenings(was, now, Policy("wire", "never", ceiling_cents=50_000))
    assert gate.reading_loosenings(was, now, Policy("wire", "above_amount", 10_000, 1))
    assert gate.reading_loosenings(was, {**was, "amount_unit": "dollars"}, Policy("wire", "above_amount", 10_000, 1))
    assert gate.reading_loosenings({}, now, Policy("wire", "above_amount", 10_000, 1))  # gone and back
    assert not gate.reading_loosenings(was, now, Policy("wire", "never"))  # nothing read
    assert not gate.reading_loosenings(was, now, Policy("wire", "always", limits=Limits(tenant_day_cents=100)))
    by_subject = Policy("wire", "above_amount", 10_000, 1, limits=Limits(subject_day_count=2))
    assert gate.reading_loosenings({**was, "subject": "account"}, {**was, "subject": "memo"}, by_subject)
