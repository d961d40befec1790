"""GET /healthz: can this process reach the database and Redis, and how many workers are there."""

from __future__ import annotations

from flask import Blueprint, jsonify
from redis import RedisError
from rq import Worker
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from webapp.runtime.extensions import db
from webapp.runtime.services import services
from webapp.web.security import public

bp = Blueprint("health", __name__)


@bp.get("/healthz")
@public
def healthz():
    report: dict = {}
    try:
        db.session.execute(text("SELECT 1"))
        report["database"] = "ok"
    except SQLAlchemyError as exc:
        report["database"] = f"error: {type(exc).__name__}"
    finally:
        db.session.rollback()
    try:
        redis = services().dispatcher.redis
        redis.ping()
        report["redis"] = "ok"
        report["workers"] = Worker.count(connection=redis)
        report["queued"] = sum(queue.count for queue in services().dispatcher.move_queues)
    except (RedisError, OSError) as exc:
        report["redis"] = f"error: {type(exc).__name__}"
        report["workers"] = None
    healthy = report["database"] == "ok" and report["redis"] == "ok"
    report["status"] = "ok" if healthy else "degraded"
    return jsonify(report), 200 if healthy else 503
