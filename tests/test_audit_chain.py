"""The audit log: events commit and roll back with their change, chains stay gap-free under
concurrent writers, and verify() names the first edited, deleted or reordered row."""

from __future__ import annotations

import json
import threading
import tracemalloc
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import delete, event, func, insert, select, text
from sqlalchemy.orm import Session

from webapp import audit_chain
from webapp.audit_chain import anchors
from webapp.models import AuditEvent, AuditHead, Tenant, User


@pytest.fixture(autouse=True, scope="module")
def installed():
    audit_chain.install()
    audit_chain.install()  # idempotent


@pytest.fixture
def fresh(engine, clean):
    """An empty audit log before and after the test (the conftest's `clean` leaves the audit tables
    alone): a tampered chain left behind (an event appended past its head, a head deleted) would make
    the next test in this process fail to write its first event."""

    def empty():
        with engine.begin() as connection:
            connection.execute(delete(AuditEvent))
            connection.execute(delete(AuditHead))

    empty()
    yield
    empty()


@pytest.fixture
def tenants(read, fresh) -> list[int]:
    return read(lambda s: s.scalars(select(Tenant.id).order_by(Tenant.id)).all())


def write(engine, tenant_id: int | None, count: int, action: str = "test.event") -> None:
    with Session(engine) as session:
        for n in range(count):
            audit_chain.record(session, action, tenant_id=tenant_id, data={"n": n})
        session.commit()


def events(read, chain: str) -> list[AuditEvent]:
    return read(lambda s: s.scalars(select(AuditEvent).where(AuditEvent.chain == chain).order_by(AuditEvent.seq)).all())


def tamper(engine, sql: str, **params) -> None:
    """Change the log behind the app's back."""
    with engine.begin() as connection:
        connection.execute(text(sql), params)


@contextmanager
def statements(engine):
    seen: list[tuple[str, object]] = []

    def listener(_conn, _cursor, statement, parameters, _context, _many):
        seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", listener)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", listener)


# --- writing ------------------------------------------------------------------------------------


def test_an_event_is_written_at_commit_and_not_before(engine, session, read, tenants):
    actor = read(lambda s: s.scalar(select(User).where(User.tenant_id == tenants[0]).order_by(User.id)))
    moment = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    before = audit_chain.utcnow()
    with statements(engine) as seen:
        audit_chain.record(
            session,
            "tool_call.approved",
            tenant_id=tenants[0],
            actor=actor,
            conversation_id=7,
            tool_call_id=11,
            tool_name="refund_invoice",
            outcome="approved",
            data={"amount_cents": 1200, "due": moment},
        )
    assert seen == [] and not session.in_transaction()  # no SQL, no lock, until commit
    assert session.scalar(select(func.count()).select_from(AuditEvent)) == 0
    session.commit()

    [row] = events(read, str(tenants[0]))
    assert (row.seq, row.tenant_id, row.action, row.outcome) == (1, tenants[0], "tool_call.approved", "approved")
    assert (row.actor_id, row.actor_label) == (actor.id, actor.email)
    assert (row.conversation_id, row.tool_call_id, row.tool_name) == (7, 11, "refund_invoice")
    assert row.data == {"amount_cents": 1200, "due": moment.isoformat()}
    assert before <= row.created_at <= audit_chain.utcnow()
    assert row.prev_hash == audit_chain.GENESIS and row.hash == audit_chain.event_hash(row.__dict__)
    head = read(lambda s: s.get(AuditHead, str(tenants[0])))
    assert (head.seq, head.hash) == (1, row.hash)


def test_the_stored_event_is_exactly_what_was_hashed(session, read, tenants, monkeypatch):
    moment = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    monkeypatch.setattr(audit_chain, "utcnow", lambda: moment)
    data = {"big": 1e16, "one": 1.0, "tenth": 0.1, "tiny": 1.5e-7, "name": "Zoë ✓", "nested": [1, {"b": None}]}
    audit_chain.record(session, "data.shapes", tenant_id=tenants[0], data=data)
    data["name"] = "changed later"  # the event keeps what was recorded
    session.commit()

    [row] = events(read, str(tenants[0]))
    assert row.created_at == moment  # microseconds survive the round trip
    assert row.data["name"] == "Zoë ✓" and row.data["big"] == 1e16 and row.data["tiny"] == 1.5e-7
    assert audit_chain.verify(session) == audit_chain.VerifyResult(True, 1, None, 1)


