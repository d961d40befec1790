"""An order desk's tools, written as a team adopting the desk would write them (docs/tools.md), with
names of their own: money is `value_usd` (dollars, as text), what a call acts on is an order. Loaded
with `EXTRA_TOOLS=tests.packs.orders:FindOrder,tests.packs.orders:GiveBack,tests.packs.orders:CancelOrder`.

It keeps its orders in this module and what it gave back in a JSON file beside the desk's instance
(ORDERS_FILE), so a worker process and the test see the same."""

from __future__ import annotations

import json
import os
from decimal import Decimal, InvalidOperation
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from webapp.tools import Concern, Fact, Record, Review, Tool, ToolContext, ToolError

ORDERS = {9001: ("Ada Lovelace", 12_000), 9002: ("Charles Babbage", 4_500)}  # order: (buyer, total in cents)


def _ledger() -> Path:
    return Path(os.environ.get("ORDERS_FILE") or Path(os.environ.get("INSTANCE_PATH", ".")) / "orders-given-back.json")


def _given_back(tenant_id: int) -> list[dict]:
    path = _ledger()
    entries = json.loads(path.read_text()) if path.exists() else []
    return [entry for entry in entries if entry["tenant"] == tenant_id]


def _dollars(cents: int) -> str:
    return f"${cents / 100:,.2f}"


def cents_of(value_usd: str) -> int | None:
    try:
        value = Decimal(value_usd)
    except InvalidOperation:
        return None
    return int(value * 100) if value == value.quantize(Decimal("0.01")) else None


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FindOrder(Tool):
    name = "find_order"
    title = "Find an order"
    description = "Look up an order by its number: the buyer, the total, and what was given back so far."

    class Input(_Input):
        order: int = Field(ge=1, description="The order number.")

    def execute(self, input: Input, context: ToolContext) -> dict:  # noqa: A002
        if input.order not in ORDERS:
            raise ToolError(f"There is no order {input.order}.")
        buyer, total = ORDERS[input.order]
        back = sum(e["cents"] for e in _given_back(context.tenant_id) if e["order"] == input.order)
        return {
            "order": input.order,
            "buyer": buyer,
            "total_usd": f"{total / 100:.2f}",
            "given_back_usd": f"{back / 100:.2f}",
        }


class GiveBack(Tool):
    name = "give_back"
    title = "Give money back on an order"
    description = 'Give part of an order\'s price back to its buyer. value_usd is dollars as text, e.g. "12.50".'
    sensitive = True
    default_policy = ("above_amount", 2_500, 1)  # more than $25 waits for a person
    default_limits = {"subject_day_cents": 5_000, "tenant_day_count": 10}  # $50 per order a day
    ceiling_cents = 20_000  # above $200 always a person

    class Input(_Input):
        order: int = Field(ge=1, description="The order number.")
        value_usd: str = Field(pattern=r"^\d{1,6}(\.\d{2})?$", description='Dollars, e.g. "12.50".')
        note: str = Field(min_length=1, max_length=200, description="Why, for the buyer.")

    def amount(self, input: Input) -> int | None:  # noqa: A002
        return cents_of(input.value_usd)

    def subject(self, input: Input, context: ToolContext) -> str:  # noqa: A002
        return f"order:{input.order}"

    def describe(self, input: Input) -> str:  # noqa: A002
        return f"Give {_dollars(cents_of(input.value_usd) or 0)} back on order {input.order}."

    def review(self, input: Input, context: ToolContext) -> Review:  # noqa: A002
        if input.order not in ORDERS:
            return Review(concerns=(Concern(f"There is no order {input.order}.", "order"),))
        buyer, total = ORDERS[input.order]
        back = sum(e["cents"] for e in _given_back(context.tenant_id) if e["order"] == input.order)
        facts = (
            Fact("Buyer", buyer),
            Fact("Total", _dollars(total)),
            Fact("Left to give back", _dollars(total - back)),
        )
        concerns = ()
        if (cents_of(input.value_usd) or 0) > total - back:
            concerns = (
                Concern(f"Only {_dollars(total - back)} is left to give back on order {input.order}.", "value_usd"),
            )
        return Review(records=(Record("order", input.order, f"Order {input.order}", facts),), concerns=concerns)

    def execute(self, input: Input, context: ToolContext) -> dict:  # noqa: A002
        review = self.review(input, context)
        if review.concerns:
            raise ToolError(review.concerns[0].message)
        entries = json.loads(_ledger().read_text()) if _ledger().exists() else []
        if not any(e["key"] == context.idempotency_key for e in entries):  # a retried call gives back once
            entries.append(
                {"tenant": context.tenant_id, "order": input.order, "cents": cents_of(input.value_usd),
                 "key": context.idempotency_key}
            )  # fmt: skip
            _ledger().write_text(json.dumps(entries))
        return {"order": input.order, "given_back_usd": input.value_usd}

    def result_sentence(self, data, input: dict) -> str | None:  # noqa: A002
        return f"Gave ${data['given_back_usd']} back on order {data['order']}." if isinstance(data, dict) else None


class CancelOrder(Tool):
    name = "cancel_order"
    title = "Cancel an order"
    description = "Cancel an order that has not shipped."
    sensitive = True
    default_policy = ("always", None, 2)  # two people

    class Input(_Input):
        order: int = Field(ge=1, description="The order number.")

    def subject(self, input: Input, context: ToolContext) -> str:  # noqa: A002
        return f"order:{input.order}"

    def describe(self, input: Input) -> str:  # noqa: A002
        return f"Cancel order {input.order}."

    def execute(self, input: Input, context: ToolContext) -> dict:  # noqa: A002
        return {"order": input.order, "cancelled": True}
