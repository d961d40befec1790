"""Exports of the audit log that can be verified outside the app: every event as a record of its id,
every hashed field and its hash (`record`), read in id order in batches (`ascending`) and written as
CSV (`csv_chunks`, typed again by `record_from_csv`) or JSON Lines (`jsonl_chunks`).

A spreadsheet runs a cell that starts with = + - @ (or a tab or carriage return) as a formula, so the
CSV export prefixes such a cell with a single quote (OWASP's advice), and a cell that starts with a
quote too, so that taking one leading quote off every cell that has one gives the text back exactly
(`cell_from_csv`). JSON Lines carries the text as it is.

Batches are read on short connections of their own, after the request's session is gone: on SQLite
every transaction holds the write lock (BEGIN IMMEDIATE), so one long read would stop every writer.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator, Mapping

from sqlalchemy import Text, cast, select
from sqlalchemy.engine import Engine

from webapp.audit_chain import HASHED_FIELDS
from webapp.models import AuditEvent

EXPORT_FIELDS = ("id", *HASHED_FIELDS, "hash")
EXPORT_BATCH = 2000
_INT_FIELDS = ("id", "seq", "tenant_id", "actor_id", "conversation_id", "tool_call_id")
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "'")  # and the quote itself, so the prefix reads back


def record(event) -> dict:
    """An event as exported: its id, every hashed field (created_at as ISO 8601) and its hash, so
    audit.event_hash(record) can be checked against record["hash"] outside the app."""
    fields = {name: getattr(event, name) for name in EXPORT_FIELDS}
    fields["created_at"] = event.created_at.isoformat(timespec="microseconds")
    return fields


def csv_cell(value):
    """A value as the CSV export writes it: text that a spreadsheet would run as a formula is
    prefixed with a single quote (as is text that starts with one); anything else as it is."""
    return "'" + value if isinstance(value, str) and value.startswith(_FORMULA_STARTS) else value


def cell_from_csv(cell: str) -> str:
    """A cell of the CSV export as the text it stands for: one leading single quote taken off."""
    return cell[1:] if cell.startswith("'") else cell


def record_from_csv(row: Mapping[str, str]) -> dict:
    """A row of the CSV export typed again (the quote before formula-like text taken off, ids as
    numbers, empty cells as null, data parsed), ready for audit.canonical() and audit.event_hash()."""
    fields = {name: (cell_from_csv(row[name]) if row[name] != "" else None) for name in EXPORT_FIELDS}
    for name in _INT_FIELDS:
        fields[name] = None if fields[name] is None else int(fields[name])
    fields["data"] = json.loads(row["data"])
    return fields


def ascending(engine: Engine, selection, batch_size: int | None = None) -> Iterator[list[tuple]]:
    """Every event of `selection` (a queries.Selection) in id order, as tuples of EXPORT_FIELDS with
    created_at in ISO 8601 and data as its stored JSON text (exports copy it rather than parse and
    re-encode it). `batch_size` (default EXPORT_BATCH) rows per short connection, so memory stays
    flat and no transaction outlives a batch. (Not typed as a Selection: queries imports this module.)"""
    columns = [cast(AuditEvent.data, Text) if name == "data" else getattr(AuditEvent, name) for name in EXPORT_FIELDS]
    at = EXPORT_FIELDS.index("created_at")
    batch_size = batch_size or EXPORT_BATCH
    after = 0
    while True:
        query = select(*columns).where(*selection.where, AuditEvent.id > after)
        query = query.order_by(selection.by_id).limit(batch_size)
        with engine.connect() as connection:
            rows = connection.execute(query).all()
        yield [(*row[:at], row[at].isoformat(timespec="microseconds"), *row[at + 1 :]) for row in rows]
        if len(rows) < batch_size:
            return
        after = rows[-1][0]


def csv_chunks(batches: Iterator[list[tuple]]) -> Iterator[str]:
    """The CSV export: a header (EXPORT_FIELDS), then one row per event; data is JSON, null an empty
    cell, formula-like text prefixed with a quote (csv_cell)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)  # lines end in CRLF (RFC 4180), so a cell holding a bare CR is quoted too
    writer.writerow(EXPORT_FIELDS)
    for rows in batches:
        writer.writerows([csv_cell(value) for value in row] for row in rows)  # csv writes None as an empty cell
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()


def jsonl_chunks(batches: Iterator[list[tuple]]) -> Iterator[str]:
    """The JSON Lines export: one object per event, keyed by EXPORT_FIELDS."""
    names = [name for name in EXPORT_FIELDS if name != "data"]
    at = EXPORT_FIELDS.index("data")
    for rows in batches:
        lines = []
        for row in rows:
            head = json.dumps(dict(zip(names, row[:at] + row[at + 1 :], strict=True)), ensure_ascii=False)
            lines.append(f'{head[:-1]}, "data": {row[at]}}}\n')
        yield "".join(lines)
