"""The notifications admin page: where the tenant is told that calls wait (a webhook, signed with a
secret the desk makes and shows once; e-mail to a list of addresses), a test message per channel, and
the log of recent deliveries with the reason of each failure. Every change is audited."""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, render_template, url_for
from flask_login import current_user
from flask_wtf import FlaskForm
from wtforms import StringField, TextAreaField

from webapp import notify
from webapp.accounts import actions
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.tools.presenting import plural
from webapp.web.security import roles_required

bp = Blueprint("notifications", __name__, url_prefix="/admin/notifications")


class WebhookForm(FlaskForm):
    url = StringField("Webhook address")


class EmailForm(FlaskForm):
    recipients = TextAreaField("E-mail addresses")


@bp.get("")
@roles_required("admin")
def index():
    return _page()


@bp.post("/webhook")
@roles_required("admin")
def save_webhook():
    form = WebhookForm()
    if not form.validate_on_submit():
        return _page(webhook=form), 422  # (only the CSRF token can fail here)
    try:
        channel, secret = actions.save_webhook(db.session, services().config, _admin(), form.url.data or "")
    except notify.ChannelError as exc:
        db.session.rollback()
        form.url.errors = [str(exc)]
        return _page(webhook=form), 422
    if secret:
        return _page(new_secret=secret), 201
    flash(f"Saved: reminders are posted to {channel.url}.", "info")
    return redirect(url_for(".index"), code=303)


@bp.post("/webhook/rotate")
@roles_required("admin")
def rotate_secret():
    if not FlaskForm().validate_on_submit():
        abort(400)
    return _page(new_secret=actions.rotate_webhook_secret(db.session, services().config, _admin()))


@bp.post("/email")
@roles_required("admin")
def save_email():
    form = EmailForm()
    if not form.validate_on_submit():
        return _page(email=form), 422
    try:
        channel = actions.save_email(db.session, _admin(), form.recipients.data or "")
    except notify.ChannelError as exc:
        db.session.rollback()
        form.recipients.errors = [str(exc)]
        return _page(email=form), 422
    flash(f"Saved: reminders are e-mailed to {', '.join(channel.recipients)}.", "info")
    return redirect(url_for(".index"), code=303)


@bp.post("/<any(webhook, email):kind>/test")
@roles_required("admin")
def send_test(kind: str):
    if not FlaskForm().validate_on_submit():
        abort(400)
    row = actions.send_test(db.session, services().config, _admin(), kind)
    words = "webhook" if kind == "webhook" else "e-mail"
    if row.status == "delivered":
        flash(f"The test {words} was delivered{f' (HTTP {row.http_status})' if row.http_status else ''}.", "info")
    else:
        flash(f"The test {words} was not delivered: {row.error}", "error")
    return redirect(url_for(".index"), code=303)


@bp.post("/<any(webhook, email):kind>/remove")
@roles_required("admin")
def remove(kind: str):
    if not FlaskForm().validate_on_submit():
        abort(400)
    if actions.remove_channel(db.session, _admin(), kind):
        flash(f"Removed: nothing more is sent by {'webhook' if kind == 'webhook' else 'e-mail'}.", "info")
    return redirect(url_for(".index"), code=303)


def _page(webhook: WebhookForm | None = None, email: EmailForm | None = None, new_secret: str | None = None) -> str:
    channels = notify.channels(db.session, _admin().tenant_id)
    if webhook is None:
        webhook = WebhookForm(formdata=None, url=channels["webhook"].url if "webhook" in channels else "")
    if email is None:
        saved = "\n".join(channels["email"].recipients or []) if "email" in channels else ""
        email = EmailForm(formdata=None, recipients=saved)
    deliveries = notify.recent_deliveries(db.session, _admin().tenant_id)
    failures = sum(1 for row in deliveries if row.status == "failed")
    config = services().config
    return render_template(
        "accounts/notifications.html",
        channels=channels,
        webhook=webhook,
        email=email,
        new_secret=new_secret,
        deliveries=deliveries,
        failures=plural(failures, "failure"),
        smtp_ready=bool(config.smtp_host),
        admins=notify.admin_addresses(db.session, _admin().tenant_id),
    )


def _admin():
    return current_user._get_current_object()
