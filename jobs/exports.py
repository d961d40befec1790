"""The export job behind the export_customer_data tool: it writes one customer's data to a JSON file,
reporting its progress in the job's meta, and stops when the tool asks it to (the conversation was
stopped). It runs inside the worker's app context (see webapp.worker)."""

from __future__ import annotations

import json
import os
import time

from rq import get_current_job
from sqlalchemy import select

from webapp.extensions import db
from webapp.logs import bind_job
from webapp.models import Customer, Invoice, Refund, utcnow
from webapp.queue import background_cancel_key
from webapp.services import services
from webapp.tools.billing import customer_dict

PARTS = ("profile", "invoices", "refunds")


def export_path(tenant_id: int, file_name: str):
    """Where a tenant's export file lives: one folder per tenant, so a name cannot reach another's."""
    return services().config.export_dir / str(tenant_id) / file_name


@bind_job
def export_customer_data(tenant_id: int, customer_id: int, file_name: str) -> dict:
    """Write the customer's profile, invoices and refunds (this tenant's only) and return the file's
    name and size; returns {"cancelled": True} if the tool asked it to stop."""
    desk = services()
    job = get_current_job()
    pace = desk.config.export_step_seconds
    document: dict = {"exported_at": utcnow().isoformat(), "tenant_id": tenant_id}

    def cancelled() -> bool:
        return job is not None and bool(desk.dispatcher.redis.exists(background_cancel_key(job.id)))

    try:
        for number, part in enumerate(PARTS, start=1):
            if cancelled():
                return {"cancelled": True}
            document[part] = _read(part, tenant_id, customer_id)
            db.session.remove()  # no transaction stays open between parts (on SQLite it would block every move)
            if job is not None:
                job.meta.update(
                    progress=number / (len(PARTS) + 1), message=f"Exported {part} ({number} of {len(PARTS)})."
                )
                job.save_meta()
            time.sleep(pace)
    finally:
        db.session.remove()
    if cancelled():
        return {"cancelled": True}
    path = export_path(tenant_id, file_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".part")
    partial.write_text(json.dumps(document, indent=2, default=str))
    os.replace(partial, path)  # the file appears whole, or not at all
    return {
        "file": file_name,
        "bytes": path.stat().st_size,
        "customer_id": customer_id,
        "invoices": len(document["invoices"]),
        "refunds": len(document["refunds"]),
    }


def _read(part: str, tenant_id: int, customer_id: int):
    session = db.session
    if part == "profile":
        customer = session.scalar(select(Customer).where(Customer.id == customer_id, Customer.tenant_id == tenant_id))
        if customer is None:
            raise LookupError(f"no customer {customer_id} in tenant {tenant_id}")
        return {**customer_dict(customer), "created_at": customer.created_at, "closed_at": customer.closed_at}
    invoices = session.scalars(
        select(Invoice).where(Invoice.customer_id == customer_id, Invoice.tenant_id == tenant_id).order_by(Invoice.id)
    ).all()
    if part == "invoices":
        return [
            {
                "id": invoice.id,
                "amount_cents": invoice.amount_cents,
                "currency": invoice.currency,
                "status": invoice.status,
                "description": invoice.description,
                "issued_at": invoice.issued_at,
            }
            for invoice in invoices
        ]
    refunds = session.scalars(
        select(Refund)
        .where(Refund.tenant_id == tenant_id, Refund.invoice_id.in_([invoice.id for invoice in invoices]))
        .order_by(Refund.id)
    ).all()
    return [
        {
            "id": refund.id,
            "invoice_id": refund.invoice_id,
            "amount_cents": refund.amount_cents,
            "reason": refund.reason,
            "created_at": refund.created_at,
        }
        for refund in refunds
    ]
