"""The gate, searched for paths nobody listed (issue 42): a Hypothesis state machine drives the real app
through its JSON API as the acme tenant's people would, in any order. Admins declare and re-declare the
tools outside agents ask about (the money read from another argument, in another unit, another subject,
a policy with it), remove them, set policies, and approve or reject changes (each other's or their own);
agents ask calls with amounts of every kind (negative, zero, around the thresholds, 10^12 and past it,
floats, text, booleans, null, missing), under their own idempotency keys or the same ones; reviewers
approve, reject, or edit and approve what waits (raising or lowering the amount, changing the subject,
adding an argument), with the arguments' hash as they saw it, a stale one or none; agents report what
an approved call did. After every step the machine checks what the desk promises:

1. no request answered 500;
2. every call that may run, or ran, either ran with no person under the gate in force when it was asked
   (its amount money: a whole number of cents from 0 to 10^12; within the threshold, the ceiling and the
   limits, counting every call that ran with no person before it), or has as many approvals as the
   policy asked, from reviewers of the tenant other than the person who asked and any reviewer whose
   edit widened it; an amount that is not money is never taken, asked or edited in; a call returned
   for an idempotency key is one its asker asked for under that key;
3. no cumulative total shrank: the money that ran with no person, per tool, only grows, and no stored
   amount is negative or past 10^12;
4. no looser gate is in force without a second admin: from one step to the next a tool's gate (its
   policy, and which argument, unit and subject it reads) loosens only when an admin approved a change
   another admin asked for, and every `policy_changed` event that loosens names two people.

The oracle is the machine's own, written from the issue (what "looser", "money" and "widened" mean),
not imported from the desk. Each example starts from the seeded database (`empty_runtime_tables`, what
the suite's `clean` fixture does). It runs derandomized (the same examples every run) and bounded;
GATE_EXAMPLES=500 (and GATE_STEPS) search longer, GATE_SHRINK=1 shrinks a failure to its shortest
steps (minutes), and the run prints what it reached (docs/testing.md).

A failure says what broke, each line marked with its kind: [500]; [amount] an amount that is not money
taken or stored; [rule] or [limits] a call that ran with no person outside its rule or past a limit;
[reported] past a limit only if the calls their agent reported as failed count; [approvals] too few
approvals that count; [reread] the same, where the edit widened the call only as its tool read it when
the call was asked (declared again since); [total] a total that shrank; [looser] a gate loosened alone; [comeback]
the same for a tool removed and declared again; [audit] a loosening `policy_changed` without two
people; [idempotency] another's call returned for a key. GATE_SKIP=reported,reread looks past the kinds
named while they are being fixed.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import func, select

from tests.conftest import empty_runtime_tables
from webapp.agent.decisions import arguments_hash
from webapp.models import AuditEvent, Decision, ToolCall, User

EXAMPLES = int(os.environ.get("GATE_EXAMPLES", "60"))
STEPS = int(os.environ.get("GATE_STEPS", "30"))
# Shrinking a failure to its shortest form re-runs the machine hundreds of times (minutes): GATE_SHRINK=1.
PHASES = tuple(Phase) if os.environ.get("GATE_SHRINK") else (Phase.explicit, Phase.reuse, Phase.generate)
SKIP = {kind.strip() for kind in os.environ.get("GATE_SKIP", "").split(",") if kind.strip()}
MAX_MONEY_CENTS = 10**12  # the ceiling on any amount, written here rather than read from the desk

ADMINS = ("admin@acme.test", "admin2@acme.test")
PAIR = "gate-pair@acme.test"  # an agent who is also a reviewer: never the one who approves their own call
AGENT2 = "gate-agent2@acme.test"  # a second agent: the same idempotency keys are its own
# (the demo's people come twice: drawn more often than those who mostly meet a refusal)
AGENTS = (*("agent@acme.test", AGENT2, PAIR) * 2, "agent@globex.test")
REVIEWERS = (
    *("reviewer@acme.test", "reviewer2@acme.test", "reviewer@acme.test", "reviewer2@acme.test", PAIR),
    *("reviewer@globex.test", "admin@acme.test"),
)
TOOLS = ("transfer", "payout")
MAY_HAVE_RUN = ("pending", "approved", "running", "awaiting_task", "succeeded", "failed")

_ARGUMENTS = {
    "value": {"type": "number"},
    "fee": {"type": "integer"},
    "account": {"type": "string"},
    "payee": {"type": "string"},
    "memo": {"type": "string"},
}
SCHEMAS = {  # "lax": amount_cents may be anything, so the desk's own reading of money is what is tried
    "lax": {"type": "object", "properties": {"amount_cents": {}, **_ARGUMENTS}},
    "strict": {"type": "object", "properties": {"amount_cents": {"type": "integer", "minimum": 0}, **_ARGUMENTS}},
}
AMOUNTS = (
    *(-10_000_000, -1, 0, 1, 50, 4_999, 5_000, 5_001, 10_000, 10_001, 15_000, 100_000, 10_000_000),
    *(10**12, 10**12 + 1, 10**13, 2**63, 10**28),
    *(0.5, 12.5, 5_000.0, 1e308, "5000", "12.50", "abc", "-5", True, False, None),
)
# Over the run, printed to see what the search reached: (method, route, status, error) and other events.
ANSWERS: Counter = Counter()
REACHED: Counter = Counter()
LIMITS = [
    f"{scope}_{kind}"
    for scope in ("conversation", "subject_day", "tenant_day", "person_day")
    for kind in ("count", "cents")
]

amounts = st.one_of(st.sampled_from(AMOUNTS), st.integers(0, 200_000))
# what the schema's typed arguments take (anything else is the schema's 422, not the gate's matter)
numbers = st.one_of(st.sampled_from([a for a in AMOUNTS if type(a) in (int, float)]), st.integers(0, 200_000))
whole = st.one_of(st.sampled_from([a for a in AMOUNTS if type(a) is int]), st.integers(0, 200_000))
subjects = st.sampled_from(("ACME-17", "ACME-99", ""))


def arguments(memo: str):
    return st.fixed_dictionaries(
        {},
        optional={
            "amount_cents": amounts,
            "value": numbers,
            "fee": whole,
            "account": subjects,
            "payee": subjects,
            "memo": st.just(memo),
        },
    )


inputs, edits = arguments("invoice 88"), arguments("paid by cheque")
readings = st.fixed_dictionaries(
    {
        "schema": st.sampled_from(tuple(SCHEMAS)),
        "amount": st.sampled_from((None, "amount_cents", "value", "fee")),
        "unit": st.sampled_from(("cents", "dollars")),
        "subject": st.sampled_from((None, "account", "payee")),
    }
)
# one or two limits (a count: 1 to 3 calls; money: $50 to $1,000)
some_limits = st.lists(
    st.sampled_from(LIMITS).flatmap(
        lambda name: st.tuples(
            st.just(name), st.sampled_from((1, 2, 3) if name.endswith("_count") else (5_000, 15_000, 100_000))
        )
    ),
    min_size=1,
    max_size=2,
    unique_by=lambda limit: limit[0],
).map(dict)
any_limits = st.none() | st.just({}) | some_limits  # None: as they are; {}: none
# a tool's first policy counts its calls, whatever it reads (2 or 3 with no person a day, in a scope)
counted = st.dictionaries(
    st.sampled_from(("subject_day_count", "tenant_day_count", "person_day_count")),
    st.sampled_from((2, 3)),
    min_size=1,
    max_size=2,
)


@st.composite
def policies(draw, limits=any_limits) -> dict:
    """A policy as PUT /api/policies takes it; `limits` None leaves them as they are, {} clears them."""
    mode = draw(st.sampled_from(("above_amount", "always", "never")))
    body: dict = {"mode": mode}
    if mode == "above_amount":
        body["threshold_cents"] = draw(st.sampled_from((0, 1, 5_000, 10_000, 100_000, 10_000_000)))
    approvals = draw(st.sampled_from((None, 1, 2, 3)))
    if approvals is not None:
        body["approvals"] = approvals
    limits = draw(limits)
    if limits is not None:
        body["limits"] = limits
    return body


@dataclass(frozen=True)
class Gate:
    """One tool's gate as in force: which argument is the money and in what unit, which names the
    subject, and the policy. The default is a newly declared tool's: every call waits for one person."""

    amount: str | None = None
    unit: str = "cents"
    subject: str | None = None
    mode: str = "always"
    threshold: int | None = None
    approvals: int = 1
    limits: tuple = ()  # (name, value) of each limit set, sorted
    ceiling: int | None = None

    @classmethod
    def of(cls, tool: dict) -> Gate:
        """From GET /api/external-tools."""
        policy = tool["policy"]
        return cls(
            tool["amount"],
            tool["amount_unit"],
            tool["subject"],
            policy["mode"],
            policy["threshold_cents"],
            policy["approvals"],
            tuple(sorted((name, value) for name, value in policy["limits"].items() if value is not None)),
            policy["ceiling_cents"],
        )

    @classmethod
    def of_snapshot(cls, snapshot: dict) -> Gate:
        """From a policy_changed event's before or after (the reading is not in it: left as default)."""
        limits = snapshot.get("limits") or {}
        return cls(
            mode=snapshot["mode"],
            threshold=snapshot.get("amount_threshold_cents"),
            approvals=snapshot.get("approvals_required", 1),
            limits=tuple(sorted((name, value) for name, value in limits.items() if value is not None)),
            ceiling=snapshot.get("ceiling_cents"),
        )

    def limit(self, name: str) -> int | None:
        return dict(self.limits).get(name)

    def money_limits(self) -> bool:
        return any(name.endswith("_cents") for name, _ in self.limits)


