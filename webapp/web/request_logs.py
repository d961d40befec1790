"""A request id (the caller's X-Request-ID when it is sane, else a new one) and the URL's
conversation and tool-call ids on every log line of a web request; the id is echoed in the response."""

from __future__ import annotations

import logging
import time

from flask import g, request

from webapp.logs import new_request_id, pop, push

REQUEST_ID_HEADER = "X-Request-ID"
request_log = logging.getLogger("desk.request")
_VIEW_ARG_IDS = {"conversation_id": "conversation_id", "tool_call_id": "tool_call_id"}


def init_app(app) -> None:
    """Bind a request id (the caller's X-Request-ID when it is sane, else a new one) and the
    conversation/tool-call id of the URL around every request; echo the id in the response."""

    @app.before_request
    def _bind_request_ids() -> None:
        incoming = request.headers.get(REQUEST_ID_HEADER, "")
        request_id = incoming if 0 < len(incoming) <= 64 and incoming.replace("-", "").isalnum() else new_request_id()
        ids: dict[str, object] = {"request_id": request_id}
        for arg, field in _VIEW_ARG_IDS.items():
            value = (request.view_args or {}).get(arg)
            if isinstance(value, int):
                ids[field] = value
        g.log_token = push(**ids)
        g.request_id = request_id
        g.request_started = time.perf_counter()

    @app.after_request
    def _log_request(response):
        request_id = g.get("request_id")
        if request_id:
            response.headers.setdefault(REQUEST_ID_HEADER, request_id)
        started = g.get("request_started")
        if started is not None and request.endpoint != "static":
            request_log.info(
                "%s %s %s",
                request.method,
                request.path,
                response.status_code,
                extra={
                    "method": request.method,
                    "path": request.path,
                    "status": response.status_code,
                    "duration_ms": round((time.perf_counter() - started) * 1000, 1),
                    "endpoint": request.endpoint,
                },
            )
        return response

    @app.teardown_request
    def _unbind_request_ids(_exc=None) -> None:
        token = g.pop("log_token", None)
        if token is not None:
            pop(token)
