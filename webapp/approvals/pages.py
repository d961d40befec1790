"""The operators' approval inbox and decision page.

The inbox lists every call of the tenant waiting for a decision, oldest first, with what a reviewer
needs to sort them; the decision page shows the arguments as the tool will receive them, the rule
that flagged the call and the conversation so far. Both follow the tenant's live channel and
re-fetch their fragments when anything is decided elsewhere.
"""

from __future__ import annotations

import json

from flask import Blueprint, abort, flash, g, render_template, request, url_for
from flask_login import current_user
from htmx_flask import make_response
from markupsafe import Markup
from sqlalchemy import select

from webapp import audit_chain
from webapp.agent import gate, outside
from webapp.agent.decisions import approvals_so_far, arguments_hash, held_words, who
from webapp.agent.states import CallStatus
from webapp.approvals import actions as approvals
from webapp.approvals import editing
from webapp.approvals import queries as inbox
from webapp.approvals.actions import ApprovalRefused
from webapp.approvals.queries import InboxFilters
from webapp.conversations.cards import card, decisions_by_call
from webapp.conversations.transcript import transcript
from webapp.models import Conversation, ToolCall, User, utcnow
from webapp.refusals import Refusal
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.tools.presenting import changes, duration, money, more_approvals
from webapp.tools.registry import Review
from webapp.web import htmx
from webapp.web.errors import status_of
from webapp.web.pagination import BadCursor, Page
from webapp.web.rendering import page_words, when
from webapp.web.security import roles_required

bp = Blueprint("approvals", __name__, url_prefix="/approvals")

PAGE_SIZE = 50
GROUPED_PAGE_SIZE = 200  # grouped by tool and policy, or one run's calls: more to decide together


@bp.get("")
@roles_required("reviewer")
def index():
    filters, problems = InboxFilters.read(request.args)
    grouped = request.args.get("group") == "1"
    size = GROUPED_PAGE_SIZE if grouped or filters.run is not None else PAGE_SIZE
    try:
        page = inbox.pending_page(db.session, current_user, request.args.get("cursor"), size, filters)
    except BadCursor as exc:
        problems.append(str(exc))
        page = Page([], None)
    calls = page.rows
    people = {u.id: u for u in db.session.scalars(select(User).where(User.id.in_({c.acting_user_id for c in calls})))}
    tools = sorted(services().tools_for(db.session, current_user.tenant_id).names())
    return htmx.render(
        "approvals/index.html",
        "approvals/_list.html",
        calls=calls,
        groups=_groups(calls) if grouped else [("", "", calls)],
        grouped=grouped,
        seen={call.id: arguments_hash(call.input) for call in calls},
        people=people,
        filters=filters,
        problems=problems,
        tools=tools,
        more_url=url_for("approvals.index", **{**request.args.to_dict(), "cursor": page.next_cursor})
        if page.next_cursor
        else None,
        now=utcnow(),
        total=inbox.pending_total(current_user)[1],
        oldest=inbox.oldest_waiting_since(current_user),
    )


def _groups(calls: list[ToolCall]) -> list[tuple[str, str, list[ToolCall]]]:
    """The calls by tool and the policy that flagged them, largest group first (then oldest): each
    (key, words for people, its calls oldest first)."""
    groups: dict[str, tuple[str, list[ToolCall]]] = {}
    for call in calls:
        policy = call.policy or {}
        key = f"{call.name}:{policy.get('version')}:{policy.get('rule')}"
        rule = f"policy v{policy.get('version')}: {policy.get('rule')}" if policy else "no policy recorded"
        groups.setdefault(key, (f"{call.name} · {rule}", []))[1].append(call)
    ordered = sorted(groups.items(), key=lambda kv: -len(kv[1][1]))  # (stable: the oldest group first on ties)
    return [(f"group-{n}", words, members) for n, (_, (words, members)) in enumerate(ordered, start=1)]


BULK_MOST = 500  # calls decided in one go


