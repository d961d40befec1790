"""The JSON API: bearer tokens, the same actions the pages have, errors as {"error", "message"} (with
"fields" when a request's fields are wrong). Bodies in and out are the models of webapp/api/schemas.py."""

from __future__ import annotations

from collections.abc import Callable

from flask import Blueprint, current_app, g, jsonify, request
from pydantic import BaseModel
from sqlalchemy import func, select
from werkzeug.exceptions import HTTPException

from webapp import secret_grants, webhooks
from webapp.accounts import actions as accounts
from webapp.agent import outside
from webapp.agent import policies as policy_rules
from webapp.agent.decisions import approvals_so_far, held_words
from webapp.agent.states import CallStatus
from webapp.agent.transcript import api_messages
from webapp.api.openapi import document, documented
from webapp.api.schemas import (
    ApprovalList,
    ApprovalsQuery,
    ApprovalView,
    AskCall,
    AuditPage,
    AuditQuery,
    BudgetExtended,
    CallQuery,
    CallView,
    CancelCall,
    CancelConversation,
    CancelRequested,
    ClaimApproval,
    ConversationList,
    ConversationsQuery,
    ConversationState,
    ConversationSummary,
    ConversationView,
    CreateWebhook,
    DecideApproval,
    DecidePolicyChange,
    DeclareTool,
    DeliveriesQuery,
    ExtendBudget,
    ExternalToolDeclared,
    ExternalToolList,
    ExternalToolView,
    FieldProblem,
    GiveInput,
    InvalidFields,
    OpenApiDocument,
    PolicyChangeDecided,
    PolicyChangeList,
    PolicyChangesQuery,
    PolicyChangeView,
    PolicyChangeWaiting,
    PolicyList,
    PolicySaved,
    PolicyView,
    PostMessage,
    ReleaseClaim,
    RemoveWebhook,
    ReportOutcome,
    RevokeToken,
    RunCreated,
    RunView,
    SecretList,
    SetPolicy,
    StartConversation,
    StartRun,
    TokenList,
    TokensQuery,
    TokenView,
    ToolCallView,
    Usage,
    WebhookCreated,
    WebhookDeliveryList,
    WebhookDeliveryView,
    WebhookList,
    WebhookView,
    body,
    known_names,
    optional_body,
    query,
)
from webapp.approvals import actions as approvals
from webapp.approvals import outside as outside_actions
from webapp.approvals import queries as inbox
from webapp.approvals.queries import InboxFilters
from webapp.audit import queries as audit_queries
from webapp.conversations import actions as conversations
from webapp.conversations import event_stream
from webapp.identity import token_state
from webapp.models import ROLES, Conversation, Message, ModelCall, ToolCall, User
from webapp.runs import actions as runs
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.settings import external_tools, policy_actions, webhook_actions
from webapp.tools import external
from webapp.web.errors import Refused, json_error
from webapp.web.pagination import BadCursor, Page
from webapp.web.security import api_roles, public, takes_up_to

bp = Blueprint("api", __name__, url_prefix="/api")
OTHER_AGENTS = "forbidden: the conversation is another agent's."


def answer(view: BaseModel, status: int = 200):
    """A response body model as JSON."""
    return jsonify(view.model_dump(mode="json")), status


@bp.errorhandler(InvalidFields)
def _invalid_fields(exc: InvalidFields):
    db.session.rollback()
    return answer(exc.view(), exc.status)


@bp.errorhandler(Refused)
def _api_error(exc: Refused):
    db.session.rollback()
    if isinstance(exc, approvals.EditRefused | outside_actions.OutsideRefused):  # what to change, for programs
        fields = [{"field": f"input.{name}" if name else "input", "problem": p} for name, p in exc.problems.items()]
        if not fields and getattr(exc, "field", None):
            fields = [{"field": exc.field, "problem": exc.message}]
        if fields:
            return jsonify(error=exc.code, message=exc.message, fields=fields), exc.status
    return json_error(exc.status, exc.code, exc.message)


