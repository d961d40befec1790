"""Signing in and out with email and password; failed attempts are rate-limited and audited."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

from flask import Blueprint, flash, g, redirect, render_template, request, session, url_for
from flask_limiter import RequestLimit
from flask_limiter.errors import RateLimitExceeded
from flask_login import current_user, logout_user
from flask_wtf import FlaskForm
from wtforms import EmailField, PasswordField
from wtforms.validators import DataRequired, Length

from webapp import audit_chain
from webapp.identity import check_password
from webapp.runtime.extensions import db
from webapp.web.security import (
    ACCOUNT_SIGN_IN_LIMIT,
    account_limit_key,
    anyone_signed_in,
    begin_session,
    end_this_session,
    limiter,
    public,
    redirect_home,
    safe_next,
    user_by_email,
)

bp = Blueprint("auth", __name__)

FAILED = "Email or password is wrong."


class SignInForm(FlaskForm):
    email = EmailField("Email", validators=[DataRequired(), Length(max=254)])
    password = PasswordField("Password", validators=[DataRequired(), Length(max=200)])


def _failed(response) -> bool:
    return response.status_code == 401


def _attempted_account() -> str:
    return account_limit_key(request.form.get("email") or "")


def _seconds_left(until: float) -> int:
    return max(1, math.ceil(until - time.time()))


def _blocked(limit: RequestLimit, kind: str) -> None:
    """A sign-in refused by a limit: counted for its key (the address, or the account) over the
    limit's window, and audited as "sign_in_blocked" when the count is 1, 10, 100, ... (so a flood
    writes a handful of events, the last saying how many at least); the page tells when to try again."""
    # The window's own end, not flask-limiter's reset_at (which adds a second to it, so a lock of 15
    # minutes taken within the same second as the first failure read "in 16 minutes").
    until = limit.window.reset_time
    g.sign_in_blocked_until = until
    # The count lives as long as the limit's window: the next window's first refusal starts again at 1.
    count = limiter.limiter.storage.incr(f"sign-in-blocked/{limit.key}", _seconds_left(until))
    if count != 10 ** (len(str(count)) - 1):  # audited at 1, 10, 100, ...
        return
    email = (request.form.get("email") or "").strip().lower()[:254]
    user = user_by_email(email) if email else None
    audit_chain.record(
        db.session,
        "sign_in_blocked",
        tenant_id=user.tenant_id if user else None,
        actor_label=email or None,
        outcome="refused",
        data={
            "limit": kind,  # "address" or "account": whose failed sign-ins reached the limit
            "address": request.remote_addr,
            "target_user_id": user.id if user else None,
            "refused_in_window": count,
            "until": datetime.fromtimestamp(until, UTC).isoformat(),
        },
    )
    db.session.commit()


@bp.route("/login", methods=["GET", "POST"])
@public
@limiter.limit(
    "20 per 15 minutes",
    methods=["POST"],
    deduct_when=_failed,
    error_message="Too many failed sign-ins from your address.",
    on_breach=lambda limit: _blocked(limit, "address"),
)
@limiter.limit(
    ACCOUNT_SIGN_IN_LIMIT,
    key_func=_attempted_account,
    methods=["POST"],
    deduct_when=_failed,
    error_message="Too many failed sign-ins for this account; an admin can unlock it sooner.",
    on_breach=lambda limit: _blocked(limit, "account"),
)
def login():
    if current_user.is_authenticated and request.method == "GET":
        return redirect_home()
    form = SignInForm()
    if not form.validate_on_submit():
        status = 401 if request.method == "POST" else 200
        return render_template("accounts/sign_in.html", form=form), status
    user = user_by_email(form.email.data)
    # One scrypt check whatever the e-mail (a dummy hash when there is no such account, the real one
    # for a disabled account too), so how long this takes does not tell which accounts exist.
    password_ok = check_password(user, form.password.data)
    if user is None or not user.active or not password_ok:
        # The person typing is unknown: the account is the target, not the actor.
        audit_chain.record(
            db.session,
            "sign_in_failed",
            tenant_id=user.tenant_id if user else None,
            actor_label=form.email.data.strip().lower(),
            outcome="failed",
            data={
                "address": request.remote_addr,
                "target_user_id": user.id if user else None,
                "reason": "disabled" if user is not None and not user.active else "credentials",
            },
        )
        db.session.commit()
        form.password.errors = [FAILED]
        return render_template("accounts/sign_in.html", form=form), 401
    session.clear()  # a fresh session at sign-in: nothing from before survives (fixation)
    begin_session(user)
    audit_chain.record(
        db.session,
        "sign_in",
        tenant_id=user.tenant_id,
        actor=user,
        outcome="succeeded",
        data={"address": request.remote_addr},
    )
    db.session.commit()
    return redirect(safe_next(request.args.get("next")) or url_for("home.index"))


@bp.errorhandler(RateLimitExceeded)
def rate_limited(exc: RateLimitExceeded):
    """The sign-in page again, with what was typed (but the password) and when to try again."""
    form = SignInForm()
    form.password.data = None
    until = getattr(g, "sign_in_blocked_until", None)
    retry = None
    if until is not None:
        minutes = max(1, math.ceil((until - time.time()) / 60))
        retry = {
            "at": datetime.fromtimestamp(until, UTC),
            "in": "1 minute" if minutes == 1 else f"{minutes} minutes",
        }
    response = render_template("accounts/sign_in.html", form=form, blocked=exc.description, retry=retry)
    headers = {"Retry-After": str(_seconds_left(until))} if until is not None else {}
    return response, 429, headers


@bp.post("/logout")
@anyone_signed_in
def logout():
    audit_chain.record(
        db.session, "sign_out", tenant_id=current_user.tenant_id, actor=current_user._get_current_object()
    )
    end_this_session()  # for good: a copy of the cookie replayed later is signed out too
    db.session.commit()
    logout_user()
    session.clear()
    flash("You are signed out.", "info")
    return redirect(url_for("auth.login"))
