"""The audit log's query parameters are read in one place (webapp/audit/queries.py, read_query) for the
page, its exports and GET /api/audit: what the API documents is what is enforced, and the page and the
API say the same sentence about the same bad value."""

from __future__ import annotations

import html
import re

import pytest

from tests.clients import session_as
from webapp.audit import queries

AUDITOR = "auditor@acme.test"


def page_errors(text: str) -> list[str]:
    return [html.unescape(error) for error in re.findall(r'<p class="error" role="alert">(.*?)</p>', text)]


def audit_parameters(app) -> dict[str, dict]:
    document = app.test_client().get("/api/openapi.json").json
    return {p["name"]: p["schema"] for p in document["paths"]["/api/audit"]["get"]["parameters"]}


def test_the_api_documents_the_parameters_the_log_reads_with_the_limits_it_enforces(app, api):
    documented = audit_parameters(app)
    assert list(documented) == list(queries.PARAMETERS)
    auditor = api.as_(AUDITOR)

    def status(**query: str) -> tuple[int, str]:
        reply = auditor.get("/api/audit", query_string=query)
        return reply.status_code, reply.json.get("error", "")

    for name, (label, limit) in queries.TEXTS.items():
        assert documented[name]["maxLength"] == limit, name
        assert status(**{name: "x" * limit}) == (200, ""), name
        refused = auditor.get("/api/audit", query_string={name: "x" * (limit + 1)})
        assert refused.status_code == 422 and refused.json["error"] == "invalid_filter", name
        assert refused.json["message"] == f"{label} is at most {limit} characters; yours has {limit + 1}."

    for name in ("conversation", "limit"):
        number = documented[name]["anyOf"][0]
        assert number["type"] == "integer", name
        assert status(**{name: str(number["maximum"])}) == (200, ""), name
        assert status(**{name: str(number["maximum"] + 1)}) == (422, "invalid_filter"), name
        if number["minimum"] > 0:
            assert status(**{name: str(number["minimum"] - 1)}) == (422, "invalid_filter"), name
        assert status(**{name: ""}) == (200, ""), name  # sent empty, as the page's form does: no filter
    for name in queries.DAYS:
        assert documented[name]["anyOf"][0] == {"format": "date", "type": "string"}
        assert status(**{name: "2026-11-29"}) == (200, "") and status(**{name: ""}) == (200, "")
        assert status(**{name: "29/11/2026"}) == (422, "invalid_filter")
    assert status(colour="red") == (422, "invalid_field")  # a parameter the log does not take


@pytest.mark.parametrize(
    "query",
    [
        {"from": "2026-13-40", "action": "model_call"},
        {"from": "2026-02-01", "to": "2026-01-01"},
        {"to": "9999-12-31", "conversation": "#abc"},
        {"conversation": str(queries.MAX_CONVERSATION + 1), "q": "refund\x00"},
        {"person": "p" * 300, "outcome": "o" * 33, "tool": "t" * 129},
    ],
    ids=["bad-day", "days-swapped", "day-out-of-range-and-no-number", "too-big-and-nul", "three-too-long"],
)
def test_the_page_and_the_api_say_the_same_about_bad_values_and_the_page_keeps_what_was_typed(app, api, query):
    reply = api.as_(AUDITOR).get("/api/audit", query_string=query)
    assert reply.status_code == 422 and reply.json["error"] == "invalid_filter"
    page = session_as(app, AUDITOR).get("/audit", query_string=query)
    said = page_errors(page.get_data(as_text=True))
    assert page.status_code == 422 and said
    assert " ".join(said) == reply.json["message"]
    form = page.get_data(as_text=True)
    if "2026-13-40" in query.values():
        assert 'name="from" value="2026-13-40"' in form  # the typed day stays in the form, to mend
        assert '<option value="model_call" selected>' in form  # and the good filter beside it
    if query.get("conversation") == "#abc":
        assert 'value="#abc"' in form
