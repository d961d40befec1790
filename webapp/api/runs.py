"""/api/runs: bulk runs, each item a conversation of its own (webapp/runs/); with the bodies those
routes take and answer."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

from flask import g
from pydantic import BaseModel, Field

from webapp.api.base import answer, bp, documented
from webapp.api.bodies import NO_NUL, RequestBody, Rule, Timestamp
from webapp.api.conversations import MessageText
from webapp.api.reading import body
from webapp.models import ROLES
from webapp.runs import actions as runs
from webapp.runtime.extensions import db
from webapp.web.security import api_roles, takes_up_to

MAX_RUN_ITEMS = 10_000  # webapp.runs.actions.MAX_ITEMS


class RunItemIn(RequestBody):
    """One item of a run: the first question of a conversation of its own."""

    message: MessageText


class StartRun(RequestBody):
    """A bulk run: each item becomes a conversation owned by the caller. With `batch`, the model moves
    of its conversations go through the Message Batches API: answers come within the poll interval
    to hours later, at half the price."""

    items: Annotated[
        list[RunItemIn],
        Field(min_length=1, max_length=MAX_RUN_ITEMS, description=f"From 1 to {MAX_RUN_ITEMS:,} items."),
        Rule(f'must be a list of 1 to {MAX_RUN_ITEMS:,} items, each {{"message": ...}}'),
    ]
    batch: Annotated[bool, Field(description="Send the model moves by Message Batch (half price, slower).")] = False
    title: Annotated[
        str | None,
        Field(max_length=200, pattern=NO_NUL, description="A name for the run; left out: its number of items."),
        Rule("must be text of at most 200 characters"),
    ] = None


class RunCreated(BaseModel):
    """The run's id (201); its conversations start in the background."""

    id: int


class RunCounts(BaseModel):
    """The run's items by where their conversations are (an item not started yet counts as queued)."""

    queued: int
    running: int = Field(description="A move in flight, a task working, or an answer awaited from a batch.")
    awaiting_approval: int
    completed: int
    failed: int = Field(description="Failed, or out of budget.")
    cancelled: int


class RunCost(BaseModel):
    """What the run's model calls cost so far, in USD as decimal strings."""

    usd: str
    interactive_usd: str = Field(description="What the same calls would have cost made one by one, at list price.")
    model_calls: int
    batched_calls: int = Field(description="Model calls answered by a Message Batch.")


class RunView(BaseModel):
    """A bulk run and where its items stand."""

    id: int
    title: str
    status: Literal["starting", "running", "completed", "cancelled"]
    batch: bool
    items: int
    counts: RunCounts
    conversations: list[int] = Field(description="Its conversations' ids, in the order of its items.")
    cost: RunCost
    created_at: Timestamp

    @classmethod
    def of(cls, run: Any, figures: Any) -> RunView:
        return cls(
            id=run.id,
            title=run.title,
            status=figures.status,
            batch=run.batch,
            items=run.items,
            counts=RunCounts(**figures.counts),
            conversations=figures.conversation_ids,
            cost=RunCost(
                usd=str(figures.cost.quantize(Decimal("0.000001"))),
                interactive_usd=str(figures.cost_interactive.quantize(Decimal("0.000001"))),
                model_calls=figures.model_calls,
                batched_calls=figures.batched_calls,
            ),
            created_at=run.created_at,
        )


@bp.post("/runs")
@takes_up_to(runs.MAX_FILE_BYTES)
@documented(
    "Start a bulk run",
    body=StartRun,
    responses={201: RunCreated},
    errors={422: "invalid_field: an item is empty or too long, or there are more than 10,000 (each named)."},
)
@api_roles("agent")
def create_run():
    """Each item becomes a conversation of the caller's, started in the background."""
    sent = body(StartRun)
    run = runs.create(
        db.session, g.user, [item.message for item in sent.items], batch=sent.batch, title=sent.title or ""
    )
    return answer(RunCreated(id=run.id), 201)


@bp.get("/runs/<int:run_id>")
@documented("Read a bulk run", responses={200: RunView}, errors={403: "forbidden: the run is another agent's."})
@api_roles(*ROLES)
def get_run(run_id: int):
    run = runs.find(db.session, g.user, run_id)
    return answer(run_view(run))


@bp.post("/runs/<int:run_id>/cancel")
@documented(
    "Stop a bulk run",
    responses={202: RunView},
    errors={
        403: "forbidden: only the run's agent, reviewers and admins stop it.",
        409: "already_cancelled: the run was stopped already.",
    },
)
@api_roles("agent", "reviewer", "admin")
def cancel_run(run_id: int):
    """No more of its items start, and each of its conversations still moving or waiting stops."""
    run = runs.find(db.session, g.user, run_id)
    runs.cancel(db.session, g.user, run)
    return answer(run_view(run), 202)


def run_view(run: Any) -> RunView:
    """The run with its figures as they are now."""
    return RunView.of(run, runs.figures(db.session, run))