@bp.post("/bulk")
@roles_required("reviewer")
def decide_many():
    """Approve or reject the selected calls at once: each through the same decision as its own page,
    bound to the arguments it was shown with (four-eyes, limits and ceilings per call, each audited on
    its own); what could not be decided is said, call by call."""
    form = request.form
    back = form.get("back", "")
    back = back if back.startswith(url_for("approvals.index")) else url_for("approvals.index")
    decision, picked = form.get("decision"), form.getlist("call")
    if decision not in ("approve", "reject"):
        flash("Choose Approve selected or Reject selected.", "error")
    elif not picked:
        flash("Select the calls to decide first; nothing was decided.", "error")
    elif len(picked) > BULK_MOST:
        flash(f"Decide at most {BULK_MOST} calls at once; nothing was decided.", "error")
    else:
        done, refused = [], []
        for value in picked:
            number, _, seen = value.partition(":")
            try:
                if not (number.isdigit() and int(number) <= inbox.LARGEST_ID):  # (ids are 32-bit)
                    raise ApprovalRefused("invalid", "invalid_field", f"“{value[:20]}” names no call.")
                if not seen:  # each call is decided as it was shown, never as it became since
                    raise ApprovalRefused(
                        "conflict", "arguments_changed", "sent without the arguments it was shown with; reload."
                    )
                done.append(
                    approvals.decide(db.session, current_user, int(number), decision, form.get("reason", ""), seen)
                )
            except Refusal as exc:
                db.session.rollback()
                refused.append(Markup("#{}: ").format(number[:12]) + page_words(exc))
        if done:
            verb = "approved" if decision == "approve" else "rejected"
            flash(f"You {verb} {len(done)} call{'s' if len(done) != 1 else ''}.", "info")
        if refused:
            flash(Markup("Not decided: ") + Markup(" ").join(refused), "error")
    return htmx.go_to(back)


@bp.get("/badge")
@roles_required("reviewer")
def badge():
    return render_template("approvals/_badge.html", count=inbox.pending_badge(current_user))


def _call(tool_call_id: int) -> ToolCall:
    try:
        return approvals.find_call(db.session, current_user, tool_call_id)
    except Refusal as exc:
        abort(status_of(exc), description=exc.message)


def _panel_context(call: ToolCall, typed: dict | None = None, errors: dict | None = None) -> dict:
    """What the decision panel shows: the call in words, the facts its tool reads now, the edit form
    (with what the reviewer typed and what is wrong with it, after a refused edit)."""
    decisions = decisions_by_call(db.session, [call])[call.id]
    neighbours = _neighbours(call)
    tool = services().tools_for(db.session, call.tenant_id).get(call.name)
    waiting = call.status == CallStatus.AWAITING_APPROVAL
    review = approvals.review(db.session, call) if waiting else Review()
    errors = errors or {}
    approved = len(approvals_so_far(db.session, call))
    return {
        "call": call,
        "tool": tool,
        "card": card(call, decisions, services().tools_for(db.session, call.tenant_id)),
        "review": review,
        "records": _record_ids(review),
        "edit_fields": editing.fields(tool, call.input, typed, errors) if tool and waiting else [],
        "edit_error": errors.get(None),
        "confirm_approve": _confirm_approve(call),
        "arguments_hash": arguments_hash(call.input),
        "arguments_json": json.dumps(call.input, indent=2, ensure_ascii=False),
        "decisions": decisions,
        "approvals": approved,
        "still_needed": more_approvals(max(call.approvals_required, 1) - approved),
        "decided_by": who(call.decided_by) if call.decided_by else None,
        "mine": any(d.reviewer_id == current_user.id for d in decisions),
        "own_conversation": db.session.get(Conversation, call.conversation_id).user_id == current_user.id,
        "claimed_by": _someone_else(call),
        "held": held_words(call.name) if waiting and tool is not None and tool.unavailable() else None,
        **neighbours,
    }