@bp.errorhandler(HTTPException)
def _http_error(exc: HTTPException):
    db.session.rollback()
    messages = {
        400: ("bad_request", "The request could not be read; send a JSON object."),
        404: ("not_found", "There is no such resource."),
        405: ("method_not_allowed", "This URL does not accept that method."),
        413: ("too_large", "The request body is too large."),
    }
    code, message = messages.get(exc.code, ("http_error", exc.description or "Request failed."))
    return json_error(exc.code or 500, code, message)


@bp.errorhandler(Exception)
def _unexpected(exc: Exception):
    db.session.rollback()
    current_app.logger.exception("unexpected API error")
    return json_error(500, "internal_error", "Something went wrong on our side; nothing was changed.")


def conversation_or_404(conversation_id: int) -> Conversation:
    return conversations.find(db.session, g.user, conversation_id)


# --- conversations ------------------------------------------------------------------------------


@bp.post("/conversations")
@documented("Start a conversation", body=StartConversation, responses={201: ConversationState})
@api_roles("agent")
def create_conversation():
    sent = body(StartConversation)
    conversation = conversations.start(db.session, g.user, sent.message)
    return answer(ConversationState.of(conversation), 201)


@bp.get("/conversations")
@documented("List conversations", query=ConversationsQuery, responses={200: ConversationList})
@api_roles(*ROLES)
def list_conversations():
    """The conversations the caller may see (agents: their own), newest first, a page at a time."""
    asked = query(ConversationsQuery)
    page = a_page(
        lambda: conversations.listing(
            db.session,
            g.user,
            status=asked.status,
            started_by=asked.started_by,
            since=asked.since,
            cursor=asked.cursor,
            limit=asked.limit or 50,
        )
    )
    return answer(
        ConversationList(
            conversations=[ConversationSummary.of(row, email) for row, email in page.rows], next_cursor=page.next_cursor
        )
    )


@bp.post("/conversations/<int:conversation_id>/messages")
@documented(
    "Write in a conversation",
    body=PostMessage,
    responses={202: ConversationState},
    errors={
        403: "forbidden: only the agent who started the conversation writes in it.",
        409: "conversation_busy: the assistant is working or a call waits for a decision.",
    },
)
@api_roles("agent")
def post_message(conversation_id: int):
    sent = body(PostMessage)
    conversation = conversation_or_404(conversation_id)
    conversations.post_message(db.session, g.user, conversation, sent.message)
    return answer(ConversationState.of(conversation), 202)


@bp.get("/conversations/<int:conversation_id>")
@documented("Read a conversation", responses={200: ConversationView}, errors={403: OTHER_AGENTS})
@api_roles(*ROLES)
def get_conversation(conversation_id: int):
    return answer(conversation_view(conversation_or_404(conversation_id)))


@bp.get("/conversations/<int:conversation_id>/events")
@documented(
    "Follow a conversation's events",
    responses={},
    stream=(
        "Server-sent events: each of the conversation's events as the event webhooks send it (`id` its "
        "webhook-id, `event` its type, `data` its JSON body: {type, timestamp, data}), then `text` events "
        '({"text"}: the reply being written, no id). Resumable: send the last id seen as Last-Event-ID. '
        "The stream ends after five minutes; reconnect with Last-Event-ID."
    ),
    errors={
        403: OTHER_AGENTS,
        422: "invalid_field: a Last-Event-ID this stream did not send.",
        429: "too_many_streams: too many live streams open for you or this server.",
        503: "unavailable: live events cannot be had now.",
    },
)
@api_roles(*ROLES)
def conversation_events(conversation_id: int):
    """The conversation's events from the start (or after Last-Event-ID), then live."""
    conversation = conversation_or_404(conversation_id)
    after = event_stream.last_seen(request.headers.get("Last-Event-ID"))
    token = request.headers.get("Authorization", "").partition(" ")[2].strip()
    return event_stream.stream(current_app._get_current_object(), conversation, g.user.id, token, after)


@bp.post("/conversations/<int:conversation_id>/cancel")
@documented(
    "Stop a conversation",
    body=CancelConversation,
    body_required=False,
    responses={202: CancelRequested},
    errors={403: OTHER_AGENTS, 409: "not_running: the conversation has stopped already."},
)
@api_roles("agent", "reviewer", "admin")
def cancel_conversation(conversation_id: int):
    optional_body(CancelConversation)  # (it takes no field: only an empty body, or {})
    conversation = conversation_or_404(conversation_id)
    conversations.cancel(db.session, g.user, conversation)
    return answer(CancelRequested.of(conversation), 202)


