"""One move under a lease: claims, two commits, stale jobs, lost leases, errors and wake-ups."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from demo.billing.models import Refund
from tests.model_server import Fault, Reply
from tests.replies import reply, tool_use
from webapp.agent import moves, sweeper
from webapp.agent.decisions import arguments_hash, decide
from webapp.agent.loop import Loop
from webapp.agent.moves import TransientMoveError, advance
from webapp.models import Conversation, ToolCall, User, utcnow

REFUND = {"invoice_id": 4471, "amount_cents": 7000, "reason": "late delivery"}  # above the $50 limit


@pytest.fixture
def mover(session):
    """mover(loop) -> advance(...) for that loop's conversation, at its current version by default."""

    def run(loop: Loop, owner: str = "worker-1", final_attempt: bool = True, version: int | None = None):
        def make_loop(session_, conversation, should_stop, tail):
            return Loop(
                session_,
                conversation,
                model=loop.model,
                tools=loop.tools,
                settings=loop.settings,
                should_stop=should_stop,
                tail=tail,
            )

        session.refresh(loop.conversation)
        return advance(
            session,
            loop.conversation.id,
            loop.conversation.version if version is None else version,
            owner=owner,
            make_loop=make_loop,
            lease_seconds=30,
            final_attempt=final_attempt,
        )

    return run


def started(session, new_loop, text="Show invoices for customer 4471", **kw) -> Loop:
    loop = new_loop(**kw)
    loop.ask_later(text)
    moves.start_run(session, loop.conversation)
    session.commit()
    return loop


def test_each_move_advances_the_version_and_returns_the_next_one_to_enqueue(session, new_loop, mover, model):
    loop = started(session, new_loop)
    results = []
    while True:
        result = mover(loop)
        results.append(result.outcome)
        if result.next_version is None:
            break
        session.refresh(loop.conversation)
        assert result.next_version == loop.conversation.version
    assert results == ["generate", "run_tool", "generate"]
    session.refresh(loop.conversation)
    assert loop.conversation.status == "completed"
    assert loop.conversation.lease_owner is None


def test_a_stale_or_duplicate_job_finds_nothing_to_do(session, new_loop, mover, model):
    loop = started(session, new_loop)
    version = loop.conversation.version
    assert mover(loop, version=version).outcome == "generate"
    assert mover(loop, version=version).outcome == "skipped"  # the same job delivered twice
    assert mover(loop, version=version + 5).outcome == "skipped"
    assert len(model.requests) == 1


def test_a_held_lease_keeps_a_second_mover_out(session, new_loop, mover, model):
    loop = started(session, new_loop)
    loop.conversation.lease_owner = "someone-else"
    loop.conversation.lease_expires_at = utcnow() + timedelta(seconds=30)
    session.commit()
    assert mover(loop).outcome == "skipped"
    assert model.requests == []


def test_after_a_crash_the_claimed_call_reruns_with_its_key_and_does_not_refund_twice(session, new_loop, mover, model):
    model.enqueue(Reply.message(reply(tool_use("issue_refund", REFUND))))
    loop = started(session, new_loop, "refund")
    mover(loop)  # generate: the refund waits for a decision
    (call,) = session.scalars(select(ToolCall).where(ToolCall.conversation_id == loop.conversation.id))
    reviewer = session.scalar(select(User).where(User.email == "reviewer@acme.test"))
    decide(session, call, reviewer, approve=True, arguments_seen=arguments_hash(call.input))
    session.commit()
    # A worker claimed the call and did the refund, then died before recording the result.
    call.status, call.attempts = "running", 1
    session.add(
        Refund(
            tenant_id=call.tenant_id,
            invoice_id=4471,
            amount_cents=7000,
            reason="late delivery",
            idempotency_key=f"toolcall-{call.id}",
            created_by_id=call.acting_user_id,
        )
    )
    conversation = loop.conversation
    conversation.status, conversation.lease_owner = "running", "dead-worker"
    conversation.lease_expires_at = utcnow() - timedelta(seconds=1)
    session.commit()

    assert mover(loop).outcome == "run_tool"
    session.refresh(call)
    assert call.status == "succeeded" and call.attempts == 2
    assert '"already_existed": true' in call.result
    assert session.scalar(select(func.count(Refund.id))) == 1