def _someone_else(call: ToolCall) -> str | None:
    """Who else is reviewing the call now, in words (None: nobody, or this person)."""
    held = approvals.holder(call)
    return who(held) if held is not None and held.id != current_user.id else None


def _confirm_approve(call: ToolCall) -> str | None:
    """The question the `a` key asks before approving an amount above its policy's limit (a click on
    the button needs no question: it is deliberate already)."""
    limit = gate.threshold_passed(call)
    if limit is None:
        return None
    return (
        f"Approve {money(call.money_cents)}, above the {money(limit)} that needs a person? "
        "Press a again to approve, any other key to cancel."
    )


def _record_ids(review: Review) -> dict[str, set[int]]:
    """The records shown beside the call, by kind, so its arguments can link to them."""
    shown: dict[str, set[int]] = {}
    for record in review.records:
        shown.setdefault(record.kind, set()).add(record.id)
    return shown


def _neighbours(call: ToolCall) -> dict:
    base = inbox.pending(current_user)
    previous = db.session.scalar(base.where(ToolCall.id < call.id).order_by(None).order_by(ToolCall.id.desc()).limit(1))
    following = db.session.scalar(base.where(ToolCall.id > call.id).order_by(None).order_by(ToolCall.id).limit(1))
    return {"previous_call": previous, "next_call": following}


@bp.get("/<int:tool_call_id>")
@roles_required("reviewer")
def show(tool_call_id: int):
    """The decision page. Reading it writes nothing: the page, once loaded, says it was opened (below)."""
    return _show(_call(tool_call_id), opening=True)


@bp.post("/<int:tool_call_id>/opened")
@roles_required("reviewer")
def opened(tool_call_id: int):
    """The decision page's own request once it has loaded in a browser: a waiting call is held for this
    reviewer unless someone else is on it or it is theirs to watch, not decide (their own conversation),
    and the audit log records that they saw it. 204; when someone else is on it, the panel that says who."""
    call = _call(tool_call_id)
    if call.status != CallStatus.AWAITING_APPROVAL:
        return "", 204
    try:
        approvals.claim(db.session, current_user, call.id)
        held_by_another = False
    except Refusal as exc:
        db.session.rollback()
        held_by_another = exc.code == "claimed"
    audit_chain.record(
        db.session,
        "approval_viewed",
        tenant_id=call.tenant_id,
        actor=current_user._get_current_object(),
        conversation_id=call.conversation_id,
        tool_call_id=call.id,
        tool_name=call.name,
    )
    db.session.commit()
    if not held_by_another:
        return "", 204
    panel = render_template("approvals/_decision.html", live_refresh=True, **_panel_context(_call(tool_call_id)))
    return make_response(panel, 200, retarget="#decision-panel", reswap="outerHTML")


@bp.post("/<int:tool_call_id>/claim")
@roles_required("reviewer")
def take_over(tool_call_id: int):
    """Take the call over from whoever is reviewing it (the page's button)."""
    try:
        call = approvals.claim(db.session, current_user, tool_call_id, take_over=True)
    except Refusal as exc:
        return _refused(tool_call_id, exc)
    flash(Markup("You are reviewing this call now, until {}.").format(when(call.claimed_until, relative=False)), "info")
    return htmx.go_to(url_for("approvals.show", tool_call_id=tool_call_id))


def _show(call: ToolCall, typed: dict | None = None, errors: dict | None = None, opening: bool = False) -> str:
    conversation = db.session.get(Conversation, call.conversation_id)
    asked = outside.details(db.session, call)  # an outside agent's call: its words instead of a transcript
    return render_template(
        "approvals/show.html",
        conversation=conversation,
        owner=db.session.get(User, conversation.user_id),
        asked=asked,
        entries=transcript(conversation) if asked is None else [],
        tools=services().tools_for(db.session, call.tenant_id),
        opening=opening and call.status == CallStatus.AWAITING_APPROVAL,
        **_panel_context(call, typed, errors),
    )