def test_data_must_be_json(session, fresh):
    with pytest.raises(TypeError, match="JSON-serialisable"):
        audit_chain.record(session, "x", tenant_id=None, data={"what": object()})
    with pytest.raises(TypeError, match="JSON-serialisable"):
        audit_chain.record(session, "x", tenant_id=None, data={"what": float("nan")})


def test_an_actor_created_in_the_same_transaction_gets_its_id(session, read, tenants):
    user = User(tenant_id=tenants[0], email="new.auditor@example.test", roles=["auditor"])
    session.add(user)
    audit_chain.record(session, "user.created", tenant_id=tenants[0], actor=user)
    session.commit()
    [row] = events(read, str(tenants[0]))
    assert (row.actor_id, row.actor_label) == (user.id, "new.auditor@example.test")
    assert audit_chain.verify(session).ok


def test_a_rolled_back_change_leaves_no_event(engine, session, read, tenants):
    chain = str(tenants[0])
    audit_chain.record(session, "rolled.back", tenant_id=tenants[0])
    session.rollback()
    audit_chain.record(session, "closed.unwritten", tenant_id=tenants[0])
    session.scalar(select(func.count()).select_from(AuditEvent))  # opens the transaction close() ends
    session.close()
    session.commit()
    assert events(read, chain) == []

    audit_chain.record(session, "kept", tenant_id=tenants[0])
    savepoint = session.begin_nested()
    audit_chain.record(session, "savepoint.rolled.back", tenant_id=tenants[0])
    savepoint.rollback()
    with session.begin_nested():
        audit_chain.record(session, "savepoint.released", tenant_id=tenants[0])
    session.commit()
    assert [(e.seq, e.action) for e in events(read, chain)] == [(1, "kept"), (2, "savepoint.released")]


def test_chains_are_independent(engine, session, read, tenants):
    first, second = tenants[:2]
    for _ in range(3):
        with Session(engine) as one:
            audit_chain.record(one, "a", tenant_id=first)
            audit_chain.record(one, "b", tenant_id=second)
            audit_chain.record(one, "c", tenant_id=None)
            audit_chain.record(one, "d", tenant_id=first)
            one.commit()
    assert [e.seq for e in events(read, str(first))] == [1, 2, 3, 4, 5, 6]
    assert [e.seq for e in events(read, str(second))] == [1, 2, 3]
    assert {e.tenant_id for e in events(read, "global")} == {None}
    assert audit_chain.verify(session) == audit_chain.VerifyResult(True, 12, None, 3)

    tamper(engine, "DELETE FROM audit_events WHERE chain = :chain AND seq = 2", chain=str(first))
    assert audit_chain.verify(session, str(second)).ok and audit_chain.verify(session, "global").ok
    assert f"chain {first}: seq 2 is missing" in audit_chain.verify(session).problem


# --- verifying ----------------------------------------------------------------------------------


def _swap(chain: str, a: int, b: int) -> list[tuple[str, dict]]:
    sql = "UPDATE audit_events SET seq = :to WHERE chain = :chain AND seq = :at"
    return [(sql, {"chain": chain, "at": a, "to": -1}), (sql, {"chain": chain, "at": b, "to": a}),
            (sql, {"chain": chain, "at": -1, "to": b})]  # fmt: skip


