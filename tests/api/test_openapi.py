"""GET /api/openapi.json: the API's OpenAPI 3.1 document, built from the routes' declarations and the
request and response models (webapp/api/openapi.py), with every route of the api blueprint in it."""

from __future__ import annotations

import re

from webapp.api.bodies import MAX_ID

AGENT = "agent@acme.test"


def api_operations(app) -> set[tuple[str, str]]:
    """(method, OpenAPI path) of every route of the api blueprint, read from the app's url_map."""
    found = set()
    for rule in app.url_map.iter_rules():
        if not rule.endpoint.startswith("api."):
            continue
        path = re.sub(r"<(?:[^<>:]+:)?([^<>]+)>", r"{\1}", rule.rule)
        found |= {(method.lower(), path) for method in rule.methods - {"HEAD", "OPTIONS"}}
    return found


def test_the_document_is_served_without_a_token_and_lists_every_route_of_the_api(app):
    response = app.test_client().get("/api/openapi.json")
    assert response.status_code == 200 and response.mimetype == "application/json"
    document = response.json
    assert document["openapi"] == "3.1.0"
    listed = {(method, path) for path, operations in document["paths"].items() for method in operations}
    missing = api_operations(app) - listed
    assert not missing, f"routes of the api blueprint missing from /api/openapi.json: {sorted(missing)}"
    assert listed == api_operations(app)
    assert document["paths"]["/api/openapi.json"]["get"]["security"] == []
    assert document["security"] == [{"bearer": []}]
    assert document["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": document["components"]["securitySchemes"]["bearer"]["description"],
    }


def test_a_valid_token_is_no_different_and_the_document_is_the_same_each_time(app, api):
    anonymous = app.test_client().get("/api/openapi.json").json
    assert api.as_(AGENT).get("/api/openapi.json").json == anonymous


def test_every_reference_resolves_and_every_error_has_the_shared_error_schema(app):
    document = app.test_client().get("/api/openapi.json").json
    schemas = document["components"]["schemas"]
    text = repr(document)
    for name in re.findall(r"#/components/schemas/([A-Za-z0-9_]+)", text):
        assert name in schemas, f"{name} is referred to but not in components"
    assert set(schemas["Error"]["required"]) == {"error", "message"}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            assert operation["responses"], (method, path)
            for status, answer in operation["responses"].items():
                if status == "200" and "text/event-stream" in answer["content"]:  # a stream of events
                    assert path.endswith("/events"), (method, path)
                    continue
                schema = answer["content"]["application/json"]["schema"]
                if status.startswith(("4", "5")):
                    assert schema == {"$ref": "#/components/schemas/Error"}, (method, path, status)
            if path != "/api/openapi.json":
                assert "401" in operation["responses"], (method, path)


def test_requests_are_closed_and_strict_in_the_document(app):
    document = app.test_client().get("/api/openapi.json").json
    schemas = document["components"]["schemas"]
    budget = schemas["ExtendBudget"]
    assert budget["additionalProperties"] is False
    assert budget["properties"]["moves"]["type"] == "integer"
    assert (budget["properties"]["moves"]["minimum"], budget["properties"]["moves"]["maximum"]) == (1, 1000)
    decide = document["paths"]["/api/approvals/{tool_call_id}"]["post"]
    assert decide["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/DecideApproval"
    }
    assert {"403", "404", "409", "422"} <= set(decide["responses"])
    (tool_call_id,) = decide["parameters"]
    assert tool_call_id["schema"] == {"type": "integer", "minimum": 1, "maximum": MAX_ID}
    listing = document["paths"]["/api/tokens"]["get"]
    assert [p["name"] for p in listing["parameters"]] == ["user_id"]
    assert listing["parameters"][0]["schema"]["type"] == "integer"
    audit = document["paths"]["/api/audit"]["get"]
    assert {p["name"] for p in audit["parameters"]} >= {"from", "to", "cursor", "limit", "conversation"}
    assert "403" in audit["responses"] and "404" not in audit["responses"]