@bp.post("/runs")
@takes_up_to(runs.MAX_FILE_BYTES)
@documented(
    "Start a bulk run",
    body=StartRun,
    responses={201: RunCreated},
    errors={422: "invalid_field: an item is empty or too long, or there are more than 10,000 (each named)."},
)
@api_roles("agent")
def create_run():
    """Each item becomes a conversation of the caller's, started in the background."""
    sent = body(StartRun)
    run = runs.create(
        db.session, g.user, [item.message for item in sent.items], batch=sent.batch, title=sent.title or ""
    )
    return answer(RunCreated(id=run.id), 201)


@bp.get("/runs/<int:run_id>")
@documented("Read a bulk run", responses={200: RunView}, errors={403: "forbidden: the run is another agent's."})
@api_roles(*ROLES)
def get_run(run_id: int):
    run = runs.find(db.session, g.user, run_id)
    return answer(RunView.of(run, runs.figures(db.session, run)))


@bp.post("/runs/<int:run_id>/cancel")
@documented(
    "Stop a bulk run",
    responses={202: RunView},
    errors={
        403: "forbidden: only the run's agent, reviewers and admins stop it.",
        409: "already_cancelled: the run was stopped already.",
    },
)
@api_roles("agent", "reviewer", "admin")
def cancel_run(run_id: int):
    """No more of its items start, and each of its conversations still moving or waiting stops."""
    run = runs.find(db.session, g.user, run_id)
    runs.cancel(db.session, g.user, run)
    return answer(RunView.of(run, runs.figures(db.session, run)), 202)


@bp.post("/conversations/<int:conversation_id>/retry")
@documented(
    "Retry a failed conversation",
    responses={202: ConversationState},
    errors={403: OTHER_AGENTS, 409: "not_failed: only a failed conversation is retried."},
)
@api_roles("agent", "reviewer", "admin")
def retry_conversation(conversation_id: int):
    conversation = conversation_or_404(conversation_id)
    conversations.retry(db.session, g.user, conversation)
    return answer(ConversationState.of(conversation), 202)


@bp.post("/conversations/<int:conversation_id>/budget")
@documented(
    "Give a conversation more moves",
    body=ExtendBudget,
    responses={202: BudgetExtended},
    errors={409: "not_exhausted: the conversation is not out of budget."},
)
@api_roles("reviewer", "admin")
def extend_budget(conversation_id: int):
    sent = body(ExtendBudget)
    conversation = conversation_or_404(conversation_id)
    conversations.extend_budget(db.session, g.user, conversation, sent.moves)
    return answer(BudgetExtended.of(conversation, move_budget=conversation.move_budget), 202)


# --- approvals ----------------------------------------------------------------------------------


@bp.get("/approvals")
@documented(
    "List the calls waiting for a decision",
    query=ApprovalsQuery,
    responses={200: ApprovalList},
    errors={422: "invalid_filter: a filter the inbox page would ignore; the message says what to send."},
)
@api_roles("reviewer")
def list_approvals():
    """The tenant's waiting calls, oldest first, a page at a time: a call that waits is on one page."""
    asked = query(ApprovalsQuery)
    filters, problems = InboxFilters.read(request.args)  # as the inbox page reads them
    if problems:
        raise Refused(422, "invalid_filter", " ".join(problems))
    page = a_page(lambda: inbox.pending_page(db.session, g.user, asked.cursor, asked.limit or 200, filters))
    tools = tenant_tools()
    return answer(
        ApprovalList(approvals=[ToolCallView.of(call, tools) for call in page.rows], next_cursor=page.next_cursor)
    )


