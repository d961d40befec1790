"""The RQ entry point of the export_customer_data tool's background job (its work is
webapp/tools/exports.py, run through webapp/runtime/work.py)."""

from __future__ import annotations

from rq import get_current_job

from webapp.runtime import work
from webapp.runtime.job_logs import bind_job


@bind_job
def export_customer_data(tenant_id: int, customer_id: int, file_name: str) -> dict:
    """Write one customer's export file; returns its name and size, or {"cancelled": True}."""
    return work.export_customer_data(tenant_id, customer_id, file_name, job=get_current_job())