_STRICTNESS = {"never": 0, "above_amount": 1, "always": 2}


def loosenings(before: Gate, after: Gate) -> list[str]:
    """What in `after` lets some conceivable call wait less, or for fewer people, than under `before`
    (the issue's one rule; when unsure, it is looser)."""
    said = []
    if _STRICTNESS[after.mode] < _STRICTNESS[before.mode]:
        said.append(f"the rule goes from {before.mode} to {after.mode}")
    elif after.mode == before.mode == "above_amount" and (after.threshold or 0) > (before.threshold or 0):
        said.append(f"the threshold goes from {before.threshold} to {after.threshold} cents")
    if after.mode != "never" and after.approvals < before.approvals:
        said.append(f"approvals go from {before.approvals} to {after.approvals}")
    for name, was in before.limits:
        now = after.limit(name)
        if now is None or now > was:
            said.append(f"the limit {name} goes from {was} to {now}")
    if before.ceiling is not None and (after.ceiling is None or after.ceiling > before.ceiling):
        said.append(f"the ceiling goes from {before.ceiling} to {after.ceiling}")
    # Which argument is the money (and its unit) and which the subject matter where the gate reads them:
    # an amount rule reads the money (a call with none waits), money limits under a rule that lets calls
    # run add it up (a call with none adds nothing), limits per subject group calls by it.
    limited = after.mode != "always"
    reads_money = (after.mode == "above_amount" and after.amount is not None) or (limited and after.money_limits())
    if reads_money and (before.amount, before.unit) != (after.amount, after.unit):
        said.append(
            f"the money is read from {after.amount} in {after.unit} (was {before.amount} in {before.unit}) "
            f"under {after.mode}{' with money limits' if after.money_limits() else ''}"
        )
    per_subject = after.limit("subject_day_count") or after.limit("subject_day_cents")
    if limited and per_subject and before.subject != after.subject:
        said.append(f"the subject is read from {after.subject} (was {before.subject}) under limits per subject")
    return said