def test_ids_beyond_64_bits_are_not_found_rather_than_a_server_error(api):
    agent = api.as_(AGENT)
    for url in (f"/api/conversations/{MAX_ID + 1}", "/api/conversations/0", f"/api/tokens/{10**30}"):
        method = agent.delete if url.startswith("/api/tokens") else agent.get
        response = method(url)
        assert response.status_code == 404 and response.json["error"] == "not_found", url
    assert agent.get(f"/api/conversations/{MAX_ID}").status_code == 404


def test_query_parameters_are_closed_and_typed(api):
    admin = api.as_("admin@acme.test")
    unknown = admin.get("/api/tokens?user=3")
    assert unknown.status_code == 422
    assert unknown.json["fields"] == [{"field": "user", "problem": "is not a field of this request"}]
    for value in ("abc", "5.0", "+5", "-1", "0", str(10**30)):
        response = admin.get(f"/api/tokens?user_id={value}")
        assert response.status_code == 422, value
        assert response.json["fields"][0]["field"] == "user_id"
        assert "number of a person" in response.json["message"]
    auditor = api.as_("auditor@acme.test")
    assert auditor.get("/api/audit?limit=7").status_code == 200
    response = auditor.get("/api/audit?limit=7&colour=red")
    assert response.status_code == 422
    assert response.json["fields"] == [{"field": "colour", "problem": "is not a field of this request"}]
    assert response.json["message"] == '"colour" is not a field of this request.'
    mistyped = auditor.get("/api/audit?limit=7.5")
    assert mistyped.status_code == 422 and mistyped.json["error"] == "invalid_filter"
    assert "“limit” must be a whole number from 1 to 500." in mistyped.json["message"]


def test_ids_no_row_can_have_are_not_found_on_every_database(api):
    """Ids are INTEGER columns (32-bit on PostgreSQL, which refuses to compare a larger number with them):
    such an id is a 404, and the audit log's conversation filter says it names no conversation."""
    big = 2**31
    assert api.as_(AGENT).get(f"/api/conversations/{big}").status_code == 404
    assert api.as_("reviewer@acme.test").post(f"/api/approvals/{big}", json={"decision": "approve"}).status_code == 404
    admin = api.as_("admin@acme.test")
    assert admin.delete(f"/api/tokens/{big}").json["error"] == "not_found"
    response = admin.get(f"/api/tokens?user_id={big}")
    assert response.status_code == 404 and response.json["message"] == "There is no such user in your organisation."
    audit = admin.get(f"/api/audit?conversation={big}")
    assert audit.status_code == 422 and "The conversation is a number" in audit.json["message"]
    assert admin.get(f"/api/audit?conversation={big - 1}").json == {"events": [], "next_cursor": None}


def test_text_with_a_nul_character_is_refused_by_name_on_every_database(api, read):
    """PostgreSQL's text and JSON cannot hold U+0000, so no text the desk keeps may: a 422 naming the field,
    never a 500 (SQLite alone would have taken it)."""
    from sqlalchemy import func, select

    from webapp.models import Conversation

    agent = api.as_(AGENT)
    for sent in ({"message": "refund\x00 please"}, {"message": "hi", "\x00": 1}):
        response = agent.post("/api/conversations", json=sent)
        assert response.status_code == 422 and response.json["error"] == "invalid_field", sent
        assert "NUL character" in response.json["message"]
    assert read(lambda s: s.scalar(select(func.count(Conversation.id)))) == 0
    decided = api.as_("reviewer@acme.test").post(
        "/api/approvals/1", json={"decision": "approve", "input": {"reason": ["late\x00"]}}
    )
    assert decided.status_code == 422 and decided.json["fields"][0]["field"] == "input.reason"
    audit = api.as_("auditor@acme.test").get("/api/audit", query_string={"q": "refund\x00"})
    assert audit.status_code == 422 and audit.json["error"] == "invalid_filter"
    assert audit.json["message"] == "The search text cannot contain the NUL character (\\u0000)."