def test_a_transient_model_error_releases_the_lease_for_a_retry(session, new_loop, mover, model):
    loop = started(session, new_loop)
    version = loop.conversation.version
    model.enqueue(Fault.status(529, error_type="overloaded_error"))
    with pytest.raises(TransientMoveError):
        mover(loop, final_attempt=False)
    session.refresh(loop.conversation)
    assert (loop.conversation.status, loop.conversation.lease_owner) == ("queued", None)
    assert loop.conversation.version == version  # the retried job still matches
    assert mover(loop, version=version).outcome == "generate"


def test_a_transient_error_on_the_last_attempt_fails_the_conversation_in_words(session, new_loop, mover, model):
    loop = started(session, new_loop)
    model.enqueue(Fault.status(529, error_type="overloaded_error"))
    assert mover(loop, final_attempt=True).outcome == "failed"
    session.refresh(loop.conversation)
    assert loop.conversation.status == "failed"
    assert loop.conversation.error_message == (
        "The model service is overloaded. It still failed after retrying; press Retry once the service is back."
    )


def test_a_permanent_model_error_fails_at_once_and_retry_requeues(session, new_loop, mover, model):
    loop = started(session, new_loop)
    model.enqueue(Fault.status(401, error_type="authentication_error"))
    assert mover(loop, final_attempt=False).outcome == "failed"
    session.refresh(loop.conversation)
    assert loop.conversation.error_code == "key_invalid"
    assert "ANTHROPIC_API_KEY" in loop.conversation.error_message
    assert moves.retry(session, loop.conversation) is not None
    session.commit()
    assert loop.conversation.error_message is None
    assert mover(loop).outcome == "generate"


def test_a_decision_landing_while_a_move_parks_wakes_the_conversation_instead(session, new_loop, mover, model, engine):
    model.enqueue(Reply.message(reply(tool_use("issue_refund", REFUND))))
    loop = started(session, new_loop, "refund")
    mover(loop)  # generate; the next move will find the refund awaiting a decision
    original_perform = Loop.perform

    def perform_with_a_decision_meanwhile(self, move):
        with Session(engine) as other:  # another process decides between our look and our commit
            call = other.scalar(select(ToolCall).where(ToolCall.conversation_id == self.conversation.id))
            reviewer = other.scalar(select(User).where(User.email == "reviewer@acme.test"))
            decide(other, call, reviewer, approve=True, arguments_seen=arguments_hash(call.input))
            other.commit()
        original_perform(self, move)

    Loop.perform = perform_with_a_decision_meanwhile
    try:
        result = mover(loop)
    finally:
        Loop.perform = original_perform
    assert result.outcome == "requeued" and result.next_version is not None
    session.refresh(loop.conversation)
    assert loop.conversation.status == "queued"
    assert mover(loop).outcome == "run_tool"
    assert session.scalar(select(func.count(Refund.id))) == 1


