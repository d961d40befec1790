"""The users admin page: an admin adds the people of their own tenant, sets their roles, disables or
enables them, resets their passwords, unlocks an account that failed sign-ins locked, and sees and
revokes their API tokens. Every change is audited.

The admin role needs four eyes (accounts/actions.py, four_eyes.py): given by an admin (a person's
roles, a new account asked with it) or given back after an admin reset another admin's password, it
waits in "Waiting for a second admin" for another admin whose account the asker may not hold, who
approves or rejects it there; the asker may withdraw it. The page says when only the desk's operator
can decide (/ops/policy-changes, `flask role-change`).

Each row action works as a plain form POST (redirect back with a flash message) and with htmx (the
HX-Request header): then the answer is the updated row fragment, templates/accounts/_user_row.html
(or, when the admin role now waits for a second admin, the whole page again, which lists it).
"""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for
from flask_login import current_user
from flask_wtf import FlaskForm
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from wtforms import PasswordField, SelectMultipleField, StringField
from wtforms.validators import DataRequired, Length, ValidationError
from wtforms.widgets import CheckboxInput, ListWidget

from webapp import audit_chain, identity
from webapp.accounts import actions, four_eyes
from webapp.identity import EMAIL_RE, AccountError
from webapp.models import ROLES, RoleChange, User
from webapp.refusals import Refusal
from webapp.runtime.extensions import db
from webapp.web.errors import status_of
from webapp.web.forms import decision_fields
from webapp.web.htmx import go_to, is_htmx
from webapp.web.security import account_locked, begin_session, roles_required, unlock_account

bp = Blueprint("users", __name__, url_prefix="/admin/users")


# --- the create form ------------------------------------------------------------------------------


def _strip(value):
    return value.strip() if isinstance(value, str) else value


def _email_format(form, field) -> None:
    if field.data and not EMAIL_RE.match(field.data):
        raise ValidationError("Enter an email address like name@example.com.")


class RolesField(SelectMultipleField):
    """Role checkboxes; an unknown role is an error that names the roles there are."""

    widget = ListWidget(prefix_label=False)
    option_widget = CheckboxInput()

    def pre_validate(self, form) -> None:
        unknown = sorted(set(self.data or []) - set(ROLES))
        if unknown:
            raise ValidationError(f"Unknown role {', '.join(unknown)}; choose among {', '.join(ROLES)}.")


class CreateUserForm(FlaskForm):
    email = StringField(
        "Email",
        filters=[lambda value: _strip(value).lower() if value else value],
        validators=[
            DataRequired("Enter an email address."),
            Length(max=254, message="The email address must be at most 254 characters."),
            _email_format,
        ],
    )
    display_name = StringField(
        "Display name",
        filters=[_strip],
        validators=[Length(max=200, message="The display name must be at most 200 characters.")],
    )
    roles = RolesField("Roles", choices=list(ROLES), validators=[DataRequired("Choose at least one role.")])
    password = PasswordField(
        "Password",
        validators=[
            DataRequired("Enter a password."),
            Length(min=8, max=200, message="The password must be 8 to 200 characters."),
        ],
    )

    def validate_email(self, field) -> None:
        """An e-mail already in use: said so when it is a person of the admin's own tenant; otherwise
        words that do not tell the e-mail has an account in another tenant (or is an operator's)."""
        holder = db.session.scalar(select(User.tenant_id).where(User.email == field.data))
        if holder is None:
            return
        if holder == current_user.tenant_id:
            raise ValidationError("A user with this email already exists.")
        raise ValidationError(_sentence(identity.EMAIL_UNAVAILABLE))


# --- pages ----------------------------------------------------------------------------------------


@bp.get("")
@roles_required("admin")
def index():
    """The tenant's users, each with its actions, and the form to add one."""
    return _users_page(CreateUserForm())


@bp.post("")
@roles_required("admin")
def create_user():
    """Add a user to the admin's tenant; the page again with the errors (422) when the form is wrong."""
    form = CreateUserForm()
    if not form.validate_on_submit():
        return _users_page(form), 422
    try:
        user, change = actions.create_user(
            db.session,
            _admin(),
            form.email.data,
            form.password.data,
            form.roles.data,
            form.display_name.data or "",
        )
    except (AccountError, IntegrityError) as exc:  # IntegrityError: the same email added meanwhile
        db.session.rollback()
        message = _sentence(str(exc) if isinstance(exc, AccountError) else identity.EMAIL_UNAVAILABLE)
        form.form_errors.append(message)
        return _users_page(form), 422
    if change is not None:
        flash(f"{user.email} is added and can sign in now; {ADMIN_WAITS}", "info")
        return redirect(url_for(".index", _anchor=f"role-change-{change.id}"), 303)
    flash(f"{user.email} is added and can sign in now.", "info")
    return redirect(url_for(".index", _anchor=f"user-{user.id}"), 303)