def money(value, unit: str) -> tuple[bool, int | None]:
    """(whether `value` is money, in cents): a whole number of cents from 0 to 10^12, or dollars as a
    number or its text that make whole cents in that range. None (sent as null, or not sent) is no
    amount, which is money's absence, not bad money."""
    if value is None:
        return True, None
    if isinstance(value, bool):
        return False, None
    if unit == "cents":
        ok = isinstance(value, int) and 0 <= value <= MAX_MONEY_CENTS
        return ok, value if ok else None
    number = _number(value)
    if number is None:
        return False, None
    cents = number * 100
    if cents != cents.to_integral_value() or not 0 <= cents <= MAX_MONEY_CENTS:
        return False, None
    return True, int(cents)


def _number(value) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = Decimal(str(value).strip())
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def widening(old: dict, new: dict, amount_args: set[str], subject_args: set[str]) -> str | None:
    """How a reviewer's edit widens a call (None: it does not): it adds what was not asked, raises the
    money (or makes it something that is not a lower amount), or changes what the call acts on."""
    for key in sorted(new.keys() - old.keys()):
        return f"adds {key}={new[key]!r}"
    for key in sorted(old.keys() & new.keys()):
        if json.dumps(old[key]) == json.dumps(new[key]):
            continue
        if key in amount_args:
            was, now = _number(old[key]), _number(new[key])
            if not (was is not None and now is not None and 0 <= now <= was):
                return f"raises {key} from {old[key]!r} to {new[key]!r}"
        if key in subject_args:
            return f"changes the subject {key} from {old[key]!r} to {new[key]!r}"
    return None


@dataclass
class Asked:
    """A call the machine asked for, and the gate it was asked under."""

    id: int
    asker: str
    key: str
    tool: str
    input: dict
    gate: Gate
    cents: int | None
    subject: str | None
    alone: bool  # ran with no person (checked against the gate when it was asked)
    reported_failed: bool = False


class Answer:
    def __init__(self, status_code: int, json_body) -> None:
        self.status_code, self.json = status_code, json_body


