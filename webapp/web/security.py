"""The security boundary shared by every page and API call: who is signed in, which roles a view
allows, CSRF, rate limits and response headers.

Every view declares who may use it with @roles_required(...) (pages) or @api_roles(...) (API), or
is explicitly @public. The role-matrix test walks the app's url_map and fails on a view that
declares nothing.
"""

from __future__ import annotations

from datetime import timedelta
from functools import wraps
from urllib.parse import urlsplit

from flask import Flask, abort, current_app, g, redirect, session, url_for
from flask.sessions import SecureCookieSessionInterface
from flask_limiter import Limiter
from flask_login import LoginManager, current_user, login_user
from flask_talisman import Talisman
from flask_wtf.csrf import CSRFProtect
from htmx_flask import make_response, request
from limits import parse as parse_limit
from sqlalchemy import select

from webapp import identity
from webapp.config import Config
from webapp.identity import AccountError, user_for_token
from webapp.models import OPERATOR, ROLES, User, utcnow
from webapp.runtime.extensions import db
from webapp.web.errors import Refused
from webapp.web.htmx import is_htmx

login_manager = LoginManager()
csrf = CSRFProtect()


def _client_address() -> str:
    return request.remote_addr or "unknown"


limiter = Limiter(key_func=_client_address, swallow_errors=True, in_memory_fallback_enabled=True)

# Failed sign-ins allowed per account; past it the account is locked until the window passes or an
# admin unlocks it (unlock_account).
ACCOUNT_SIGN_IN_LIMIT = "5 per 15 minutes"
_SIGN_IN_ENDPOINT = "auth.login"  # the limit's scope: the view it decorates


def account_limit_key(email: str) -> str:
    """The rate-limit key of sign-ins to this account."""
    return "account:" + (email or "").strip().lower()[:254]


def account_locked(email: str) -> bool:
    """Whether too many failed sign-ins locked this account (False when the limiter cannot tell)."""
    try:
        return not limiter.limiter.test(parse_limit(ACCOUNT_SIGN_IN_LIMIT), account_limit_key(email), _SIGN_IN_ENDPOINT)
    except Exception:  # the limiter's storage is unreachable: it does not lock anyone then either
        return False


def unlock_account(email: str) -> bool:
    """Forget the account's failed sign-ins; True if they had locked it. AccountError when the store
    of the sign-in limits cannot be reached."""
    locked = account_locked(email)
    try:
        limiter.limiter.clear(parse_limit(ACCOUNT_SIGN_IN_LIMIT), account_limit_key(email), _SIGN_IN_ENDPOINT)
    except Exception:
        raise AccountError("the store of the sign-in limits (Redis) cannot be reached; try again in a minute") from None
    return locked


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
        return not is_background_request() and super().should_set_cookie(app, session)


def is_background_request() -> bool:
    """A request the page made by itself (htmx's GETs, the live stream), not one the person made."""
    return request.method == "GET" and (bool(request.htmx) or "text/event-stream" in request.headers.get("Accept", ""))


def takes_up_to(size: int):
    """A view that takes a larger body than MAX_CONTENT_LENGTH (64 KB): a bulk run's items, a file of
    them. Anything larger is still a 413."""

    def mark(view):
        view.takes_up_to = size
        return view

    return mark


def _body_limit() -> None:
    view = current_app.view_functions.get(request.endpoint or "")
    size = getattr(view, "takes_up_to", None)
    if size is not None:
        request.max_content_length = size