@bp.get("/approvals/<int:tool_call_id>")
@documented("Read a call to decide, with the facts beside it", responses={200: ApprovalView})
@api_roles("reviewer")
def get_approval(tool_call_id: int):
    call = approvals.find_call(db.session, g.user, tool_call_id)
    waiting = call.status == CallStatus.AWAITING_APPROVAL
    tool = services().tools_for(db.session, call.tenant_id).get(call.name) if waiting else None
    held = held_words(call.name) if tool is not None and tool.unavailable() else None
    return answer(
        ApprovalView.of_call(call, tenant_tools(), approvals.review(db.session, call) if waiting else None, held)
    )


@bp.post("/approvals/<int:tool_call_id>")
@documented(
    "Approve, edit and approve, or reject a call",
    body=DecideApproval,
    responses={200: ToolCallView},
    errors={
        403: "not_allowed: the reviewer asked for the call themself (four eyes).",
        409: "already_decided, arguments_changed (the message says by whom and when, or what changed), or held.",
        422: "reason_required: a rejection needs a reason; invalid_input: `input` the tool would refuse.",
    },
)
@api_roles("reviewer")
def decide_approval(tool_call_id: int):
    sent = body(DecideApproval)
    call = approvals.decide(
        db.session,
        g.user,
        tool_call_id,
        sent.decision,
        sent.reason,
        arguments_seen=sent.arguments_hash,
        edited_input=sent.edited(),
    )
    return answer(ToolCallView.of(call, tenant_tools()))


@bp.post("/approvals/<int:tool_call_id>/claim")
@documented(
    "Hold a waiting call while you review it (again: the time starts over)",
    body=ClaimApproval,
    body_required=False,
    responses={200: ToolCallView},
    errors={
        403: "not_allowed: the call comes from the reviewer's own conversation.",
        409: "claimed: another reviewer holds it (the message names them; send take_over); not_waiting.",
    },
)
@api_roles("reviewer")
def claim_approval(tool_call_id: int):
    sent = optional_body(ClaimApproval)
    return answer(
        ToolCallView.of(approvals.claim(db.session, g.user, tool_call_id, take_over=sent.take_over), tenant_tools())
    )


@bp.delete("/approvals/<int:tool_call_id>/claim")
@documented(
    "Give up your claim on a call",
    body=ReleaseClaim,
    body_required=False,
    responses={200: ToolCallView},
    errors={409: "claimed: another reviewer holds it (the message names them)."},
)
@api_roles("reviewer")
def release_approval(tool_call_id: int):
    optional_body(ReleaseClaim)  # (it takes no field: only an empty body, or {})
    return answer(ToolCallView.of(approvals.release(db.session, g.user, tool_call_id), tenant_tools()))


# --- tasks --------------------------------------------------------------------------------------


@bp.post("/tool-calls/<int:tool_call_id>/input")
@documented(
    "Give a waiting task its input",
    body=GiveInput,
    responses={202: ToolCallView},
    errors={
        403: OTHER_AGENTS,
        409: "not_waiting_for_input: the task does not wait for input, or still checks the last one.",
    },
)
@api_roles("agent", "reviewer", "admin")
def give_input(tool_call_id: int):
    sent = body(GiveInput)
    call = conversations.give_input(db.session, g.user, tool_call_id, sent.input)
    return answer(ToolCallView.of(call, tenant_tools()), 202)


# --- policies -------------------------------------------------------------------------------------

# The policy form's fields, as the API names them (a PolicyError names the form's).
_POLICY_FIELDS = {
    "mode": "mode",
    "amount_threshold": "threshold_cents",
    "approvals_required": "approvals",
    "ttl_hours": "ttl_seconds",
    "remind_after_minutes": "remind_after_seconds",
}


@bp.get("/policies")
@documented("List the tools' policies", responses={200: PolicyList})
@api_roles("admin")
def list_policies():
    """Every tool of the tenant (built-in and MCP) with the policy in force."""
    tools = services().tools_for(db.session, g.user.tenant_id)
    pending = policy_actions.changes(db.session, g.user.tenant_id)
    views = []
    for name in sorted(tools.names()):
        policy = policy_rules.policy_for(db.session, g.user.tenant_id, tools.get(name))
        views.append(PolicyView.of(policy, [change.id for change in pending if change.tool_name == name]))
    return answer(PolicyList(policies=views))


