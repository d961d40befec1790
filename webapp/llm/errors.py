"""What goes wrong with a model endpoint, in words for the person who asked: registering one, a
tenant's choice of one, or reading its key at use."""

from __future__ import annotations


class EndpointError(ValueError):
    """An endpoint that cannot be registered or used as asked; the message says what to fix, `field`
    names the form field it is about (the pages mark it)."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class EndpointNotAllowed(EndpointError):
    """A tenant's choice of an endpoint it may not use (or that does not exist: the two read the same,
    so a tenant learns nothing of other tenants' endpoints). The attempt is audited on `tenant_id`'s chain."""

    def __init__(self, message: str, field: str, tenant_id: int) -> None:
        super().__init__(message, field)
        self.tenant_id = tenant_id
