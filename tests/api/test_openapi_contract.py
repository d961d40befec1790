"""The API against its own document: schemathesis reads GET /api/openapi.json from the running app and
sends each operation generated requests, valid ones (positive) and ones that break the document
(negative: wrong types, unknown fields, values out of range), each with the token of a person of one
role of the seeded tenant (agent, reviewer, auditor, admin). Every answer must be no server error, have
a status the document lists for the operation, and a body that fits the document's schema for it.

Run it alone with:
    PYTHONPATH=. .venv/bin/python -m pytest -q -p no:cacheprovider tests/api/test_openapi_contract.py

Generation is derandomized (the same requests on every run, no flakiness) and bounded (EXAMPLES per
operation and mode). A path's id is, half the time, that of a seeded row (a conversation waiting for a
decision, a failed one, one out of budget; a call waiting for a decision; a spare token), so the answers
include the documented successes, not only 404s.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy import select

from tests.api.test_bodies import leaves, raw_with
from tests.model_server import Reply
from tests.replies import reply, tool_use
from webapp.identity import issue_token
from webapp.models import Conversation, ToolCall, User
from webapp.runtime.extensions import db
from webapp.runtime.services import services

# Per operation and generation mode; CONTRACT_EXAMPLES=500 for a longer search on a quiet machine.
EXAMPLES = int(os.environ.get("CONTRACT_EXAMPLES", "30"))
# How every search here runs: the same examples each run (no database of past failures), no deadline
# on a slow request, and no health check stopping a search whose requests the app answers slowly.
SEARCH = {
    "deadline": None,
    "derandomize": True,
    "database": None,
    "phases": [Phase.explicit, Phase.generate],
    "suppress_health_check": list(HealthCheck),
}
ROLE_USERS = {
    "agent": "agent@acme.test",
    "reviewer": "reviewer@acme.test",
    "auditor": "auditor@acme.test",
    "admin": "admin@acme.test",
}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@dataclass
class Run:
    """What one mode's run sent and what it found."""

    cases: int = 0
    statuses: Counter = field(default_factory=Counter)
    failures: dict[tuple[str, str], str] = field(default_factory=dict)  # (operation, problem) -> the request
    unbreakable: list[str] = field(default_factory=list)  # operations without negative cases
    refused: list[str] = field(default_factory=list)  # the requests answered 422

    def report(self) -> str:
        lines = [f"{len(self.failures)} distinct failures in {self.cases} cases:"]
        for (operation, problem), request in sorted(self.failures.items()):
            lines.append(f"- {operation}: {problem}\n    {request}")
        return "\n".join(lines)


@pytest.fixture
def desk(app, api, model):
    """The seeded tenant with rows worth asking about, a token per role, and the document as loaded by
    schemathesis from the app (the web twin: each request in an app context of its own)."""
    model.enqueue(
        Reply.message(reply(tool_use("issue_refund", {"invoice_id": 4471, "amount_cents": 6000, "reason": "late"})))
    )
    agent = api.as_(ROLE_USERS["agent"])
    waiting = agent.post("/api/conversations", json={"message": "refund please"}).json["id"]
    services().loop(db.session, db.session.get(Conversation, waiting)).complete()
    call = db.session.scalar(select(ToolCall.id).where(ToolCall.conversation_id == waiting))
    failed = agent.post("/api/conversations", json={"message": "this one fails"}).json["id"]
    exhausted = agent.post("/api/conversations", json={"message": "this one runs out"}).json["id"]
    db.session.execute(
        Conversation.__table__.update()
        .where(Conversation.id == failed)
        .values(status="failed", error_code="model_error", error_message="The model did not answer.")
    )
    db.session.execute(
        Conversation.__table__.update().where(Conversation.id == exhausted).values(status="budget_exhausted")
    )
    owner = db.session.scalar(select(User).where(User.email == ROLE_USERS["agent"]))
    spares = [issue_token(db.session, owner, f"spare {n}")[0].id for n in range(2)]
    db.session.commit()
    tokens = {role: api.token(email) for role, email in ROLE_USERS.items()}
    db.session.remove()
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", app.config["WEB_TWIN"])
    # The token is ours (one per role), never generated or left out: 401s have their own tests.
    schema.config.generation.update(with_security_parameters=False)
    # A body over MAX_REQUEST_BYTES is refused too (413 too_large, in the document), before it is read.
    rejection = schema.config.checks.negative_data_rejection
    rejection.expected_statuses = [*rejection.expected_statuses, "413"]
    known = {
        "conversation_id": [waiting, failed, exhausted],
        "tool_call_id": [call],
        "token_id": spares,
    }
    return schema, tokens, known, app


