"""Fixtures of the fault drills: a pool of workers forked from the session's zygote (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.drills.support import WorkerPool, api_with


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "drill: a fault drill on real processes (tests/drills); runs in every pytest run"
    )


@pytest.fixture
def pool(zygote, env, tmp_path) -> Iterator[WorkerPool]:
    """Workers for one drill; every one of them is stopped (SIGKILL) when the drill ends."""
    workers = WorkerPool(zygote, env, tmp_path)
    yield workers
    workers.stop()
    print(workers.logs())  # shown when the drill failed


@pytest.fixture
def configured_api(env, clean):
    """configured_api(**settings): an ApiClient on an app built with these settings on top of `env`
    (a job's retry policy is set by whoever enqueues it); its database pool is closed afterwards."""
    from webapp.runtime.extensions import db

    made = []

    def make(**settings: str):
        made.append(api_with(env, **settings))
        return made[-1]

    yield make
    for client in made:
        with client.app.app_context():
            db.engine.dispose()
