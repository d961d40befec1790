"""One tool in three releases of a pack, as a team shipping new defaults would: release 1 waits for one
person on every payout, release 2 lets payouts up to $500 run at once (looser), release 3 asks two
people for every payout (stricter). Loaded with `EXTRA_TOOLS=tests.packs.payouts:Release1` (or 2, 3)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from webapp.tools import Tool, ToolContext


class _Payout(Tool):
    name = "payout"
    title = "Pay a supplier"
    description = "Pay a supplier an amount in cents."
    sensitive = True

    class Input(BaseModel):
        model_config = ConfigDict(extra="forbid")
        amount_cents: int = Field(ge=1, le=10_000_000, description="How much, in cents.")

    def amount(self, input: Input) -> int:  # noqa: A002
        return input.amount_cents

    def money_argument(self) -> str:
        return "amount_cents"

    def execute(self, input: Input, context: ToolContext) -> dict:  # noqa: A002
        return {"paid_cents": input.amount_cents}


class Release1(_Payout):
    default_policy = ("always", None, 1)


class Release2(_Payout):
    default_policy = ("above_amount", 50_000, 1)


class Release3(_Payout):
    default_policy = ("always", None, 2)