def test_a_decision_committing_while_a_move_commits_its_park_still_wakes_it(
    session, new_loop, mover, model, engine, monkeypatch
):
    """The move has checked that no call was decided and is committing its park; a decision made in
    another process at that moment must wake the conversation (it waits for the park, then wakes it)."""
    model.enqueue(Reply.message(reply(tool_use("issue_refund", REFUND))))
    loop = started(session, new_loop, "refund")
    mover(loop)  # generate; the next move parks on the refund
    woke: dict = {}

    def decide_elsewhere():
        with Session(engine) as other:
            call = other.scalar(select(ToolCall).where(ToolCall.conversation_id == loop.conversation.id))
            reviewer = other.scalar(select(User).where(User.email == "reviewer@acme.test"))
            woke["version"] = decide(other, call, reviewer, approve=True, arguments_seen=arguments_hash(call.input))
            other.commit()

    real_commit, commits = session.commit, []

    def commit_while_a_decision_races():
        commits.append(1)
        if len(commits) != 2:  # the move's second commit: its park, checked and about to land
            return real_commit()
        racer = threading.Thread(target=decide_elsewhere)
        racer.start()
        racer.join(0.5)  # it waits for our commit (a row lock, or SQLite's write lock)
        real_commit()
        racer.join(30)

    monkeypatch.setattr(session, "commit", commit_while_a_decision_races)
    assert mover(loop).outcome == "wait"
    monkeypatch.setattr(session, "commit", real_commit)
    assert woke["version"] is not None, "the decision did not wake the parked conversation"
    session.refresh(loop.conversation)
    assert loop.conversation.status == "queued" and loop.conversation.version == woke["version"]
    assert mover(loop).outcome == "run_tool"
    assert session.scalar(select(func.count(Refund.id))) == 1


def test_the_sweeper_wakes_a_parked_conversation_whose_approved_call_nobody_enqueued(session, new_loop, mover, model):
    model.enqueue(Reply.message(reply(tool_use("issue_refund", REFUND))))
    loop = started(session, new_loop, "refund")
    mover(loop)
    assert mover(loop).outcome == "wait"
    call = session.scalar(select(ToolCall).where(ToolCall.conversation_id == loop.conversation.id))
    call.status, call.decided_at = "approved", utcnow() - timedelta(seconds=60)  # a wake-up that never came
    session.commit()
    assert [c.id for c in sweeper.stranded(session, grace_seconds=30)] == [loop.conversation.id]
    call.decided_at = utcnow()
    session.commit()
    assert sweeper.stranded(session, grace_seconds=30) == []  # within the grace, a wake-up may be on its way


def test_cancel_wakes_a_parked_conversation_and_its_next_move_settles_it(session, new_loop, mover, model):
    model.enqueue(Reply.message(reply(tool_use("issue_refund", REFUND))))
    loop = started(session, new_loop, "refund")
    mover(loop)
    assert mover(loop).outcome == "wait"
    session.refresh(loop.conversation)
    assert loop.conversation.status == "awaiting_approval"
    version = moves.request_cancel(session, loop.conversation, by_user_id=None)
    session.commit()
    assert version == loop.conversation.version
    assert mover(loop).outcome == "cancel"
    session.refresh(loop.conversation)
    assert loop.conversation.status == "cancelled"
    with pytest.raises(ValueError):
        moves.request_cancel(session, loop.conversation, by_user_id=None)


def test_a_move_writes_only_what_is_new(session, new_loop, mover, model, engine):
    loop = started(session, new_loop)
    mover(loop)
    statements: list[str] = []
    from sqlalchemy import event

    def record(conn, cursor, statement, *args):
        if statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
            statements.append(statement.split("(")[0].split(" SET")[0].strip())

    event.listen(engine, "before_cursor_execute", record)
    try:
        mover(loop)  # one tool run
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert not any(s.startswith("DELETE") for s in statements)
    assert "UPDATE messages" not in statements  # history is never rewritten
    # the round's results and the audit event of the tool run (with its chain's head moved on)
    inserts = sorted(s for s in statements if s.startswith("INSERT") and s != "INSERT INTO audit_heads")
    assert inserts == ["INSERT INTO audit_events", "INSERT INTO messages"]
    assert set(statements) - {"INSERT INTO audit_heads"} == {
        "UPDATE conversations",
        "UPDATE tool_calls",
        "INSERT INTO messages",
        "INSERT INTO audit_events",
        "UPDATE audit_heads",
    }


