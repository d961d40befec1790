"""Fixtures the operators' pages share."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from webapp.models import AuditEvent


@pytest.fixture
def events(read):
    """events(action): this test's audit events of that action (the audit log outlives a test)."""
    start = read(lambda s: s.scalar(select(func.max(AuditEvent.id)))) or 0

    def of(action: str) -> list[AuditEvent]:
        query = select(AuditEvent).where(AuditEvent.action == action, AuditEvent.id > start).order_by(AuditEvent.id)
        return read(lambda s: list(s.scalars(query)))

    return of