@bp.post("/<int:user_id>/roles")
@roles_required("admin")
def set_roles(user_id: int):
    """Give the user exactly the checked roles."""
    user = _tenant_user(user_id)
    try:
        saved = actions.set_roles(db.session, _admin(), user, request.form.getlist("roles"))
    except AccountError as exc:
        return _failed(user, exc)
    held = ", ".join(user.roles) if user.roles else "no role"
    if saved.change is not None:
        roles = f"{user.email} {'keeps' if saved.before == user.roles else 'now has'} {_roles_words(user)} for now; "
        return _waits(saved.change, roles + (ADMIN_WAITED if saved.waited else ADMIN_WAITS))
    if saved.before == user.roles:
        return _done(user, f"{user.email} keeps the roles {held}.")
    return _done(user, f"{user.email} now has the roles {held}.")


@bp.post("/<int:user_id>/disable")
@roles_required("admin")
def disable(user_id: int):
    """Disable the user: they cannot sign in, their sessions end and their API tokens stop working."""
    user = _tenant_user(user_id)
    try:
        stopped = actions.disable_user(db.session, _admin(), user)
    except AccountError as exc:
        return _failed(user, exc)
    if stopped:
        conversations = f"; {stopped} conversation{'s' if stopped != 1 else ''} of theirs stopped"
    else:
        conversations = ""
    return _done(
        user, f"{user.email} is disabled: their sessions ended and their API tokens are revoked{conversations}."
    )


@bp.post("/<int:user_id>/enable")
@roles_required("admin")
def enable(user_id: int):
    """Let a disabled user sign in again."""
    user = _tenant_user(user_id)
    if identity.set_active(db.session, user, True, actor=_admin()):
        _record("user_enabled", user)
        db.session.commit()
    return _done(user, f"{user.email} is enabled and can sign in again.")


@bp.post("/<int:user_id>/password")
@roles_required("admin")
def reset_password(user_id: int):
    """Set the password the admin typed and end the user's open sessions."""
    user = _tenant_user(user_id)
    admin = _admin()
    try:
        reset = actions.reset_password(db.session, admin, user, request.form.get("password", ""))
    except AccountError as exc:
        return _failed(user, exc)
    if user.id == admin.id:
        begin_session(user)  # the reset ended every session of theirs; keep this one, the one that asked
        db.session.commit()
    revoked = reset.tokens_revoked
    tokens = f" and {revoked} API token{'s' if revoked != 1 else ''} revoked" if revoked else ""
    said = f"{user.email} has a new password; their open sessions ended{tokens}."
    if reset.change is not None:
        return _waits(
            reset.change,
            f"{said[:-1]}. You know their password now, so their admin role is taken away until a second admin "
            "gives it back (four eyes).",
        )
    return _done(user, said)


@bp.post("/<int:user_id>/unlock")
@roles_required("admin")
def unlock(user_id: int):
    """Forget the failed sign-ins that locked the user's account, so they can sign in again now."""
    user = _tenant_user(user_id)
    try:
        was_locked = unlock_account(user.email)
    except AccountError as exc:
        return _failed(user, exc)
    actions.record_unlock(db.session, _admin(), user, was_locked)
    if was_locked:
        return _done(user, f"{user.email} is unlocked and can sign in again now.")
    return _done(user, f"{user.email} was not locked; nothing changed.")


# --- the admin role, waiting for a second admin ----------------------------------------------------

ADMIN_WAITS = "the admin role waits for a second admin (four eyes): see “Waiting for a second admin”."
ADMIN_WAITED = "the admin role asked for them already waits for a second admin: see “Waiting for a second admin”."


@bp.post("/role-changes/<int:change_id>")
@roles_required("admin")
def decide_role_change(change_id: int):
    """Another admin approves or rejects the admin role asked for a person."""
    form = request.form
    try:
        decision, reason = decision_fields(form)
        change = actions.decide_role_change(db.session, _admin(), change_id, decision, reason)
    except Refusal as exc:
        db.session.rollback()
        return _users_page(CreateUserForm(formdata=None), change_refusal=(change_id, exc, form.get("reason", ""))), (
            status_of(exc)
        )
    if change.status == "approved":
        flash(f"Approved: {change.user.email} is an admin now.", "info")
    else:
        flash(f"Rejected: {change.user.email} stays without the admin role.", "info")
    return redirect(url_for(".index", _anchor=f"user-{change.user_id}"), 303)