@bp.get("/<int:tool_call_id>/panel")
@roles_required("reviewer")
def panel(tool_call_id: int):
    return render_template("approvals/_decision.html", live_refresh=True, **_panel_context(_call(tool_call_id)))


@bp.post("/<int:tool_call_id>/decide")
@roles_required("reviewer")
def decide(tool_call_id: int):
    form = request.form
    decision = form.get("decision")
    edited, typed = None, None
    if decision == "edit":
        call = _call(tool_call_id)
        tool = services().tools_for(db.session, call.tenant_id).get(call.name)
        if tool is None:
            return _refused(
                tool_call_id, ApprovalRefused("invalid", "invalid_input", f"There is no tool {call.name} to edit for.")
            )
        edited, typed, errors = editing.read(tool, form)
        if errors:
            return _edit_refused(tool_call_id, typed, errors)
        decision = "approve"
    try:
        call = approvals.decide(
            db.session,
            current_user,
            tool_call_id,
            decision,
            form.get("reason", ""),
            form.get("arguments_hash") or "-",
            edited,
        )
    except approvals.EditRefused as exc:
        return _edit_refused(tool_call_id, typed, exc.problems)
    except Refusal as exc:
        return _refused(tool_call_id, exc)
    following = inbox.next_for(current_user)
    flash(_decided(call, following is not None), "info")
    return htmx.go_to(url_for("approvals.show", tool_call_id=following.id) if following else url_for("approvals.index"))


def _decided(call: ToolCall, more: bool) -> str:
    """What the reviewer just did, in a sentence, and where they are taken next."""
    tool = services().tools_for(db.session, call.tenant_id).get(call.name)
    what = f"{tool.title if tool else call.name} #{call.id}"
    if call.status == CallStatus.REJECTED:
        done = f"You rejected {what}."
    elif call.status == CallStatus.AWAITING_APPROVAL:
        missing = max(call.approvals_required, 1) - len(approvals_so_far(db.session, call))
        done = f"Your approval of {what} is recorded; it needs {more_approvals(missing)}."
    elif call.original_input is not None:
        done = f"You approved {what} with changes: {changes(call.original_input, call.input)}."
    else:
        done = f"You approved {what}."
    return done + (
        " Here is the oldest call still waiting for you." if more else " Nothing else waits for your decision."
    )


def _refused(tool_call_id: int, exc: Refusal):
    db.session.rollback()
    return htmx.refused(
        exc,
        lambda status: (render_template("approvals/_decision.html", **_panel_context(_call(tool_call_id))), status),
        url_for("approvals.show", tool_call_id=tool_call_id),
    )


def _edit_refused(tool_call_id: int, typed: dict | None, errors: dict):
    """An edit the form or the tool refused: the page again, with what was typed and each field's
    error beside it (a redirect would lose what was typed)."""
    db.session.rollback()
    flash("Fix the marked fields; nothing was approved.", "error")
    call = _call(tool_call_id)
    if htmx.is_htmx():
        return render_template("approvals/_decision.html", **_panel_context(call, typed, errors)), 422
    return _show(call, typed, errors), 422


def key_arguments(call: ToolCall) -> str:
    """What the call would do, in its tool's sentence ("Refund $90.00 on invoice 4471."); when the tool
    cannot say, the money it moves and what it acts on."""
    registries = g.setdefault("tool_registries", {})  # one registry per tenant and request, for a list
    if call.tenant_id not in registries:
        registries[call.tenant_id] = services().tools_for(db.session, call.tenant_id)
    said = registries[call.tenant_id].describe(call.name, call.input)
    if said:
        return said
    parts = [money(call.money_cents)] if call.money_cents is not None else []
    if call.subject:
        parts.append(call.subject.replace(":", " ", 1))
    return " · ".join(parts)


def age(moment, now) -> str:
    return duration((now - moment).total_seconds())


@bp.app_template_filter("key_arguments")
def _key_arguments_filter(call: ToolCall) -> str:
    return key_arguments(call)


@bp.app_template_global("age")
def _age(moment, now) -> str:
    return age(moment, now)