@bp.put("/policies/<tool>")
@documented(
    "Set a tool's policy",
    body=SetPolicy,
    responses={200: PolicySaved, 202: PolicyChangeWaiting},
    errors={422: "invalid_policy: a policy the tool cannot have (the message says why, `fields` which field)."},
)
@api_roles("admin")
def set_policy(tool: str):
    """Stricter (or unchanged): in force at once (200). Looser: waits for another admin (202)."""
    sent = body(SetPolicy)
    found = services().tools_for(db.session, g.user.tenant_id).get(tool)
    if found is None:
        raise Refused(404, "not_found", f"There is no tool named {tool[:128]} in your organisation.")
    values = policy_values(sent)(policy_rules.policy_for(db.session, g.user.tenant_id, found))
    try:
        saved = policy_actions.change_policy(db.session, g.user, found, **values)
    except policy_rules.PolicyError as exc:
        return policy_refused(exc)
    if saved.change is not None:
        return answer(PolicyChangeWaiting(change=PolicyChangeView.of(saved.change)), 202)
    return answer(PolicySaved(policy=PolicyView.of(saved.policy)))


def policy_values(sent: SetPolicy) -> Callable[[policy_rules.Policy], dict]:
    """The policy a request sets, as change_policy's keyword arguments, from the policy in force now
    (what the request leaves out stays as it is)."""
    if sent.mode == "above_amount" and sent.threshold_cents is None:
        raise InvalidFields([FieldProblem(field="threshold_cents", problem="is required with above_amount")], [])

    def values(now: policy_rules.Policy) -> dict:
        limits = sent.limits.model_dump() if sent.limits is not None else None
        asked = {
            "mode": sent.mode,
            "amount_threshold_cents": sent.threshold_cents,
            "approvals_required": sent.approvals or max(now.approvals_required, 1),
            "ttl_seconds": sent.ttl_seconds or now.ttl_seconds,
            "limits": policy_rules.Limits(**limits) if limits is not None else None,
        }
        if "remind_after_seconds" in sent.model_fields_set:
            asked["remind_after_seconds"] = sent.remind_after_seconds
        return asked

    return values


def policy_refused(exc: policy_rules.PolicyError, prefix: str = ""):
    """A 422 naming the request field the policy's problem is in."""
    field = _POLICY_FIELDS.get(exc.field or "") or (
        "limits." + exc.field.removeprefix("limit_") if (exc.field or "").startswith("limit_") else None
    )
    fields = [{"field": prefix + field, "problem": str(exc)}] if field else []
    return jsonify(error="invalid_policy", message=str(exc), fields=fields), 422


@bp.get("/policy-changes")
@documented("List policy changes", query=PolicyChangesQuery, responses={200: PolicyChangeList})
@api_roles("admin")
def list_policy_changes():
    """The tenant's policy changes, newest first; pending ones unless `status` says otherwise."""
    status = query(PolicyChangesQuery).status or "pending"
    rows = policy_actions.changes(db.session, g.user.tenant_id, None if status == "all" else status)
    return answer(PolicyChangeList(changes=[PolicyChangeView.of(change) for change in rows]))


@bp.post("/policy-changes/<int:change_id>")
@documented(
    "Approve or reject a policy change",
    body=DecidePolicyChange,
    responses={200: PolicyChangeDecided},
    errors={
        403: "not_allowed: the admin who asked for the change cannot decide it (four eyes).",
        409: "already_decided, or policy_changed_since: the policy changed after the change was asked.",
        422: "reason_required: a rejection needs a reason; invalid_policy: the change no longer fits the rules.",
    },
)
@api_roles("admin")
def decide_policy_change(change_id: int):
    sent = body(DecidePolicyChange)
    saved = policy_actions.decide(db.session, g.user, change_id, sent.decision, sent.reason)
    policy = PolicyView.of(saved.policy) if saved.policy is not None else None
    return answer(PolicyChangeDecided(change=PolicyChangeView.of(saved.change), policy=policy))


# --- agents that run elsewhere ------------------------------------------------------------------


@bp.get("/external-tools")
@documented("List the tools outside agents ask about", responses={200: ExternalToolList})
@api_roles("admin")
def list_external_tools():
    rows = external.declared(db.session, g.user.tenant_id)
    return answer(ExternalToolList(tools=[external_tool_view(row) for row in rows]))