@pytest.mark.parametrize(
    ("damage", "says", "checked"),
    [
        ("edit", "event seq 5 (id {id5}) was altered: its hash does not match its content", 4),
        ("edit and rehash", "event seq 6 (id {id6}) does not link to seq 5 (reordered?)", 5),
        ("delete", "seq 5 is missing (deleted?) between 4 and 6", 4),
        ("delete two", "seqs 5 to 6 are missing (deleted?) between 4 and 7", 4),
        ("delete first", "seq 1 is missing (deleted?) before seq 2", 0),
        ("delete newest", "the head says seq 10 but the last event is seq 9 (the newest events were deleted?)", 9),
        ("swap", "event seq 5 (id {id6}) does not link to seq 4 (reordered?)", 4),
        ("delete head", "it has 10 events but no head row (the head was deleted?)", 10),
        ("append", "event seq 11 lies beyond the head (seq 10); it was written behind the app's back?", 10),
    ],
)
def test_verify_names_the_first_broken_link(engine, session, read, tenants, damage, says, checked):
    chain = str(tenants[0])
    write(engine, tenants[0], 10)
    assert audit_chain.verify(session) == audit_chain.VerifyResult(True, 10, None, 1)
    rows = {e.seq: e for e in events(read, chain)}
    json_param = "CAST(:data AS JSONB)" if engine.dialect.name == "postgresql" else ":data"
    where = {"chain": chain}
    if damage == "edit":
        tamper(engine, f"UPDATE audit_events SET data = {json_param} WHERE chain = :chain AND seq = 5",
               data='{"n": 400}', **where)  # fmt: skip
    elif damage == "edit and rehash":
        forged = {**rows[5].__dict__, "data": {"n": 400}}
        tamper(engine, f"UPDATE audit_events SET data = {json_param}, hash = :hash WHERE chain = :chain AND seq = 5",
               data='{"n": 400}', hash=audit_chain.event_hash(forged), **where)  # fmt: skip
    elif damage.startswith("delete") and damage != "delete head":
        seqs = {"delete": (5,), "delete two": (5, 6), "delete first": (1,), "delete newest": (10,)}[damage]
        for seq in seqs:
            tamper(engine, "DELETE FROM audit_events WHERE chain = :chain AND seq = :seq", seq=seq, **where)
    elif damage == "swap":
        for sql, params in _swap(chain, 5, 6):
            tamper(engine, sql, **params)
    elif damage == "delete head":
        tamper(engine, "DELETE FROM audit_heads WHERE chain = :chain", **where)
    elif damage == "append":
        extra = {**rows[10].__dict__, "seq": 11, "prev_hash": rows[10].hash}
        extra = {name: extra[name] for name in audit_chain.HASHED_FIELDS} | {"hash": audit_chain.event_hash(extra)}
        with engine.begin() as connection:
            connection.execute(insert(AuditEvent.__table__), [extra])

    result = audit_chain.verify(session)
    assert not result.ok
    assert result.problem == f"chain {chain}: " + says.format(id5=rows[5].id, id6=rows[6].id)
    assert result.checked == checked


def test_verify_names_an_unknown_chain(session, fresh):
    assert audit_chain.verify(session, "999") == audit_chain.VerifyResult(
        False, 0, "chain 999: no such chain (no head, no events)", 1
    )
    assert audit_chain.verify(session) == audit_chain.VerifyResult(True, 0, None, 0)


def test_verify_inside_an_open_transaction_sees_its_own_writes(session, tenants):
    audit_chain.record(session, "x", tenant_id=tenants[0])
    session.commit()
    session.execute(delete(AuditEvent))  # not committed: only this transaction sees it
    assert "the head says seq 1 but the last event is seq 0" in audit_chain.verify(session).problem
    session.rollback()
    assert audit_chain.verify(session).ok


