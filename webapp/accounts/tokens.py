"""The API tokens page: a person's own tokens (named, with an optional expiry), each revocable; the
token itself is shown once, when it is made. Admins see and revoke their tenant's people's tokens from
the users page (/admin/users/<id>/tokens), through the same revoke action."""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, render_template, url_for
from flask_login import current_user
from flask_wtf import FlaskForm
from wtforms import IntegerField, StringField
from wtforms.validators import DataRequired, Length, NumberRange, Optional

from webapp.accounts import actions
from webapp.identity import MAX_TOKEN_DAYS, MAX_TOKEN_NAME_CHARS, AccountError, token_state
from webapp.models import User
from webapp.refusals import Refusal
from webapp.runtime.extensions import db
from webapp.web.errors import status_of
from webapp.web.security import roles_required, signed_in

bp = Blueprint("tokens", __name__)

DAYS_RULE = (
    f"Leave the expiry empty (the token lasts until revoked) or give a whole number of days from 1 to {MAX_TOKEN_DAYS}."
)


class DaysField(IntegerField):
    """Days as a whole number; anything else is a sentence saying what to type."""

    def process_formdata(self, valuelist) -> None:
        if valuelist and valuelist[0].strip():
            try:
                self.data = int(valuelist[0].strip())
            except ValueError:
                self.data = None
                raise ValueError(DAYS_RULE) from None
        else:
            self.data = None


class TokenForm(FlaskForm):
    name = StringField(
        "Name",
        filters=[lambda value: value.strip() if isinstance(value, str) else value],
        validators=[
            DataRequired("Name the token, e.g. after the program that will use it."),
            Length(max=MAX_TOKEN_NAME_CHARS, message=f"The name must be at most {MAX_TOKEN_NAME_CHARS} characters."),
        ],
    )
    expires_in_days = DaysField(
        "Expires after (days)", validators=[Optional(), NumberRange(1, MAX_TOKEN_DAYS, message=DAYS_RULE)]
    )


@bp.get("/account/tokens")
@signed_in
def index():
    """The person's own tokens and the form to make one."""
    return tokens_page(_me(), TokenForm())


@bp.post("/account/tokens")
@signed_in
def create():
    """Make a token for the person; the page shows it once (201), or the form's errors (422)."""
    form = TokenForm()
    if not form.validate_on_submit():
        return tokens_page(_me(), form), 422
    try:
        row, token = actions.issue(db.session, _me(), form.name.data, form.expires_in_days.data)
    except AccountError as exc:
        db.session.rollback()
        form.form_errors.append(str(exc)[:1].upper() + str(exc)[1:] + ".")
        return tokens_page(_me(), form), 422
    return tokens_page(_me(), TokenForm(formdata=None), new_token=token, new_row=row), 201


@bp.post("/account/tokens/<int:token_id>/revoke")
@signed_in
def revoke(token_id: int):
    """Revoke one of the person's tokens, or (admins) one of their tenant's people's."""
    me = _me()
    try:
        row, changed = actions.revoke(db.session, me, token_id)
    except Refusal as exc:
        db.session.rollback()
        abort(status_of(exc), description=exc.message)
    label = f"Token {row.prefix or '#' + str(row.id)}{' (' + row.name + ')' if row.name else ''}"
    flash(
        f"{label} is revoked: programs using it are refused from now on."
        if changed
        else f"{label} was already revoked.",
        "info",
    )
    back = url_for(".index") if row.user_id == me.id else url_for(".of_user", user_id=row.user_id)
    return redirect(back, 303)


@bp.get("/admin/users/<int:user_id>/tokens")
@roles_required("admin")
def of_user(user_id: int):
    """A user's API tokens for an admin of their tenant, each revocable (no form: tokens are made by their owner)."""
    try:
        user = actions.tenant_user(db.session, _me(), user_id)
    except Refusal as exc:
        abort(status_of(exc), description=exc.message)
    return tokens_page(user, None)


def tokens_page(owner: User, form: TokenForm | None, new_token: str | None = None, new_row=None) -> str:
    """The tokens of `owner` (the form to make one only on the person's own page)."""
    return render_template(
        "accounts/tokens.html",
        owner=owner,
        rows=actions.tokens(db.session, owner),
        state=token_state,
        form=form,
        new_token=new_token,
        new_row=new_row,
    )


def _me() -> User:
    return current_user._get_current_object()