def run_mode(desk, mode: GenerationMode) -> Run:
    schema, tokens, known, app = desk
    run = Run()
    for result in schema.get_all_operations():
        operation = result.ok()
        name = f"{operation.method.upper()} {operation.path}"
        if "text/event-stream" in json.dumps(operation.definition.raw.get("responses", {})):
            continue  # a stream answers for minutes: tests/api/test_event_stream.py checks it
        allowed = app.view_functions[f"api.{operation.definition.raw['operationId']}"].allowed_roles
        # Mostly a role the operation is for (its answers are the interesting ones), sometimes any role.
        roles = sorted(tokens) + 3 * sorted(set(tokens) & set(allowed if allowed != "public" else tokens))
        try:
            strategy = operation.as_strategy(generation_mode=mode)
        except Exception as exc:  # an operation with nothing to break has no negative cases
            run.failures[(name, f"no {mode.value} cases: {exc}")] = ""
            continue

        @settings(max_examples=EXAMPLES, **SEARCH)
        @given(case=strategy, role=st.sampled_from(roles), seeded=st.booleans(), data=st.data())
        def send(case, role, seeded, data):
            if seeded and not _path_is_broken(case):
                for parameter, ids in known.items():
                    if case.path_parameters and parameter in case.path_parameters:
                        case.path_parameters[parameter] = data.draw(st.sampled_from(ids))
            db.session.remove()  # the test holds no transaction (SQLite: no lock) while the app answers
            response = case.call(headers={"Authorization": f"Bearer {tokens[role]}"})
            run.cases += 1
            run.statuses[response.status_code] += 1
            if response.status_code == 422:
                run.refused.append(_shown(case, role, response))
            try:
                case.validate_response(
                    response, checks=CHECKS + ([negative_data_rejection] if mode == GenerationMode.NEGATIVE else [])
                )
            except FailureGroup as group:
                for failure in group.exceptions:
                    run.failures.setdefault((name, failure.title), _shown(case, role, response))  # noqa: B023 (run at once)
            except AssertionError as exc:
                run.failures.setdefault((name, str(exc).splitlines()[0]), _shown(case, role, response))  # noqa: B023
            _keep_tokens_alive(tokens, case, response)

        try:
            send()
        except Unsatisfiable:  # nothing in the operation can be broken (no body, no parameters)
            run.unbreakable.append(name)
    db.session.remove()
    return run


def _path_is_broken(case) -> bool:
    """Whether a negative case's broken part is its path (an id of a seeded row would mend it)."""
    components = case.meta.components if case.meta else {}
    return any(location.name == "PATH" and info.mode.is_negative for location, info in components.items())


def _shown(case, role: str, response) -> str:
    body = "" if case.body is None or not isinstance(case.body, dict | list | str | int | float) else case.body
    return (
        f"as {role}: {case.method} {case.formatted_path} query={case.query} body={json.dumps(body)[:300]} "
        f"-> {response.status_code} {response.text[:300]}"
    )


def _keep_tokens_alive(tokens: dict[str, str], case, response) -> None:
    """A generated DELETE /api/tokens/{id} may revoke a role's own token (an admin may revoke their
    people's): that role gets a new one, so the rest of the run is not all 401s."""
    if case.method != "DELETE" or response.status_code != 200:
        return
    revoked = response.json().get("email")
    for role, email in ROLE_USERS.items():
        if email == revoked:
            user = db.session.scalar(select(User).where(User.email == email))
            tokens[role] = issue_token(db.session, user, "contract")[1]
            db.session.commit()
    db.session.remove()


def test_positive_cases_answer_as_the_document_says(desk):
    run = run_mode(desk, GenerationMode.POSITIVE)
    print(f"positive: {run.cases} cases, statuses {dict(sorted(run.statuses.items()))}")
    assert not run.failures, run.report()
    assert run.cases >= 13 * EXAMPLES // 2
    assert {200, 201, 202} <= set(run.statuses), run.statuses  # successes too, not only refusals