def test_a_move_reads_nothing_its_claim_already_told_it(session, new_loop, mover, model, engine):
    """The claim's RETURNING brings the last row's id, seq and role and the newest summary's id: no move
    reads the last row or the summaries again (a tool move reads its round by the last row's id)."""
    from sqlalchemy import event

    loop = started(session, new_loop)
    selects: list[str] = []

    def record(conn, cursor, statement, *args):
        if statement.lstrip().upper().startswith("SELECT"):
            selects.append(" ".join(statement.split()))

    event.listen(engine, "before_cursor_execute", record)
    try:
        outcomes = [mover(loop).outcome for _ in range(3)]
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert outcomes == ["generate", "run_tool", "generate"]
    assert not [s for s in selects if "FROM summaries" in s]
    assert not [s for s in selects if "FROM messages" in s and "DESC" in s]  # the newest row, read again
    transcripts = [s for s in selects if "FROM messages" in s]
    assert len(transcripts) == 2  # one read of the transcript per model move, none for the tool move


def test_conversation_rows_never_leak_into_another_conversation(session, new_loop, mover, model):
    first, second = started(session, new_loop), started(session, new_loop)
    for loop in (first, second):
        while mover(loop).next_version is not None:
            pass
    for loop in (first, second):
        assert {
            c.conversation_id
            for c in session.scalars(select(ToolCall).where(ToolCall.conversation_id == loop.conversation.id))
        } == {loop.conversation.id}
    assert session.scalar(select(func.count(Conversation.id))) == 2


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        (Fault.status(429, headers={"retry-after": "0"}), "rate_limited"),
        (Fault.status(529, error_type="overloaded_error"), "overloaded"),
        (Fault.status(500, error_type="api_error"), "service_error"),
        (Fault.stream_error(after=3), "overloaded"),
        (Fault.cut_after(4), "bad_response"),
        (Fault.malformed(), "bad_response"),
        (Fault.hang(8), "timeout"),
    ],
)
def test_every_kind_of_flaky_model_answer_is_transient_and_loses_nothing(session, new_loop, mover, model, fault, code):
    loop = started(session, new_loop)
    model.enqueue(fault)
    with pytest.raises(TransientMoveError) as raised:
        mover(loop, final_attempt=False)
    assert raised.value.error.code == code
    session.refresh(loop.conversation)
    assert loop.conversation.status == "queued"
    assert session.scalar(select(func.count(ToolCall.id))) == 0
    assert len(loop.rows()) == 1  # nothing half-written
    assert mover(loop).outcome == "generate"


def test_one_check_renews_every_streaming_lease_and_reads_every_stop_in_one_transaction(session, new_loop):
    from sqlalchemy import event, update

    conversations = []
    for n in range(40):
        loop = started(session, new_loop)
        loop.conversation.lease_owner = f"worker-{n}:move-{n}"
        loop.conversation.lease_expires_at = utcnow() + timedelta(seconds=3)
        conversations.append(loop.conversation)
    session.commit()
    asked = conversations[7]
    watch = moves.StreamWatch(session.get_bind(), interval=3600)  # checked by hand here
    lease = timedelta(seconds=30)
    watched = [watch.watch(c.id, c.lease_owner, lease) for c in conversations]
    assert not any(w.should_stop() for w in watched)  # the first ask puts each stream on the watch
    session.execute(update(Conversation).where(Conversation.id == asked.id).values(cancel_requested_at=utcnow()))
    session.commit()
    for w in watched:
        w.renewed_at -= lease  # due for renewal
    statements: list[str] = []
    engine = session.get_bind()

    def record(_connection, _cursor, statement, *_args) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    watch.check()
    assert len([s for s in statements if s.lstrip().upper().startswith(("UPDATE", "SELECT"))]) == 2
    assert [w.conversation_id for w in watched if w.should_stop()] == [asked.id]
    session.expire_all()
    for c in conversations:
        assert c.lease_expires_at > utcnow() + timedelta(seconds=20)  # renewed for a whole lease
    for w in watched:
        w.close()
    statements.clear()
    watch.check()
    event.remove(engine, "before_cursor_execute", record)
    assert statements == []  # nothing streams: nothing to ask the database
