"""The security boundary shared by every page and API call: who is signed in, which roles a view
allows, CSRF, rate limits and response headers.

Every view declares who may use it with @roles_required(...) (pages) or @api_roles(...) (API), or
is explicitly @public. The role-matrix test walks the app's url_map and fails on a view that
declares nothing.
"""

from __future__ import annotations

from functools import wraps
from urllib.parse import urlsplit

from flask import Flask, abort, g, redirect, request, url_for
from flask.sessions import SecureCookieSessionInterface
from flask_limiter import Limiter
from flask_login import LoginManager, current_user
from flask_talisman import Talisman
from flask_wtf.csrf import CSRFProtect
from sqlalchemy import select

from webapp.config import Config
from webapp.identity import user_for_token
from webapp.models import ROLES, User
from webapp.runtime.extensions import db
from webapp.web.errors import Refused
from webapp.web.htmx import is_htmx

login_manager = LoginManager()
csrf = CSRFProtect()


def _client_address() -> str:
    return request.remote_addr or "unknown"


limiter = Limiter(key_func=_client_address, swallow_errors=True, in_memory_fallback_enabled=True)

CSP = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self' data:",
    "connect-src": "'self'",
    "font-src": "'self'",
    "object-src": "'none'",
    "base-uri": "'self'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
}


class SessionCookies(SecureCookieSessionInterface):
    """Signed-cookie sessions whose idle clock only a person's own requests restart.

    A page's live refreshes (the GETs htmx makes by itself, the live stream's reconnects) answer
    without a cookie unless they changed the session. Otherwise an open page would keep an idle session
    alive for ever, and a refresh sent just before a decision and answered just after it would put back
    the cookie from before the decision, taking the decision's message ("You approved ...") meant for
    the next page."""

    def should_set_cookie(self, app: Flask, session) -> bool:
        if session.modified:
            return True
        background = request.method == "GET" and (
            request.headers.get("HX-Request") == "true" or "text/event-stream" in request.headers.get("Accept", "")
        )
        return not background and super().should_set_cookie(app, session)


def init_app(app: Flask, config: Config) -> None:
    """Wire sign-in, CSRF, rate limits and security headers into the app."""
    app.config.update(
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=config.secure_cookies,
        PERMANENT_SESSION_LIFETIME=config.session_idle_minutes * 60,  # restarted by each request a person makes
        SESSION_REFRESH_EACH_REQUEST=True,
        REMEMBER_COOKIE_HTTPONLY=True,
        WTF_CSRF_TIME_LIMIT=None,  # the token lives as long as the session
        RATELIMIT_STORAGE_URI=_limiter_storage(config),
        RATELIMIT_HEADERS_ENABLED=False,
    )
    app.session_interface = SessionCookies()
    login_manager.init_app(app)
    login_manager.login_view = "auth.login"
    login_manager.login_message = "Sign in to continue."
    login_manager.login_message_category = "info"
    csrf.init_app(app)
    limiter.init_app(app)
    Talisman(
        app,
        force_https=False,  # TLS ends at the proxy; cookies turn Secure with SECURE_COOKIES=1
        session_cookie_secure=config.secure_cookies,
        content_security_policy=CSP,
        frame_options="DENY",
        referrer_policy="same-origin",
        strict_transport_security=config.secure_cookies,
    )


def _limiter_storage(config: Config) -> str:
    url = config.redis_url
    if not url:
        return "memory://"  # the laptop default runs one web process
    return "redis+unix://" + url.removeprefix("unix://") if url.startswith("unix://") else url


@login_manager.user_loader
def _load_user(session_id: str) -> User | None:
    """A session names the user and their session token: a disabled user or a reset password
    (both change the token) ends every session at once."""
    user_id, _, token = session_id.partition(":")
    if not user_id.isdigit():
        return None
    user = db.session.get(User, int(user_id))
    if user is None or not user.active or user.session_token != token:
        return None
    return user


# --- declaring who may use a view -----------------------------------------------------------------


def signed_in(view):
    """Any signed-in person, whatever their role."""
    return roles_required(*ROLES)(view)


def public(view):
    """Anyone, signed in or not (sign-in page, health check)."""
    view.allowed_roles = "public"
    return view


def roles_required(*roles: str):
    """A page for signed-in people holding at least one of these roles; others get 403, and
    signed-out visitors are sent to sign in."""

    def decorate(view):
        @wraps(view)
        def wrapper(*args, **kwargs):
            if not current_user.is_authenticated:
                if is_htmx():  # htmx would swap the sign-in page into a fragment
                    return "", 401, {"HX-Redirect": url_for("auth.login", next=request.full_path.rstrip("?"))}
                return login_manager.unauthorized()
            if not any(current_user.has_role(role) for role in roles):
                abort(403, description=f"This page is for people with the {' or '.join(roles)} role.")
            return view(*args, **kwargs)

        wrapper.allowed_roles = roles
        return wrapper

    return decorate


def api_roles(*roles: str):
    """An API call for bearer tokens of people holding one of these roles (401 without a valid
    token, 403 with the wrong role). The person is g.user."""

    def decorate(view):
        @wraps(view)
        def wrapper(*args, **kwargs):
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            user = user_for_token(db.session, token.strip()) if scheme.lower() == "bearer" else None
            if user is None:
                raise Refused(401, "unauthorized", "Send a valid API token: Authorization: Bearer <token>.")
            if not any(user.has_role(role) for role in roles):
                raise Refused(403, "forbidden", f"This call needs the {' or '.join(roles)} role.")
            g.user = user
            return view(*args, **kwargs)

        wrapper.allowed_roles = roles
        return wrapper

    return decorate


def safe_next(target: str | None) -> str | None:
    """A same-site path to return to after sign-in, never another origin: one "/" then a path, with
    no backslash and no control character (browsers drop tabs and newlines, so "/\t/evil.test" would
    become "//evil.test"), and no scheme or host however it is read. None for anything else."""
    if not target or not target.isprintable() or "\\" in target:
        return None
    if not target.startswith("/") or target.startswith("//"):
        return None
    parts = urlsplit(target)
    return None if parts.scheme or parts.netloc else target


def user_by_email(email: str) -> User | None:
    return db.session.scalar(select(User).where(User.email == email.strip().lower()))


def redirect_home():
    return redirect(url_for("home.index") if current_user.is_authenticated else url_for("auth.login"))


def still_signed_in(session_id: str) -> bool:
    """Whether a session (its User.get_id()) still signs its person in, by the rule every request
    applies (the user loader): for a response that outlives its request, such as a live stream."""
    return _load_user(session_id) is not None