def test_negative_cases_are_refused_as_the_document_says(desk):
    run = run_mode(desk, GenerationMode.NEGATIVE)
    print(f"negative: {run.cases} cases, statuses {dict(sorted(run.statuses.items()))}")
    assert not run.failures, run.report()
    assert 500 not in run.statuses
    assert {400, 404, 422} <= set(run.statuses), run.statuses


# --- odd values in generated bodies -----------------------------------------------------------------

ODD_EXAMPLES = int(os.environ.get("CONTRACT_ODD_EXAMPLES", "4"))
ODD = {  # as written in the JSON: what no generator sends (schemathesis writes JSON with Python's json)
    "a lone surrogate": '"x\\ud800"',
    "a 30-digit integer": "1" * 30,
    "1e308": "1e308",
    "1e400": "1e400",
}
# Values a generated body gets half the time, so that bodies reach past "no such tool" to the checks
# and records behind it: a tool declared for the test, a schema it could be declared with.
KNOWN_VALUES = {
    "tool": "transfer",
    "input_schema": {"type": "object", "title": "Transfer", "properties": {"memo": {"type": "string"}}},
}


def test_odd_values_in_any_field_of_a_generated_body_are_never_a_server_error(desk):
    """Each operation that takes a body gets valid generated bodies with each of their values (at any
    depth) made each of the odd values in turn, and with an unknown field: no answer is a 500, and what
    no field can keep (a lone surrogate, 1e400) or an unknown field is a 422."""
    from tests.conftest import WebClient

    schema, tokens, known, app = desk
    client = WebClient(app)
    declared = client.put(
        "/api/external-tools/transfer",
        json={"description": "Send money.", "input_schema": {"type": "object", "additionalProperties": True}},
        headers={"Authorization": f"Bearer {tokens['admin']}"},
    )
    assert declared.status_code == 200, declared.json
    ask = {"source": "bot", "tool": "transfer", "input": {}, "context": "Due.", "idempotency_key": "odd"}
    asked = client.post("/api/calls", json=ask, headers={"Authorization": f"Bearer {tokens['agent']}"})
    known = {**known, "name": ["transfer"], "tool": ["issue_refund"], "call_id": [asked.json["id"]]}
    failures: list[str] = []
    sent = Counter()
    for result in schema.get_all_operations():
        operation = result.ok()
        if "requestBody" not in operation.definition.raw:
            continue
        allowed = app.view_functions[f"api.{operation.definition.raw['operationId']}"].allowed_roles
        role = sorted(set(tokens) & set(allowed if allowed != "public" else tokens))[0]

        @settings(max_examples=ODD_EXAMPLES, **SEARCH)
        @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE), data=st.data())
        def send(case, data):
            for parameter, ids in known.items():  # noqa: B023 (run at once)
                if case.path_parameters and parameter in case.path_parameters:
                    case.path_parameters[parameter] = data.draw(st.sampled_from(ids))
            body = dict(case.body) if isinstance(case.body, dict) else {}
            for name, value in KNOWN_VALUES.items():
                if name in body and data.draw(st.booleans()):
                    body[name] = value
            variants = [
                (path, label, raw_with(body, path, written))
                for path in [*leaves(body), ("colour",)]
                for label, written in ODD.items()
            ]
            variants.append((("colour",), "an unknown field", json.dumps({**body, "colour": "red"})))
            for path, label, raw in variants:
                db.session.remove()
                response = client.open(
                    case.formatted_path,
                    method=case.method,
                    query_string=case.query,
                    data=raw,
                    content_type="application/json",
                    headers={"Authorization": f"Bearer {tokens[role]}"},  # noqa: B023 (run at once)
                )
                sent[response.status_code] += 1
                refused = label in ("a lone surrogate", "1e400", "an unknown field")
                if response.status_code >= 500 or (refused and response.status_code not in (400, 404, 413, 422)):
                    failures.append(  # noqa: B023 (run at once)
                        f"{case.method} {case.formatted_path} {'.'.join(map(str, path))} = {label}: "
                        f"{response.status_code} {response.get_data(as_text=True)[:200]}"
                    )

        send()
    print(f"odd values: statuses {dict(sorted(sent.items()))}")
    assert not failures, "\n".join(failures)
    assert 422 in sent