def test_concurrent_writers_leave_a_gap_free_chain(engine, session, read, tenants):
    threads, commits = 8, 25
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def writer(number: int) -> None:
        try:
            start.wait()
            with Session(engine) as own:
                for n in range(commits):
                    audit_chain.record(own, "concurrent", tenant_id=tenants[0], data={"thread": number, "n": n})
                    if n % 5 == 0:  # two chains in one commit: both heads are locked, in one order
                        audit_chain.record(own, "concurrent", tenant_id=None, data={"thread": number, "n": n})
                    own.commit()
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    workers = [threading.Thread(target=writer, args=(number,)) for number in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert not errors, errors

    assert [e.seq for e in events(read, str(tenants[0]))] == list(range(1, threads * commits + 1))
    assert [e.seq for e in events(read, "global")] == list(range(1, threads * 5 + 1))
    assert audit_chain.verify(session) == audit_chain.VerifyResult(True, threads * commits + threads * 5, None, 2)


def test_verify_reads_in_batches_and_finds_a_break_near_the_end(engine, session, tenants):
    chain, total = str(tenants[0]), 20_000
    start, prev_hash, rows = datetime(2026, 1, 1, tzinfo=UTC), audit_chain.GENESIS, []
    for seq in range(1, total + 1):
        row = {
            "chain": chain, "seq": seq, "tenant_id": tenants[0], "action": "bulk",
            "created_at": start + timedelta(seconds=seq, microseconds=seq % 997),
            "actor_id": None, "actor_label": "loader", "conversation_id": seq // 10, "tool_call_id": seq,
            "tool_name": "refund_invoice", "outcome": "ok", "data": {"n": seq, "note": "ünïcode"},
            "prev_hash": prev_hash,
        }  # fmt: skip
        row["hash"] = prev_hash = audit_chain.event_hash(row)
        rows.append(row)
    with engine.begin() as connection:
        connection.execute(insert(AuditEvent.__table__), rows)
        connection.execute(insert(AuditHead.__table__).values(chain=chain, seq=total, hash=prev_hash))
    del rows

    with statements(engine) as seen:
        result = audit_chain.verify(session, batch_size=5_000)
    assert result == audit_chain.VerifyResult(True, total, None, 1)
    walks = [params for sql, params in seen if "FROM audit_events" in sql and "LIMIT" in sql]
    assert len(walks) == total // 5_000 + 1  # four full batches, then an empty one
    assert all(5_000 in (params.values() if isinstance(params, dict) else params) for params in walks)

    tracemalloc.start()
    try:
        assert audit_chain.verify(session, batch_size=1_000).ok
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20  # about 2.5 MiB for 1,000 rows at a time; all 20,000 at once take ~30 MiB

    tamper(engine, "UPDATE audit_events SET outcome = 'failed' WHERE chain = :chain AND seq = :seq",
           chain=chain, seq=total - 3)  # fmt: skip
    broken = audit_chain.verify(session, batch_size=5_000)
    assert not broken.ok and broken.checked == total - 4
    assert f"chain {chain}: event seq {total - 3} (id " in broken.problem and "was altered" in broken.problem


# --- command line and Flask's session -----------------------------------------------------------


def test_the_cli_reports_an_intact_log_and_a_broken_one(app, cli, engine, fresh, tenants):
    from webapp.runtime.extensions import db

    audit_chain.record(db.session, "sign_in.failed", tenant_id=None, data={"email": "nobody@example.test"})
    audit_chain.record(db.session, "a", tenant_id=tenants[0])
    audit_chain.record(db.session, "b", tenant_id=tenants[0])
    db.session.commit()  # Flask-SQLAlchemy's session writes the events too
    db.session.remove()

    intact = cli("audit", "verify")
    assert intact.exit_code == 0, intact.output
    assert intact.output.strip() == "Audit log intact: 3 events in 2 chains."
    assert cli("audit", "verify", "--chain", "global").output.strip() == "Audit log intact: 1 events in 1 chains."

    tamper(engine, "UPDATE audit_events SET action = 'c' WHERE chain = :chain AND seq = 2", chain=str(tenants[0]))
    broken = cli("audit", "verify")
    assert broken.exit_code == 1
    assert f"Audit log broken: chain {tenants[0]}: event seq 2 (id " in broken.output
    assert "was altered: its hash does not match its content" in broken.output
    assert cli("audit", "verify", "--chain", "global").exit_code == 0
    unknown = cli("audit", "verify", "--chain", "nope")
    assert unknown.exit_code == 1 and "chain nope: no such chain" in unknown.output


# --- checkpoints kept outside the database ------------------------------------------------------


def rewrite_from(engine, chain: str, seq: int, action: str) -> None:
    """What someone with write access to the database could do: change an event and recompute its
    hash and every hash after it, and the head, so the chain alone still verifies."""
    with Session(engine) as session:
        rows = session.scalars(
            select(AuditEvent).where(AuditEvent.chain == chain, AuditEvent.seq >= seq).order_by(AuditEvent.seq)
        ).all()
        previous = session.scalar(select(AuditEvent.hash).where(AuditEvent.chain == chain, AuditEvent.seq == seq - 1))
        forged = []
        for row in rows:
            fields = {name: getattr(row, name) for name in audit_chain.HASHED_FIELDS}
            fields.update(prev_hash=previous or audit_chain.GENESIS, action=action if row.seq == seq else row.action)
            previous = audit_chain.event_hash(fields)
            forged.append((row.id, fields["action"], fields["prev_hash"], previous))
    for ident, new_action, prev_hash, new_hash in forged:
        tamper(
            engine,
            "UPDATE audit_events SET action = :action, prev_hash = :prev, hash = :hash WHERE id = :id",
            action=new_action,
            prev=prev_hash,
            hash=new_hash,
            id=ident,
        )
    tamper(engine, "UPDATE audit_heads SET hash = :hash WHERE chain = :chain", hash=previous, chain=chain)


def test_a_signed_checkpoint_proves_nothing_before_it_was_rewritten(app, cli, engine, fresh, tenants, tmp_path):
    from webapp.runtime.extensions import db

    chain = str(tenants[0])
    for action in ("refund_approved", "refund_run", "answer"):
        audit_chain.record(db.session, action, tenant_id=tenants[0])
    audit_chain.record(db.session, "sign_in.failed", tenant_id=None)
    db.session.commit()
    db.session.remove()
    kept = tmp_path / "checkpoint.json"
    anchored = cli("audit", "anchor", "--out", str(kept))
    assert anchored.exit_code == 0, anchored.output
    assert "Checkpoint of 4 events in 2 chains written to" in anchored.output and "signed by sha256:" in anchored.output
    key = app.extensions["desk"].config.audit_anchor_key_file
    assert key.stat().st_mode & 0o777 == 0o600  # the signing key is its owner's alone

    audit_chain.record(db.session, "later", tenant_id=tenants[0])  # the log goes on after the checkpoint
    db.session.commit()
    db.session.remove()
    intact = cli("audit", "verify", "--against", str(kept))
    assert intact.exit_code == 0, intact.output
    assert "Audit log intact: 5 events in 2 chains; unchanged up to the checkpoint of" in intact.output

    rewrite_from(engine, chain, 2, "refund_denied")
    assert cli("audit", "verify").exit_code == 0  # the rewrite fools the chain alone ...
    caught = cli("audit", "verify", "--against", str(kept))  # ... not the checkpoint
    assert caught.exit_code == 1
    assert f"chain {chain}: event seq 3 no longer has the hash the checkpoint of" in caught.output
    assert "events up to it were rewritten and their hashes recomputed" in caught.output


def test_a_changed_or_foreign_checkpoint_is_refused_in_words(app, cli, fresh, tenants, tmp_path):
    from webapp.runtime.extensions import db

    audit_chain.record(db.session, "a", tenant_id=tenants[0])
    db.session.commit()
    db.session.remove()
    kept = tmp_path / "checkpoint.json"
    assert cli("audit", "anchor", "--out", str(kept)).exit_code == 0
    signed = json.loads(kept.read_text())

    changed = tmp_path / "changed.json"
    signed["checkpoint"]["chains"][str(tenants[0])]["seq"] = 0  # "there was nothing then"
    changed.write_text(json.dumps(signed))
    refused = cli("audit", "verify", "--against", str(changed))
    assert refused.exit_code == 1 and "signature does not match its content: the file was changed" in refused.output

    foreign = tmp_path / "foreign.json"  # a well-signed checkpoint, by another desk's key
    foreign.write_text(json.dumps(anchors.make(db.session, Ed25519PrivateKey.generate())))
    db.session.remove()
    refused = cli("audit", "verify", "--against", str(foreign))
    assert refused.exit_code == 1 and "not this desk's key" in refused.output

    (tmp_path / "junk.json").write_text("{not json")
    junk = cli("audit", "verify", "--against", str(tmp_path / "junk.json"))
    assert junk.exit_code == 1 and "This is not a checkpoint made by `audit anchor`" in junk.output
    missing = cli("audit", "verify", "--against", str(tmp_path / "nope.json"))
    assert missing.exit_code == 2 and "No such file or directory" in missing.output
    both = cli("audit", "verify", "--against", str(kept), "--chain", "global")
    assert both.exit_code == 2 and "leave out --chain" in both.output