@bp.put("/external-tools/<name>")
@documented(
    "Declare a tool that outside agents ask about",
    body=DeclareTool,
    responses={200: ExternalToolDeclared},
    errors={
        422: "invalid_tool: a name, schema or argument the desk cannot take (`fields` says which); "
        "invalid_policy: a policy the tool cannot have.",
    },
)
@api_roles("admin")
def declare_external_tool(name: str):
    """Declare it, or declare it again (the policy given is set as PUT /api/policies/{tool} sets it: a
    loosening waits for another admin, and `change` says so)."""
    sent = body(DeclareTool)
    declaration = external.Declaration(
        description=sent.description,
        input_schema=sent.input_schema,
        amount=sent.amount,
        amount_unit=sent.amount_unit,
        subject=sent.subject,
    )
    try:
        declared = external_tools.declare(
            db.session, g.user, name, declaration, policy_values(sent.policy) if sent.policy is not None else None
        )
    except external.DeclarationError as exc:
        fields = [{"field": exc.field, "problem": str(exc)}] if exc.field and exc.field != "name" else []
        return jsonify(error="invalid_tool", message=str(exc), fields=fields), 422
    except policy_rules.PolicyError as exc:
        return policy_refused(exc, "policy.")
    change = declared.saved.change if declared.saved is not None else None
    view = external_tool_view(declared.row)
    return answer(
        ExternalToolDeclared(**view.model_dump(), change=PolicyChangeView.of(change) if change is not None else None)
    )


@bp.delete("/external-tools/<name>")
@documented("Remove a declared tool", responses={200: ExternalToolView})
@api_roles("admin")
def remove_external_tool(name: str):
    """Outside agents can no longer ask for it; its calls so far, and its policy, stay."""
    row = external_tools.find_tool(db.session, g.user, name)
    view = external_tool_view(row)
    external_tools.remove(db.session, g.user, name)
    return answer(view)


@bp.post("/calls")
@documented(
    "Ask before running a declared tool (outside agents)",
    body=AskCall,
    responses={201: CallView, 200: CallView},
    errors={
        409: "idempotency_conflict: the key was used for another request.",
        422: "unknown_tool: no declared tool has that name; invalid_input: `input` does not fit its schema.",
    },
)
@api_roles("agent")
def ask_call():
    """201: a new call, approved at once or waiting in the inbox; 200: the call made before with the
    same idempotency key (the same request)."""
    sent = body(AskCall)
    call, created = outside_actions.ask(
        db.session,
        g.user,
        source=sent.source,
        tool=sent.tool,
        arguments=sent.input.root,
        context=sent.context,
        facts=[fact.model_dump() for fact in sent.facts or []],
        idempotency_key=sent.idempotency_key,
    )
    return answer(call_view(call), 201 if created else 200)


@bp.get("/calls/<int:call_id>")
@documented(
    "Read an outside agent's call, waiting for its decision",
    query=CallQuery,
    responses={200: CallView},
    errors={403: "forbidden: the call is another agent's.", 429: "too_many_streams: too many waits open."},
)
@api_roles(*ROLES)
def get_call(call_id: int):
    """With `wait`: answers as soon as the call is decided, or after that many seconds as it is."""
    asked = query(CallQuery)
    call = outside_actions.find(db.session, g.user, call_id)
    call = outside_actions.wait(current_app._get_current_object(), g.user, call, asked.wait or 0)
    return answer(call_view(call))


@bp.post("/calls/<int:call_id>/outcome")
@documented(
    "Report what an approved call did",
    body=ReportOutcome,
    responses={200: CallView},
    errors={
        403: "not_yours: only the agent whose token asked reports.",
        409: "not_approved: the call may not run; already_reported: another report was kept.",
    },
)
@api_roles("agent")
def report_call(call_id: int):
    sent = body(ReportOutcome)
    call = outside_actions.report(db.session, g.user, call_id, ok=sent.ok, summary=sent.summary, output=sent.output)
    return answer(call_view(call))


