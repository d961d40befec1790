"""The notifications admin page: where the tenant is told that calls wait (a webhook, signed with a
secret the desk makes and shows once; e-mail to a list of addresses), a test message per channel, and
the log of recent deliveries with the reason of each failure; and the tenant's event webhooks
(webapp/webhooks/): subscribe, remove, and each one's delivery log with "Send again". Every change is
audited."""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for
from flask_login import current_user
from flask_wtf import FlaskForm
from wtforms import SelectMultipleField, StringField, TextAreaField
from wtforms.widgets import CheckboxInput, ListWidget

from webapp import notify, webhooks
from webapp.refusals import Refusal
from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.settings import notification_actions as actions
from webapp.settings import webhook_actions
from webapp.tools.presenting import plural
from webapp.web.errors import status_of
from webapp.web.pagination import BadCursor
from webapp.web.security import roles_required

bp = Blueprint("notifications", __name__, url_prefix="/admin/notifications")


class WebhookForm(FlaskForm):
    url = StringField("Webhook address")


class EmailForm(FlaskForm):
    recipients = TextAreaField("E-mail addresses")


class SubscriptionForm(FlaskForm):
    url = StringField("Address")
    events = SelectMultipleField(
        "Events",
        choices=list(webhooks.EVENT_TYPES),
        widget=ListWidget(prefix_label=False),
        option_widget=CheckboxInput(),
        validate_choice=False,  # webhooks.subscribe names an unknown one
    )


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


@bp.post("/webhooks")
@roles_required("admin")
def subscribe():
    form = SubscriptionForm()
    if not form.validate_on_submit():
        return _page(subscription=form), 422
    try:
        subscription, secret = webhook_actions.subscribe(db.session, _admin(), form.url.data or "", form.events.data)
    except Refusal as refused:
        form.url.errors = [refused.message]
        return _page(subscription=form), 422
    return _page(new_subscription=(subscription, secret)), 201


@bp.post("/webhooks/<int:webhook_id>/remove")
@roles_required("admin")
def unsubscribe(webhook_id: int):
    if not FlaskForm().validate_on_submit():
        abort(400)
    subscription = _or_404(lambda: webhook_actions.remove(db.session, _admin(), webhook_id))
    flash(f"Removed: no more events go to {subscription.url}; its delivery log stays.", "info")
    return redirect(url_for(".index"), code=303)


@bp.get("/webhooks/<int:webhook_id>")
@roles_required("admin")
def webhook_log(webhook_id: int):
    subscription = _or_404(lambda: webhook_actions.find(db.session, _admin(), webhook_id))
    try:
        page = webhook_actions.deliveries(db.session, _admin(), webhook_id, request.args.get("cursor"), 50)
    except BadCursor:
        return redirect(url_for(".webhook_log", webhook_id=webhook_id), code=303)
    return render_template(
        "settings/webhook_log.html", subscription=subscription, deliveries=page.rows, next_cursor=page.next_cursor
    )


@bp.post("/webhooks/<int:webhook_id>/deliveries/<int:delivery_id>/redeliver")
@roles_required("admin")
def redeliver(webhook_id: int, delivery_id: int):
    if not FlaskForm().validate_on_submit():
        abort(400)
    delivery = _or_404(lambda: webhook_actions.redeliver(db.session, _admin(), webhook_id, delivery_id))
    flash(f"{delivery.event_type} ({delivery.event_id}) is being sent again, under the same id.", "info")
    return redirect(url_for(".webhook_log", webhook_id=webhook_id), code=303)


def _or_404(act):
    try:
        return act()
    except Refusal as refused:
        abort(status_of(refused), refused.message)


def _page(
    webhook: WebhookForm | None = None,
    email: EmailForm | None = None,
    new_secret: str | None = None,
    subscription: SubscriptionForm | None = None,
    new_subscription: tuple | None = None,
) -> str:
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
        "settings/notifications.html",
        channels=channels,
        webhook=webhook,
        email=email,
        new_secret=new_secret,
        deliveries=deliveries,
        failures=plural(failures, "failure"),
        smtp_ready=bool(config.smtp_host),
        admins=notify.admin_addresses(db.session, _admin().tenant_id),
        subscription=subscription or SubscriptionForm(formdata=None),
        subscriptions=webhooks.subscriptions(db.session, _admin().tenant_id),
        new_subscription=new_subscription,
        event_types=webhooks.EVENT_TYPES,
    )


def _admin():
    return current_user._get_current_object()