class GateMachine(RuleBasedStateMachine):
    """See the module docstring. The test binds `api`, `read`, `reset` and `ids` before running it."""

    api = read = reset = None
    ids: dict[str, int] = {}
    reviewer_ids: frozenset[int] = frozenset()

    def __init__(self) -> None:
        super().__init__()
        type(self).reset()
        self.audit_seen = self.read(lambda s: s.scalar(select(func.coalesce(func.max(AuditEvent.id), 0))))
        self.gates: dict[str, Gate] = {}  # in force now, by GET /api/external-tools
        self.seen: dict[str, Gate] = {}  # the last gate each tool had, while it was declared
        self.calls: dict[int, Asked] = {}
        self.changes: dict[int, tuple[str, str]] = {}  # id: (tool, the admin who asked)
        # call: {reviewer whose edit widened it: how, and whether only by the reading it was asked under}
        self.wideners: dict[int, dict[str, tuple[str, bool]]] = defaultdict(dict)
        self.totals: dict[str, int] = {}
        self.step = "the start"  # what the last step did, in words for a failure's message
        self.approved: dict[str, tuple[str, str]] = {}  # tool: (who approved, who asked), in this step
        self.came_back: set[str] = set()  # tools removed and declared again in this step
        self.statuses: dict[int, str] = {}  # each call's status after the last step
        self.problems: list[tuple[str, str]] = []
        self.fresh = 0  # idempotency keys used once

    # --- admins -------------------------------------------------------------------------------

    # the first policies have limits, so that what runs with no person adds up to one now and then
    @initialize(transfer=readings, payout=readings, transfer_policy=policies(counted), payout_policy=policies(counted))
    def declare_both(self, transfer, payout, transfer_policy, payout_policy):
        """Each example starts with both tools declared, by one admin with the policy drawn (or none, if
        the tool cannot have it), any loosening of it approved by the other admin (so that some calls
        run with no person)."""
        for tool, reading, policy in (("transfer", transfer, transfer_policy), ("payout", payout, payout_policy)):
            declared = self.send(
                "put", ADMINS[0], f"/api/external-tools/{tool}", self.declaration(reading) | {"policy": policy}
            )
            if declared.status_code == 422:
                declared = self.send("put", ADMINS[0], f"/api/external-tools/{tool}", self.declaration(reading))
            change = (declared.json or {}).get("change") if declared.status_code == 200 else None
            if change:
                approved = self.send("post", ADMINS[1], f"/api/policy-changes/{change['id']}", {"decision": "approve"})
                if approved.status_code == 200:
                    self.approved[tool] = (ADMINS[1], ADMINS[0])
        self.step = "both tools declared"

    # One rule for all an admin does, so that admins act in about one step in five, as people would:
    # calls, reviews and reports are most of a day.
    @rule(
        act=st.one_of(
            st.tuples(
                st.just("declare"), st.sampled_from(ADMINS), st.sampled_from(TOOLS), readings, st.none() | policies()
            ),
            st.tuples(st.just("set policy"), st.sampled_from(ADMINS), st.sampled_from(TOOLS), policies()),
            st.tuples(st.just("remove"), st.sampled_from(ADMINS), st.sampled_from(TOOLS)),
            st.tuples(
                st.just("remove and declare"),
                st.sampled_from(ADMINS),
                st.sampled_from(TOOLS),
                readings,
                st.none() | policies(),
            ),
            st.tuples(st.just("decide change"), st.sampled_from(ADMINS), st.booleans(), st.integers(0, 9)),
        )
    )
    def admin_acts(self, act):
        what, admin, *more = act
        if what == "declare":
            self.declare(admin, *more)
        elif what == "set policy":
            self.set_policy(admin, *more)
        elif what == "remove":
            self.remove(admin, *more)
        elif what == "remove and declare":  # a tool taken away and declared afresh in one step
            tool, reading, policy = more
            self.send("delete", admin, f"/api/external-tools/{tool}")
            self.declare(admin, tool, reading, policy)
            self.step = f"{admin} removed {tool} and declared it again"
            self.came_back.add(tool)
        else:
            self.decide_change(admin, *more)

    def declare(self, admin, tool, reading, policy):
        body = self.declaration(reading)
        if policy is not None:
            body["policy"] = policy
        self.keep_change(self.send("put", admin, f"/api/external-tools/{tool}", body), tool, admin)
        self.step = f"{admin} declared {tool}"

    @staticmethod
    def declaration(reading: dict) -> dict:
        return {
            "description": "Send money from the treasury to a supplier.",
            "input_schema": SCHEMAS[reading["schema"]],
            "amount": reading["amount"],
            "amount_unit": reading["unit"],
            "subject": reading["subject"],
        }

    def set_policy(self, admin, tool, policy):
        self.keep_change(self.send("put", admin, f"/api/policies/{tool}", policy), tool, admin)
        self.step = f"{admin} set {tool}'s policy"

    def remove(self, admin, tool):
        if len(self.gates) < len(TOOLS):  # one tool at a time is gone
            self.step = f"{admin} left the tools as they are"
            return
        self.send("delete", admin, f"/api/external-tools/{tool}")
        self.step = f"{admin} removed {tool}"

    def decide_change(self, admin, approve, which):
        """An admin approves or rejects a change not yet decided (theirs, or the other admin's)."""
        if not self.changes:
            self.step = f"{admin} found no change to decide"
            return
        change = sorted(self.changes)[which % len(self.changes)]
        body = {"decision": "approve"} if approve else {"decision": "reject", "reason": "Not now."}
        answer = self.send("post", admin, f"/api/policy-changes/{change}", body)
        tool, asker = self.changes[change]
        if answer.status_code in (200, 409):  # decided now, or before (superseded, the policy changed since)
            del self.changes[change]
        if approve and answer.status_code == 200:
            self.approved[tool] = (admin, asker)
            REACHED["a change approved"] += 1
        self.step = f"{admin} {'approved' if approve else 'rejected'} change {change} of {tool}, asked by {asker}"

    def keep_change(self, answer: Answer, tool: str, admin: str) -> None:
        change = (answer.json or {}).get("change") if answer.status_code in (200, 202) else None
        if change:
            self.changes[change["id"]] = (tool, admin)

    # --- agents -------------------------------------------------------------------------------

    @rule(
        asks=st.lists(
            st.tuples(
                st.sampled_from(AGENTS),
                st.sampled_from(TOOLS),
                inputs,
                st.sampled_from((None,) * 10 + ("k1", "k2")),  # None: a key of its own
            ),
            min_size=1,
            max_size=4,
        )
    )
    def ask(self, asks):
        """Agents ask for calls, one after the other (none changes a gate, so each is weighed against
        the gate in force before the step)."""
        for agent, tool, arguments, key in asks:
            self.ask_one(agent, tool, arguments, key)

    def ask_one(self, agent, tool, arguments, key):
        if key is None:
            self.fresh += 1
            key = f"fresh-{self.fresh}"
        body = {
            "source": "gate-bot",
            "tool": tool,
            "input": arguments,
            "context": "A supplier's invoice is due.",
            "idempotency_key": key,
        }
        answer = self.send("post", agent, "/api/calls", body)
        self.step = f"{agent} asked {tool}"
        if answer.status_code == 200:
            before = self.calls.get(answer.json["id"])
            if before is None or (before.asker, before.key) != (agent, key):
                self.fail(
                    "idempotency",
                    f"{agent} sent key {key!r} and got call {answer.json['id']} back, which "
                    + (f"{before.asker} asked under key {before.key!r}" if before else "the machine never asked"),
                )
            return
        if answer.status_code != 201:
            return
        call_id, gate = answer.json["id"], self.gates.get(tool)
        if gate is None or not agent.endswith("@acme.test"):
            self.fail("rule", f"{agent} asked {tool}, which acme has not declared for them, and got call {call_id}")
            gate = gate or Gate()
        valid, cents = money(arguments.get(gate.amount), gate.unit) if gate.amount else (True, None)
        if not valid:
            self.fail(
                "amount",
                f"call {call_id} of {tool} was taken with {gate.amount}={arguments[gate.amount]!r} "
                f"({gate.unit}), which is not money",
            )
        value = arguments.get(gate.subject) if gate.subject else None
        subject = f"{gate.subject}:{value}"[:200] if value not in (None, "") else None
        waited, flagged = self.read(
            lambda s: s.execute(select(ToolCall.requires_approval, ToolCall.policy).where(ToolCall.id == call_id)).one()
        )
        alone = not waited
        if waited and (flagged or {}).get("limit"):
            REACHED["waited for a limit"] += 1
        if alone:
            why = self.must_wait(gate, cents, subject, agent, tool)
            if why:
                self.fail(
                    why[0],
                    f"call {call_id} of {tool} ({arguments}) ran with no person, though {why[1]} (gate {gate})",
                )
        self.calls[call_id] = Asked(call_id, agent, key, tool, arguments, gate, cents, subject, alone)
        REACHED["ran with no person" if alone else "waited"] += 1

    def must_wait(self, gate: Gate, cents, subject, agent, tool) -> tuple[str, str] | None:
        """Why a call must wait for a person under `gate` (kind, words), or None."""
        if gate.mode == "always":
            return "rule", "its rule makes every call wait"
        moves = "no amount it tells" if cents is None else f"{cents} cents"
        if gate.ceiling is not None and (cents is None or cents > gate.ceiling):
            return "rule", f"it moves {moves}, under the ceiling of {gate.ceiling}"
        if gate.mode == "above_amount" and (cents is None or cents > (gate.threshold or 0)):
            return "rule", f"it moves {moves}, under the threshold of {gate.threshold}"
        earlier = [call for call in self.calls.values() if call.alone and call.tool == tool]
        scopes = {
            "conversation": [],  # an outside call is a conversation of its own
            "subject_day": [call for call in earlier if call.subject == subject] if subject else None,
            "tenant_day": earlier,
            "person_day": [call for call in earlier if call.asker == agent],
        }
        for scope, counted in scopes.items():
            if counted is None:
                continue
            # [reported]: past the limit only when the calls their agent reported as failed count: an
            # outside agent's word that a call failed cannot give back what the desk let it run
            kind = (
                "limits" if self.past(gate, scope, [c for c in counted if not c.reported_failed], cents) else "reported"
            )
            past = self.past(gate, scope, counted, cents)
            if past:
                return kind, past
        return None

    @staticmethod
    def past(gate: Gate, scope: str, counted: list[Asked], cents) -> str | None:
        """Which limit of `scope` a call moving `cents` passes, with the calls `counted` (None: none)."""
        failed = sum(call.reported_failed for call in counted)
        failed = f" ({failed} of them reported failed by their agent)" if failed else ""
        most = gate.limit(f"{scope}_count")
        if most is not None and len(counted) + 1 > most:
            return f"{len(counted)} calls already ran with no person {scope}{failed}; the limit is {most}"
        most = gate.limit(f"{scope}_cents")
        total = sum(call.cents or 0 for call in counted) + (cents or 0)
        if most is not None and total > most:
            return f"with it {total} cents ran with no person {scope}{failed}; the limit is {most}"
        return None

    @precondition(lambda self: self.calls)
    @rule(what=st.sampled_from(("ran", "failed", "ran", "failed", "give up")), data=st.data())
    def follow_up(self, what, data):
        """The agent that asked says what a call did (one that ran with no person, or may run, while any
        does), or gives up a call (one that waits, while any does)."""
        if what == "give up":
            waiting = sorted(call for call, status in self.statuses.items() if status == "awaiting_approval")
            call = self.calls[data.draw(st.sampled_from(waiting or sorted(self.calls)), label="call")]
            self.send("post", call.asker, f"/api/calls/{call.id}/cancel", {"reason": "Paid by cheque."})
            self.step = f"{call.asker} gave up call {call.id}"
            return
        may_run = sorted(call for call, status in self.statuses.items() if status in ("pending", "approved"))
        may_run = [call for call in may_run if self.calls[call].alone] or may_run
        call = self.calls[data.draw(st.sampled_from(may_run or sorted(self.calls)), label="call")]
        body = {"ok": what == "ran", "summary": "Done." if what == "ran" else "The bank refused it."}
        answer = self.send("post", call.asker, f"/api/calls/{call.id}/outcome", body)
        if answer.status_code == 200:
            REACHED[f"reported {what}{' with no person' if call.alone else ''}"] += 1
            call.reported_failed = what == "failed"
        self.step = f"{call.asker} reported call {call.id} {what}"

    # --- reviewers ----------------------------------------------------------------------------

    @precondition(lambda self: self.calls)
    @rule(
        reviewer=st.sampled_from(REVIEWERS),
        kind=st.sampled_from(("approve", "edit", "reject")),
        hashed=st.sampled_from(("as seen", "none", "as asked")),
        data=st.data(),
    )
    def decide(self, reviewer, kind, hashed, data):
        """A reviewer reads a call (one that waits, while any does) and decides it."""
        waiting = sorted(call for call, status in self.statuses.items() if status == "awaiting_approval")
        call = self.calls[data.draw(st.sampled_from(waiting or sorted(self.calls)), label="call")]
        seen = self.send("get", reviewer, f"/api/approvals/{call.id}")
        current = self.read(lambda s: s.get(ToolCall, call.id).input)
        body: dict = {"decision": "reject", "reason": "Not this one."} if kind == "reject" else {"decision": "approve"}
        if hashed == "as seen" and seen.status_code == 200:
            body["arguments_hash"] = seen.json["arguments_hash"]
        elif hashed == "as asked":  # stale once an edit changed the call
            body["arguments_hash"] = arguments_hash(call.input)
        edited = None
        if kind == "edit":
            change = data.draw(edits, label="edit")
            if "memo" in current:  # a memo is added, never rewritten: changing one is not the gate's matter
                change.pop("memo", None)
            edited = body["input"] = {**current, **change}
        answer = self.send("post", reviewer, f"/api/approvals/{call.id}", body)
        self.step = f"{reviewer} decided call {call.id}"
        if answer.status_code == 200:
            REACHED[f"a reviewer's {kind} taken"] += 1
        if edited is None or answer.status_code != 200:
            return
        now = self.gates.get(call.tool, call.gate)
        how = widening(
            current, edited, {call.gate.amount, now.amount} - {None}, {call.gate.subject, now.subject} - {None}
        )
        if how:  # by the money and subject it was asked under, or those read now
            read_now = widening(current, edited, {now.amount} - {None}, {now.subject} - {None})
            self.wideners[call.id][reviewer] = (how, read_now is None)
            REACHED["an edit that widens taken"] += 1
        # (a value that is not money in the argument the tool read as money when the call was asked, and
        # reads no more, widens the call: the approvals below then need another reviewer)
        if now.amount and not money(edited.get(now.amount), now.unit)[0]:
            self.fail(
                "amount",
                f"{reviewer}'s edit of call {call.id} was taken with {now.amount}={edited[now.amount]!r} "
                f"({now.unit}), which is not money",
            )

    # --- what the desk promises ---------------------------------------------------------------

    @invariant()
    def the_gate_holds(self):
        self.check_gates()
        self.check_audit()
        self.check_calls()
        problems, self.problems = self.problems, []
        problems = [(kind, words) for kind, words in problems if kind not in SKIP]
        assert not problems, "\n".join(f"[{kind}] {words}" for kind, words in problems)

    def check_gates(self) -> None:
        """4: no tool's gate loosened in this step, unless an admin approved another admin's change."""
        listed = self.send("get", ADMINS[0], "/api/external-tools")
        if listed.status_code != 200:
            return
        now = {tool["name"]: Gate.of(tool) for tool in listed.json["tools"]}
        for name, gate in sorted(now.items()):
            before = self.gates.get(name) or self.seen.get(name) or Gate()
            looser = loosenings(before, gate)
            approver, asker = self.approved.get(name, (None, None))
            if looser and (approver is None or approver == asker):
                # [comeback]: a tool removed and declared again, looser than it was before it went
                kind = "comeback" if name not in self.gates or name in self.came_back else "looser"
                self.fail(kind, f"{name} is looser after {self.step}: {'; '.join(looser)}")
        self.seen.update(now)
        self.gates, self.approved, self.came_back = now, {}, set()

    def check_audit(self) -> None:
        """4, in the audit chain: a policy_changed event that loosens names the one who asked and another."""

        def events(s):
            return s.execute(
                select(AuditEvent.id, AuditEvent.tool_name, AuditEvent.data)
                .where(AuditEvent.id > self.audit_seen, AuditEvent.action == "policy_changed")
                .order_by(AuditEvent.id)
            ).all()

        for event_id, tool, data in self.read(events):
            looser = loosenings(Gate.of_snapshot(data["before"]), Gate.of_snapshot(data["after"]))
            asked, approved = data.get("requested_by"), data.get("approved_by")
            if looser and not (asked and approved and asked != approved):
                self.fail(
                    "audit",
                    f"policy_changed #{event_id} of {tool} loosens ({'; '.join(looser)}) by {asked}, {approved}",
                )
        self.audit_seen = self.read(lambda s: s.scalar(select(func.coalesce(func.max(AuditEvent.id), 0))))

    def check_calls(self) -> None:
        """2 and 3, from the tables."""

        def load(s):
            calls = s.execute(
                select(
                    ToolCall.id,
                    ToolCall.name,
                    ToolCall.status,
                    ToolCall.requires_approval,
                    ToolCall.money_cents,
                    ToolCall.input,
                )
            ).all()
            decisions = s.execute(
                select(Decision.tool_call_id, Decision.reviewer_id, Decision.decision, Decision.arguments_hash)
            ).all()
            return calls, decisions

        calls, decisions = self.read(load)
        approvals = defaultdict(set)
        for call_id, reviewer_id, decision, hashed in decisions:
            if decision == "approve":
                approvals[call_id].add((reviewer_id, hashed))
        totals: dict[str, int] = defaultdict(int)
        self.statuses = {call_id: status for call_id, _, status, *_ in calls}
        for call_id, name, status, waited, cents, arguments in calls:
            if cents is not None and not 0 <= cents <= MAX_MONEY_CENTS:
                self.fail("amount", f"call {call_id} of {name} ({status}) stores money_cents={cents}")
            if status not in MAY_HAVE_RUN:
                continue
            asked = self.calls.get(call_id)
            if asked is None:
                self.fail("rule", f"call {call_id} of {name} is {status}, and the machine never asked for it")
                continue
            if not waited:
                totals[name] += cents or 0
                if not asked.alone:
                    self.fail("rule", f"call {call_id} of {name} waited when asked, and is {status} with no person now")
                continue
            wideners = self.wideners[call_id]
            counted = {
                reviewer
                for reviewer, hashed in approvals[call_id]
                if hashed == arguments_hash(arguments)
                and reviewer in self.reviewer_ids
                and reviewer != self.ids[asked.asker]
            }
            needed = max(asked.gate.approvals, 1)
            if len(counted - {self.ids[who] for who in wideners}) < needed:
                # [reread]: the edit widened the call only as the tool read it when asked (re-declared since)
                by_now = {self.ids[who] for who, (_, only_then) in wideners.items() if not only_then}
                self.fail(
                    "reread" if len(counted - by_now) >= needed else "approvals",
                    f"call {call_id} of {name} is {status} with {len(counted - {self.ids[w] for w in wideners})} of "
                    f"{needed} approvals that count (asked by {asked.asker} with {asked.input} under {asked.gate}, "
                    f"now {arguments} under {self.gates.get(name)}; widened: "
                    f"{ {who: how for who, (how, _) in wideners.items()} or 'by nobody' })",
                )
        for name in sorted(totals.keys() | self.totals.keys()):
            was, now = self.totals.get(name, 0), totals.get(name, 0)
            if now < was:
                self.fail("total", f"what ran of {name} with no person went from {was} to {now} cents")
        self.totals = dict(totals)

    # --- plumbing -----------------------------------------------------------------------------

    def fail(self, kind: str, words: str) -> None:
        self.problems.append((kind, words))

    def send(self, method: str, who: str, url: str, body=None) -> Answer:
        client = self.api.as_(who)
        try:
            response = getattr(client, method)(url, **({"json": body} if body is not None else {}))
        except Exception as exc:  # a request that raised is a 500 too
            self.fail("500", f"{method.upper()} {url} as {who} with {body!r} raised {exc!r}")
            return Answer(500, None)
        said = response.get_json(silent=True)
        code = said.get("error", "") if isinstance(said, dict) and response.status_code >= 400 else ""
        ANSWERS[(method.upper(), route(url), response.status_code, code)] += 1
        if response.status_code >= 500:
            self.fail(
                "500", f"{method.upper()} {url} as {who} with {body!r}: {response.status_code} {response.text[:300]}"
            )
        return Answer(response.status_code, response.get_json(silent=True))


