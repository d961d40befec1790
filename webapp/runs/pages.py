"""Bulk runs on pages: the runs a person may see with the form that starts one from a file, and a
run's own page, which follows it until its items are settled (its counts, its cost by batch against
what it would have cost one by one, its conversations, and its calls waiting in the inbox)."""

from __future__ import annotations

from flask import Blueprint, abort, redirect, render_template, request, url_for
from flask_login import current_user
from sqlalchemy import select

from webapp.conversations.actions import STATUS_LABELS
from webapp.models import Conversation
from webapp.refusals import Refusal
from webapp.runs import actions as runs
from webapp.runs.actions import RunRefused
from webapp.runtime.extensions import db
from webapp.web import htmx
from webapp.web.errors import status_of
from webapp.web.pagination import page_or_problem
from webapp.web.security import roles_required, takes_up_to

bp = Blueprint("runs", __name__, url_prefix="/runs")

EVERYONE = ("agent", "reviewer", "auditor", "admin")
SHOWN_CONVERSATIONS = 200  # on a run's page; the API lists every one


@bp.get("")
@roles_required(*EVERYONE)
def index():
    return _render_index()


def _render_index(status: int = 200, error: str | None = None, title: str = "", batch: bool = True):
    """The runs list; `error`, `title` and `batch`: a refused upload, said beside the form with what
    was typed kept (a browser never keeps a chosen file)."""
    page, problem = page_or_problem(lambda: runs.listing(db.session, current_user, request.args.get("cursor")))
    prices = runs.price_table()
    shown = [(run, runs.figures(db.session, run, prices, ids=False)) for run in page.rows]
    return htmx.render(
        "runs/index.html",
        "runs/_list.html",
        status,
        runs=shown,
        next_cursor=page.next_cursor,
        problem=problem,
        error=error,
        title=title,
        batch=batch,
    )


@bp.post("")
@takes_up_to(runs.MAX_FILE_BYTES + 64 * 1024)  # the file, and the form's other fields
@roles_required("agent")
def create():
    form = request.form
    upload = request.files.get("file")
    title, batch = form.get("title", ""), form.get("batch") == "1"
    try:
        if upload is None or not upload.filename:
            raise RunRefused("invalid", "invalid_file", "Choose a CSV or JSON Lines file of the items first.")
        items = runs.read_lines(upload.filename, upload.read(runs.MAX_FILE_BYTES + 1))
        run = runs.create(
            db.session,
            current_user,
            [message for _, message in items],
            batch=batch,
            title=title or upload.filename,
            lines=[line for line, _ in items],
        )
    except Refusal as exc:
        db.session.rollback()
        return _render_index(status_of(exc), f"{exc.message} Choose the file again.", title, batch)
    return redirect(url_for("runs.show", run_id=run.id), code=303)


@bp.get("/<int:run_id>")
@roles_required(*EVERYONE)
def show(run_id: int):
    return htmx.render("runs/show.html", "runs/_run.html", **_context(_run(run_id)))


def _context(run) -> dict:
    shown = db.session.execute(
        select(Conversation.id, Conversation.title, Conversation.status, Conversation.error_message)
        .where(Conversation.run_id == run.id)
        .order_by(Conversation.id)
        .limit(SHOWN_CONVERSATIONS)
    ).all()
    return {
        "run": run,
        "figures": runs.figures(db.session, run, ids=False),
        "conversations": shown,
        "status_labels": STATUS_LABELS,
        "shown_most": SHOWN_CONVERSATIONS,
    }


@bp.post("/<int:run_id>/cancel")
@roles_required("agent", "reviewer", "admin")
def cancel(run_id: int):
    run = _run(run_id)
    try:
        runs.cancel(db.session, current_user, run)
    except Refusal as exc:
        db.session.rollback()
        run = _run(run_id)
        return htmx.refused(
            exc,
            lambda status: (render_template("runs/_run.html", **_context(run)), status),
            url_for("runs.show", run_id=run_id),
        )
    return htmx.go_to(url_for("runs.show", run_id=run_id))


def _run(run_id: int):
    """The run if this person may see it; another tenant's is not found."""
    try:
        return runs.find(db.session, current_user, run_id)
    except Refusal as exc:
        abort(status_of(exc), exc.message)