@bp.post("/role-changes/<int:change_id>/withdraw")
@roles_required("admin")
def withdraw_role_change(change_id: int):
    """The admin who asked for the admin role takes it back."""
    try:
        change = actions.withdraw_role_change(db.session, _admin(), change_id)
    except Refusal as exc:
        db.session.rollback()
        return _users_page(CreateUserForm(formdata=None), change_refusal=(change_id, exc, "")), status_of(exc)
    flash(f"Withdrew the admin role asked for {change.user.email}; they stay without it.", "info")
    return redirect(url_for(".index", _anchor=f"user-{change.user_id}"), 303)


def _waits(change: RoleChange, message: str):
    """After a change that left the admin role waiting: the page again, which lists it (htmx loads it whole)."""
    flash(message, "info")
    return go_to(url_for(".index", _anchor=f"role-change-{change.id}"))


def _roles_words(user: User) -> str:
    return f"the roles {', '.join(user.roles)}" if user.roles else "no role"


def _waiting(changes: list[RoleChange]) -> dict[int, dict]:
    """For each waiting role change: whether the admin looking may decide it, and if not why, and
    whether only the desk's operator can."""
    me = _admin()
    said = {}
    for change in changes:
        why = four_eyes.why_not_decide(db.session, me, change.requested_by_id)
        nobody = not four_eyes.deciders(db.session, change.tenant_id, change.requested_by_id)
        said[change.id] = {
            "why_not": why,
            "operator_only": four_eyes.only_the_operator(change.requested_by) if nobody else None,
        }
    return said


# --- helpers --------------------------------------------------------------------------------------


def _admin() -> User:
    return current_user._get_current_object()


def _tenant_user(user_id: int) -> User:
    """A user of the admin's tenant; 404 for any other id, so other tenants' ids reveal nothing."""
    user = db.session.get(User, user_id)
    if user is None or user.tenant_id != current_user.tenant_id:
        abort(404, description="There is no such user in your organisation.")
    return user


def _target(user: User) -> dict:
    return {"user_id": user.id, "email": user.email}


def _record(action: str, user: User, **data) -> None:
    admin = _admin()
    audit_chain.record(db.session, action, tenant_id=admin.tenant_id, actor=admin, data={**_target(user), **data})


def _row(user: User, **context) -> str:
    return render_template(
        "accounts/_user_row.html",
        user=user,
        roles=ROLES,
        locked=account_locked(user.email),
        admin_waits=actions.pending_role_change(db.session, user) is not None,
        **context,
    )


def _sentence(message: str) -> str:
    message = message.strip()
    return message[:1].upper() + message[1:] + ("" if message.endswith(".") else ".")


def _done(user: User, message: str):
    if is_htmx():
        return _row(user, notice=message, error=None)
    flash(message, "info")
    return redirect(url_for(".index", _anchor=f"user-{user.id}"), 303)


def _failed(user: User, exc: AccountError):
    db.session.rollback()  # the row then shows what is stored
    message = _sentence(str(exc))
    if is_htmx():
        # 422, which the base template's htmx config swaps (webapp/web/htmx.py): the row shows the error.
        return _row(user, error=message, notice=None), 422
    return _users_page(CreateUserForm(formdata=None), row_errors={user.id: message}), 422


def _first_wrong(form: CreateUserForm) -> str | None:
    """The field a refused new user's form focuses: the first with an error (the email for an error of
    the whole form: it is taken)."""
    if form.form_errors:
        return "email"
    return next((name for name in ("email", "display_name", "roles", "password") if form[name].errors), None)


def _users_page(
    form: CreateUserForm, row_errors: dict[int, str] | None = None, change_refusal: tuple | None = None
) -> str:
    """The page; `change_refusal`: (role change id, Refused, the reason typed) said beside that change."""
    users = db.session.scalars(select(User).where(User.tenant_id == current_user.tenant_id).order_by(User.email)).all()
    locked = {user.id for user in users if account_locked(user.email)}
    waiting = actions.role_changes(db.session, current_user.tenant_id)
    return render_template(
        "accounts/users.html",
        users=users,
        roles=ROLES,
        form=form,
        first_wrong=_first_wrong(form),
        row_errors=row_errors or {},
        locked_ids=locked,
        waiting=waiting,
        waiting_said=_waiting(waiting),
        admin_waits_ids={change.user_id for change in waiting},
        change_refusal=change_refusal,
        why_words=actions.role_change_why,
    )
