"""What every benchmark here shares: a scratch backend (SQLite file or a PostgreSQL database, an
embedded or real Redis), the app on it, signed-in test clients, percentiles, and one way to print
tables and write results (JSON, plus the tables as Markdown) to bench/results/."""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import redis as redis_lib
from sqlalchemy import create_engine, select, text

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
BACKEND_LABELS = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}


# --- numbers -----------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def stats(values: Sequence[float], digits: int = 2) -> dict:
    """count, p50, p95 and p99 of a list of milliseconds."""
    if not values:
        raise ValueError("no samples")
    return {
        "count": len(values),
        "p50_ms": round(statistics.median(values), digits),
        "p95_ms": round(percentile(values, 95), digits),
        "p99_ms": round(percentile(values, 99), digits),
    }


def time_page(client, url: str, count: int, headers: dict | None = None) -> dict:
    """GET url count times (after two warm-up requests): stats of the response times in ms."""
    times = []
    for n in range(count + 2):
        started = time.perf_counter()
        response = client.get(url, headers=headers)
        elapsed = (time.perf_counter() - started) * 1000
        if response.status_code != 200:
            raise RuntimeError(f"{url} answered {response.status_code}")
        if n >= 2:
            times.append(elapsed)
    return {"url": url, **stats(times, 1)}


def fmt(value: float | int | None) -> str:
    """A figure for a table: thousands separators, fewer decimals as it grows."""
    if value is None:
        return "-"
    if isinstance(value, int) or abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def ratio(numerator: float | None, denominator: float | None) -> str:
    if not numerator or not denominator:
        return "-"
    return f"{numerator / denominator:.2f}x"


# --- tables and results ------------------------------------------------------------------------


class Table:
    """A titled table that prints aligned for a terminal and renders as Markdown for docs/performance.md."""

    def __init__(self, title: str, headers: Sequence[str], labels: int = 1) -> None:
        self.title = title
        self.labels = labels  # how many leading columns are labels (left-aligned)
        self.headers = list(headers)
        self.rows: list[list[str]] = []

    def add(self, *cells) -> None:
        if len(cells) != len(self.headers):
            raise ValueError(f"{self.title}: {len(cells)} cells for {len(self.headers)} columns")
        self.rows.append([cell if isinstance(cell, str) else fmt(cell) for cell in cells])

    def text(self) -> str:
        widths = [max([len(h), *(len(r[i]) for r in self.rows)]) for i, h in enumerate(self.headers)]

        def line(cells: list[str]) -> str:
            pairs = enumerate(zip(cells, widths, strict=True))
            aligned = (c.ljust(w) if i < self.labels else c.rjust(w) for i, (c, w) in pairs)
            return "  ".join(aligned).rstrip()

        return "\n".join([self.title, line(self.headers), line(["-" * w for w in widths]), *map(line, self.rows)])

    def markdown(self) -> str:
        head = "| " + " | ".join(self.headers) + " |"
        rule = "|" + "|".join("---" if i < self.labels else "---:" for i in range(len(self.headers))) + "|"
        body = ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join([f"**{self.title}**", "", head, rule, *body])


def save(name: str, report: dict, tables: Sequence[Table], out_dir: Path | None = None) -> Path:
    """Print the tables, then write the report as JSON (and the tables as Markdown beside it);
    returns the JSON file's path."""
    for table in tables:
        print()
        print(table.text())
    out_dir = out_dir or RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = f"{datetime.now(UTC):%Y%m%dT%H%M%S}"
    path = out_dir / f"{name}-{stamp}.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    path.with_suffix(".md").write_text("\n\n".join(t.markdown() for t in tables) + "\n")
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    print(f"\nJSON: {shown} (tables as Markdown: {shown.with_suffix('.md')})")
    return path


def new_report(**fields) -> dict:
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        **fields,
        "backends": {},
    }


def progress(message: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


# --- backends ----------------------------------------------------------------------------------


def postgres_from(arg: str | None) -> str | None:
    """The PostgreSQL database to use: --postgres, else $BENCH_POSTGRES_URL. Never $DATABASE_URL:
    the benchmark wipes the database's schema, and DATABASE_URL may be someone's real data."""
    url = arg or os.environ.get("BENCH_POSTGRES_URL") or None
    if url and not url.startswith("postgresql"):
        raise SystemExit(f"--postgres / BENCH_POSTGRES_URL must be a postgresql:// URL, not {url!r}")
    return url


def reset_postgres(url: str) -> None:
    """Drop and recreate the public schema of this database (every table of the app goes)."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text("DROP SCHEMA IF EXISTS public CASCADE"))
            connection.execute(text("CREATE SCHEMA public"))
    finally:
        engine.dispose()


@contextmanager
def backend(name: str, postgres: str | None = None, redis_url: str | None = None) -> Iterator[dict]:
    """The environment for one backend, with an empty database and an empty Redis database; the
    process's os.environ is updated too (the app and its worker subprocesses read it)."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        env = {"INSTANCE_PATH": tmp, "SECRET_KEY": "bench", "QUEUE_NAME": "bench-moves", "MOVE_BUDGET": "50"}
        env["EXTRA_TOOLS"] = "demo.billing:TOOLS"  # the billing demo, as bin/demo loads it
        server = None
        if name == "sqlite":
            env["DATABASE_URL"] = f"sqlite:///{tmp}/bench.db"
        elif name == "postgresql":
            if not postgres:
                raise ValueError("the postgresql backend needs a database URL")
            reset_postgres(postgres)
            env["DATABASE_URL"] = postgres
        else:
            raise ValueError(f"unknown backend {name!r}")
        if redis_url:
            env["REDIS_URL"] = redis_url
        else:
            from webapp.runtime import embedded_redis

            env["REDIS_URL"] = embedded_redis.ensure_running(Path(tmp))
            server = Path(tmp)
        redis_lib.Redis.from_url(env["REDIS_URL"]).flushdb()
        os.environ.pop("ANTHROPIC_API_KEY", None)  # the offline demo model, always
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        try:
            yield env
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            if redis_url:
                redis_lib.Redis.from_url(redis_url).flushdb()
            if server is not None:
                from webapp.runtime import embedded_redis

                embedded_redis.stop(server)


def make_app(env: dict):
    from webapp import create_app
    from webapp.config import Config

    return create_app(Config.from_env(env))


def prepare(app) -> None:
    """Migrate and seed the demo tenants and logins."""
    from flask_migrate import upgrade

    from demo.billing.seed import seed_demo
    from webapp.runtime.extensions import db

    with app.app_context():
        upgrade()
        seed_demo(db.session)
        db.session.commit()
        db.session.remove()


def dispose(app) -> None:
    with app.app_context():
        from webapp.runtime.extensions import db

        db.session.remove()
        db.engine.dispose()


def signed_in(app, email: str):
    """A test client carrying this person's session, and bearer headers with a fresh API token."""
    from webapp.identity import create_token, open_session
    from webapp.models import User
    from webapp.runtime.extensions import db
    from webapp.web.security import SESSION_KEY

    client = app.test_client()
    with app.app_context():
        user = db.session.scalar(select(User).where(User.email == email))
        key = open_session(db.session, user)  # the server-side session the cookie names
        with client.session_transaction() as session:
            session["_user_id"] = user.get_id()
            session["_fresh"] = True
            session[SESSION_KEY] = key
            session.permanent = True
        token = create_token(db.session, user)
        db.session.commit()
        db.session.remove()
    return client, {"Authorization": f"Bearer {token}"}