@bp.post("/calls/<int:call_id>/cancel")
@documented(
    "Give up a call that waits",
    body=CancelCall,
    body_required=False,
    responses={200: CallView},
    errors={403: "not_yours: only the agent whose token asked gives it up."},
)
@api_roles("agent")
def cancel_call(call_id: int):
    """It settles as cancelled and leaves the inbox; a call that no longer waits is answered as it is."""
    sent = optional_body(CancelCall)
    return answer(call_view(outside_actions.cancel(db.session, g.user, call_id, (sent.reason or "").strip())))


# --- audit log ----------------------------------------------------------------------------------


@bp.get("/audit")
@documented(
    "Read the audit log",
    query=AuditQuery,
    responses={200: AuditPage},
    errors={422: "invalid_filter: a filter or cursor that names nothing; the message says what to send."},
)
@api_roles("auditor", "admin")
def audit_events():
    """The tenant's audit events, newest first, a page at a time."""
    known_names(AuditQuery)  # its names; the values are read as the audit page reads them (422 invalid_filter)
    return answer(AuditPage.model_validate(audit_queries.api_page(db.session, g.user, request.args)))


# --- API tokens ---------------------------------------------------------------------------------


@bp.get("/tokens")
@documented(
    "List API tokens",
    query=TokensQuery,
    responses={200: TokenList},
    errors={404: "not_found: `user_id` names nobody whose tokens you manage."},
)
@api_roles(*ROLES)
def list_tokens():
    """The caller's own tokens; an admin may ask for a person of their tenant's with ?user_id=."""
    user_id = query(TokensQuery).user_id
    owner = accounts.tenant_user(db.session, g.user, user_id) if user_id is not None else g.user
    return answer(TokenList(tokens=[TokenView.of(row, token_state(row)) for row in accounts.tokens(db.session, owner)]))


@bp.delete("/tokens/<int:token_id>")
@documented("Revoke an API token", body=RevokeToken, body_required=False, responses={200: TokenView})
@api_roles(*ROLES)
def revoke_token(token_id: int):
    """Revoke one of the caller's tokens (admins: of their tenant's people) for good; revoking one that is
    revoked already answers the same."""
    optional_body(RevokeToken)  # (it takes no field: only an empty body, or {})
    row, _ = accounts.revoke(db.session, g.user, token_id)
    return answer(TokenView.of(row, token_state(row)))


# --- MCP servers ----------------------------------------------------------------------------------


@bp.get("/secrets")
@documented("List the secrets an MCP server's header may name", responses={200: SecretList})
@api_roles("admin")
def list_secrets():
    """The names of the secrets the desk's operator granted to the tenant (never a value): the only
    environment variables its admins may name in an MCP server's header."""
    return answer(SecretList(secrets=sorted(secret_grants.granted(db.session, g.user.tenant_id))))


# --- event webhooks -------------------------------------------------------------------------------


@bp.post("/webhooks")
@documented(
    "Subscribe a webhook to events",
    body=CreateWebhook,
    responses={201: WebhookCreated},
    errors={422: "invalid_webhook: an address the desk may not call, or too many webhooks; in words."},
)
@api_roles("admin")
def create_webhook():
    """Send the tenant's events of the given types to `url` from now on, signed as Standard Webhooks
    say; the answer holds the signing secret, shown this once."""
    sent = body(CreateWebhook)
    subscription, secret = webhook_actions.subscribe(db.session, g.user, sent.url, [str(name) for name in sent.events])
    return answer(WebhookCreated(**WebhookView.of(subscription, g.user.email).model_dump(), secret=secret), 201)


@bp.get("/webhooks")
@documented("List the webhooks", responses={200: WebhookList})
@api_roles("admin")
def list_webhooks():
    rows = webhooks.subscriptions(db.session, g.user.tenant_id)
    emails = people_emails(row.created_by_id for row in rows)
    return answer(WebhookList(webhooks=[WebhookView.of(row, emails.get(row.created_by_id)) for row in rows]))


@bp.delete("/webhooks/<int:webhook_id>")
@documented("Remove a webhook", body=RemoveWebhook, body_required=False, responses={200: WebhookView})
@api_roles("admin")
def delete_webhook(webhook_id: int):
    """No more events go to it; its delivery log stays readable."""
    optional_body(RemoveWebhook)  # (it takes no field: only an empty body, or {})
    subscription = webhook_actions.remove(db.session, g.user, webhook_id)
    return answer(
        WebhookView.of(subscription, people_emails([subscription.created_by_id]).get(subscription.created_by_id))
    )


