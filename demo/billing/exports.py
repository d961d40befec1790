"""The work behind the export_customer_data tool: one customer's profile, invoices and refunds (this
tenant's only) read part by part and written to a JSON file that appears whole or not at all.

It runs in a background job (the worker hands export_job a session, the settings, and the job's
progress and stop hooks), so no worker waits on it while a move is due."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from demo.billing.models import Customer, Invoice, Refund
from demo.billing.tools import customer_dict
from webapp.models import utcnow
from webapp.tools.files import tool_file_path
from webapp.tools.tasks import BackgroundWork

PARTS = ("profile", "invoices", "refunds")


def write_export(
    session: Session,
    export_dir: Path,
    tenant_id: int,
    customer_id: int,
    file_name: str,
    *,
    pace_seconds: float = 0.0,
    cancelled: Callable[[], bool] = lambda: False,
    progress: Callable[[float, str], None] = lambda fraction, message: None,
    end_transaction: Callable[[], None] | None = None,
) -> dict:
    """Write the export and return the file's name and size (and what it holds); returns
    {"cancelled": True} when `cancelled()` says so between parts. `end_transaction` runs after each
    part, so no transaction stays open while the export paces itself (on SQLite it would block
    every move)."""
    document: dict = {"exported_at": utcnow().isoformat(), "tenant_id": tenant_id}
    for number, part in enumerate(PARTS, start=1):
        if cancelled():
            return {"cancelled": True}
        document[part] = _read(session, part, tenant_id, customer_id)
        (end_transaction or session.rollback)()
        progress(number / (len(PARTS) + 1), f"Exported {part} ({number} of {len(PARTS)}).")
        time.sleep(pace_seconds)
    if cancelled():
        return {"cancelled": True}
    path = tool_file_path(export_dir, tenant_id, file_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".part")
    partial.write_text(json.dumps(document, indent=2, default=str))
    os.replace(partial, path)  # the file appears whole, or not at all
    progress(1.0, "Export file written.")
    return {
        "file": file_name,
        "bytes": path.stat().st_size,
        "customer_id": customer_id,
        "invoices": len(document["invoices"]),
        "refunds": len(document["refunds"]),
    }


def _read(session: Session, part: str, tenant_id: int, customer_id: int):
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


def export_job(work: BackgroundWork, tenant_id: int, customer_id: int, file_name: str) -> dict:
    """The export tool's background work (started by the tool, run in a worker): write the file,
    telling the call's page how far it is; {"cancelled": True} when the conversation was stopped."""
    work.progress(0.0, "Export started.")
    try:
        result = write_export(
            work.session,
            work.config.export_dir,
            tenant_id,
            customer_id,
            file_name,
            pace_seconds=work.config.export_step_seconds,
            cancelled=work.cancelled,
            progress=work.progress,
            end_transaction=work.end_transaction,
        )
    except Exception:
        work.tell("failed", 0.0, "The export failed; the assistant is told why.")
        raise
    if result.get("cancelled"):
        work.tell("cancelled", 0.0, "Export stopped: the conversation was stopped.")
    return result