def route(url: str) -> str:
    return "/".join("ID" if part.isdigit() else part for part in url.split("/"))


def people(app) -> dict[str, int]:
    """The machine's people by e-mail, with their ids: the demo's and two of its own (made once)."""
    from webapp.identity import create_user, get_or_create_tenant
    from webapp.runtime.extensions import db

    for email, roles in ((PAIR, ["agent", "reviewer"]), (AGENT2, ["agent"])):
        if db.session.scalar(select(User.id).where(User.email == email)) is None:
            create_user(db.session, email, "gate-password-1", roles, get_or_create_tenant(db.session, "acme"))
    db.session.commit()
    ids = dict(db.session.execute(select(User.email, User.id)).all())
    db.session.remove()
    return ids


# Paths this machine found that nobody listed, each closed with a test of its own in
# tests/api/test_gate_doors.py: [reported] an outside agent's report that a call failed gave back what it
# ran under the limits; [comeback] a tool removed and declared again with "subject": null escaped its limit
# per subject alone; [reread] an edit was weighed by the tool's declaration in force at the edit, not the
# one the call was asked under (a waiting call now keeps what its tool read, `Tool.reading`).
def test_no_path_lets_a_call_past_the_people_its_policy_names(app, api, read, engine, base_env, seeded):
    ids = people(app)
    acme_reviewers = frozenset(
        ids[email] for email in ("reviewer@acme.test", "reviewer2@acme.test", PAIR)
    )  # the tenant's reviewers, as seeded and made above

    class Machine(GateMachine):
        pass

    Machine.api, Machine.read = api, staticmethod(read)
    Machine.reset = staticmethod(lambda: empty_runtime_tables(engine, base_env["REDIS_URL"], seeded))
    Machine.ids, Machine.reviewer_ids = ids, acme_reviewers
    try:
        run_state_machine_as_test(
            Machine,
            settings=settings(
                max_examples=EXAMPLES,
                stateful_step_count=STEPS,
                derandomize=True,  # a fixed seed: the same examples on every run
                deadline=None,
                database=None,  # no example database in the checkout
                phases=PHASES,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
            ),
        )
    finally:  # what the search reached (shown with -s, or under a failure)
        print("answers:", *(f"{n:5} {' '.join(map(str, key))}" for key, n in sorted(ANSWERS.items())), sep="\n")
        print("reached:", *(f"{n:5} {what}" for what, n in sorted(REACHED.items())), sep="\n")