@bp.get("/webhooks/<int:webhook_id>/deliveries")
@documented("Read a webhook's deliveries", query=DeliveriesQuery, responses={200: WebhookDeliveryList})
@api_roles("admin")
def webhook_deliveries(webhook_id: int):
    asked = query(DeliveriesQuery)
    page = a_page(lambda: webhook_actions.deliveries(db.session, g.user, webhook_id, asked.cursor, asked.limit or 50))
    return answer(
        WebhookDeliveryList(deliveries=[WebhookDeliveryView.of(row) for row in page.rows], next_cursor=page.next_cursor)
    )


@bp.post("/webhooks/<int:webhook_id>/deliveries/<int:delivery_id>/redeliver")
@documented("Send a delivery again", responses={202: WebhookDeliveryView})
@api_roles("admin")
def redeliver_webhook(webhook_id: int, delivery_id: int):
    """The same body under the same webhook-id, at once, then retried as a new delivery would be."""
    delivery = webhook_actions.redeliver(db.session, g.user, webhook_id, delivery_id)
    return answer(WebhookDeliveryView.of(delivery), 202)


# --- this API's own description -------------------------------------------------------------------


@bp.get("/openapi.json")
@documented("This document", responses={200: OpenApiDocument})
@public
def openapi_document():
    """The OpenAPI 3.1 document of this API, built from the routes and their models."""
    return jsonify(document(current_app))


# --- shapes -------------------------------------------------------------------------------------


def people_emails(ids) -> dict[int, str]:
    wanted = {person for person in ids if person is not None}
    if not wanted:
        return {}
    return dict(db.session.execute(select(User.id, User.email).where(User.id.in_(wanted))).all())


def a_page(read: Callable[[], Page]) -> Page:
    """The page `read` returns; a cursor that is not an earlier answer's next_cursor is a 422 naming it."""
    try:
        return read()
    except BadCursor:
        problem = FieldProblem(field="cursor", problem="must be the next_cursor of an earlier answer")
        raise InvalidFields([problem], ["Send it unchanged, or leave it out for the first page."]) from None


def tenant_tools():
    """The tools of the caller's tenant (built-in and MCP): what a call's sentence is read from."""
    return services().tools_for(db.session, g.user.tenant_id)


def external_tool_view(row) -> ExternalToolView:
    tool = external.OutsideTool(row)
    pending = [
        change.id for change in policy_actions.changes(db.session, row.tenant_id) if change.tool_name == row.name
    ]
    return ExternalToolView.of(row, policy_rules.policy_for(db.session, row.tenant_id, tool), pending)


def call_view(call: ToolCall) -> CallView:
    return CallView.of(call, outside.details(db.session, call), len(approvals_so_far(db.session, call)))


def conversation_view(conversation: Conversation) -> ConversationView:
    rows = db.session.scalars(select(Message).where(Message.conversation_id == conversation.id).order_by(Message.seq))
    calls = db.session.scalars(
        select(ToolCall).where(ToolCall.conversation_id == conversation.id).order_by(ToolCall.id)
    ).all()
    usage = db.session.execute(
        select(
            func.coalesce(func.sum(ModelCall.input_tokens), 0),
            func.coalesce(func.sum(ModelCall.output_tokens), 0),
            func.coalesce(func.sum(ModelCall.cache_read_input_tokens), 0),
            func.coalesce(func.sum(ModelCall.cache_creation_input_tokens), 0),
            func.count(ModelCall.id),
        ).where(ModelCall.conversation_id == conversation.id)
    ).one()
    return ConversationView.of(
        conversation,
        api_messages(rows),
        list(calls),
        Usage(
            input_tokens=int(usage[0]),
            output_tokens=int(usage[1]),
            cache_read_input_tokens=int(usage[2]),
            cache_creation_input_tokens=int(usage[3]),
            model_calls=int(usage[4]),
        ),
        tenant_tools(),
    )