def init_app(app: Flask, config: Config) -> None:
    """Wire sign-in, CSRF, rate limits and security headers into the app."""
    app.config.update(
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=config.secure_cookies,
        PERMANENT_SESSION_LIFETIME=config.session_idle_minutes * 60,  # restarted by each request a person makes
        SESSION_MAX_SECONDS=config.session_max_hours * 3600,  # however busy, a session ends after this
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
    app.before_request(_body_limit)  # before CSRF reads a form
    app.before_request(_load_signed_in_person)
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


# The session's key in the cookie: it names a user_sessions row, so signing out ends THIS session for
# good (a copy of the cookie replayed afterwards is signed out too).
SESSION_KEY = "desk_session"
# How stale a session's last_seen_at may get before a request writes it again (at most a quarter of
# the idle limit), so a person's clicks do not each cost a write.
TOUCH_SECONDS = 15.0


def begin_session(user: User) -> None:
    """Sign the person in with a new server-side session (the caller commits)."""
    login_user(user)
    session[SESSION_KEY] = identity.open_session(db.session, user)
    session.permanent = True


def end_this_session() -> None:
    """End the current browser session server-side (the caller commits, then clears the cookie)."""
    identity.end_session(db.session, session.get(SESSION_KEY))


def _load_signed_in_person() -> None:
    """Resolve who is signed in before the view runs, so the loader's own commit (the idle clock)
    never commits a view's half-made changes."""
    if request.endpoint != "static" and "_user_id" in session:
        current_user._get_current_object()


@login_manager.user_loader
def _load_user(session_id: str) -> User | None:
    """A session names the user, their session token and its own key. A disabled user or a reset
    password (both change the token) ends every session at once; signing out ends that session's row;
    a session idle past the idle limit (counted from the person's own last request, never from a
    page's live refreshes) or older than SESSION_MAX_HOURS is ended server-side, whatever the cookie
    says."""
    return _signed_in_person(session_id, session.get(SESSION_KEY), touch=not is_background_request())


def _signed_in_person(session_id: str, key: str | None, touch: bool) -> User | None:
    """The person a session (User.get_id() and its server-side key) signs in, or None; `touch`
    restarts its idle clock (the person's own requests, never a page's live refreshes)."""
    user_id, _, token = session_id.partition(":")
    if not user_id.isdigit():
        return None
    user = db.session.get(User, int(user_id))
    if user is None or not user.active or user.session_token != token:
        return None
    idle = current_app.permanent_session_lifetime
    longest = timedelta(seconds=current_app.config["SESSION_MAX_SECONDS"])
    now = utcnow()
    row = identity.live_session(db.session, user, key, idle, longest, now)
    if row is None:
        db.session.commit()  # a session found idle or too old stays ended
        return None
    if touch and (now - row.last_seen_at).total_seconds() > min(TOUCH_SECONDS, idle.total_seconds() / 4):
        row.last_seen_at = now
        db.session.commit()
    return user


# --- declaring who may use a view -----------------------------------------------------------------


def signed_in(view):
    """Any signed-in person of a tenant, whatever their role (not an operator: they belong to no tenant)."""
    return roles_required(*ROLES)(view)


def anyone_signed_in(view):
    """Any signed-in person, operators too (the home page, signing out), and a person who holds no
    role for now (the admin role asked for them waits for a second admin)."""
    return roles_required(*ROLES, OPERATOR, or_no_role=True)(view)


def public(view):
    """Anyone, signed in or not (sign-in page, health check)."""
    view.allowed_roles = "public"
    return view


def roles_required(*roles: str, or_no_role: bool = False):
    """A page for signed-in people holding at least one of these roles (`or_no_role`: or none at
    all); others get 403, and signed-out visitors are sent to sign in."""

    def decorate(view):
        @wraps(view)
        def wrapper(*args, **kwargs):
            if not current_user.is_authenticated:
                if is_htmx():  # htmx would swap the sign-in page into a fragment: send the page there
                    return make_response("", 401, redirect=url_for("auth.login", next=_page_of_fragment()))
                return login_manager.unauthorized()
            if not any(current_user.has_role(role) for role in roles) and not (or_no_role and not current_user.roles):
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


def _page_of_fragment() -> str | None:
    """Where to come back to after signing in, for an htmx request that found its person signed out:
    the page it was made from (htmx's HX-Current-URL), never the fragment's own URL (a bare badge);
    None when that page is the sign-in page itself (a request racing a sign-out)."""
    current = urlsplit(request.htmx.current_url or "")
    page = current.path + (f"?{current.query}" if current.query else "")
    if not current.path or current.path == url_for("auth.login"):
        return None
    return safe_next(page)


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


def still_signed_in(session_id: str, key: str | None) -> bool:
    """Whether a session (its User.get_id() and server-side key) still signs its person in, by the
    rule every request applies, without restarting its idle clock: for a response that outlives its
    request, such as a live stream (it runs outside any request, so it is handed what it checks)."""
    return _signed_in_person(session_id, key, touch=False) is not None


def session_key() -> str | None:
    """The current request's server-side session key (for still_signed_in, later)."""
    return session.get(SESSION_KEY)
