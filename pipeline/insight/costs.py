"""The server's prices: pipeline.insight.pricing with the overrides of CTXLENS_PRICES_FILE, and the
cost of a stored LLM call (LLMCall.cost_usd), set wherever ingest changes a call's counts."""

from __future__ import annotations

from datetime import datetime
from decimal import Context, Decimal
from typing import Protocol

from pipeline.conf import ctxlens_config
from pipeline.insight.pricing import (
    PriceOverride,
    Tokens,
    call_cost,
    cost_parts,
    input_token_cost,
    load_overrides,
)


def price_overrides() -> tuple[PriceOverride, ...]:
    """The prices file's entries (a bad file is reported by the system check pipeline.E072 at
    startup; here it prices nothing rather than failing ingest)."""
    try:
        return load_overrides(ctxlens_config().prices_file)
    except ValueError:
        return ()


def cost_of_call(model: str, provider: str, tokens: Tokens, at: datetime | None) -> Decimal | None:
    return call_cost(model, provider, tokens, at, price_overrides())


def cost_of_input(model: str, provider: str, tokens: int, at: datetime | None) -> Decimal | None:
    return input_token_cost(model, provider, tokens, at, price_overrides())


# Token counts as the columns hold them (IntegerField, PostgreSQL's range): a span claiming 2**40
# tokens is stored with 2**31 - 1, and the cost must be that of the stored counts.
COUNT_MAX = 2**31 - 1
COST_PLACES = Decimal("1e-12")  # LLMCall.cost_usd's decimal places
# What the column holds (30 digits, 12 of them decimals): only a prices file with absurd rates
# gets there, and such a price is treated as none rather than failing the ingest transaction.
COST_LIMIT = Decimal(10) ** 17
WIDE = Context(prec=60)


class PricedCall(Protocol):
    """What pricing needs of an LLM call (an LLMCall row, loaded with these fields)."""

    model: str
    request_model: str
    provider: str
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    reasoning_tokens: int
    started_at: datetime | None


PRICED_FROM = frozenset(PricedCall.__annotations__)  # what a call's cost is computed from


def call_tokens(call: PricedCall) -> Tokens:
    def count(value: int) -> int:
        return max(0, min(int(value or 0), COUNT_MAX))

    return Tokens(input=count(call.input_tokens), output=count(call.output_tokens),
                  cache_read=count(call.cache_read_tokens), cache_write=count(call.cache_write_tokens),
                  reasoning=count(call.reasoning_tokens))


def llm_call_cost(call: PricedCall) -> Decimal | None:
    """The USD cost of a stored LLM call, rounded to the column's places; None for "no price".
    The model is the one the provider answered with, else the one requested (a deployment name
    in the response may be unknown where the requested model is not)."""
    tokens = call_tokens(call)
    if not (tokens.input or tokens.output or tokens.cache_read or tokens.cache_write or tokens.reasoning):
        return None  # no counts (none reported, none counted yet): its cost is unknown, not $0
    model, cost = _priced_model(call)
    if cost is None or cost >= COST_LIMIT:
        return None
    return cost.quantize(COST_PLACES, context=WIDE)


def _priced_model(call: PricedCall) -> tuple[str, Decimal | None]:
    """The first of the call's model names that has a price, and the cost at it."""
    tokens = call_tokens(call)
    for model in dict.fromkeys(name for name in (call.model, call.request_model) if name):
        cost = cost_of_call(model, call.provider, tokens, call.started_at)
        if cost is not None:
            return model, cost
    return "", None


def price_llm_call(call: PricedCall) -> bool:
    """Set `call.cost_usd` from its current counts; whether it changed."""
    before = getattr(call, "cost_usd", None)
    call.cost_usd = llm_call_cost(call)
    return call.cost_usd != before


def llm_call_cost_parts(call: PricedCall) -> dict[str, Decimal] | None:
    """The call's cost split into uncached input, cache reads, cache writes, output (and a fee per
    request), for the LLM call page; None when its price is unknown or not linear (tiered)."""
    model, cost = _priced_model(call)
    if cost is None:
        return None
    return cost_parts(model, call.provider, call_tokens(call), call.started_at, price_overrides())
