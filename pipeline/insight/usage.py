"""Calls, tokens and cost per model over stored LLM calls, for the read API and the overview.

One grouped query over the calls of a window (indexed on started_at, and on model + started_at):
the costs are each call's stored cost_usd, so a window's figures are exact sums of what the
conversations show, and a model without a price says so (cost_usd null, every call unpriced)
instead of counting as free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import Count, Q, QuerySet, Sum

from pipeline.models import LLMCall
from pipeline.rollups.figures import MODEL, Figures
from pipeline.rollups.read import figures_by_name
from pipeline.stats import started_in


@dataclass(frozen=True, slots=True)
class ModelUsage:
    model: str  # "" for calls whose span named no model
    calls: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    reasoning_tokens: int
    cost_usd: Decimal | None  # the priced calls' sum; None when none of them has a price
    unpriced_calls: int

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def llm_calls_in(
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    conversation_id: int | None = None,
    model: str | None = None,
) -> QuerySet[LLMCall]:
    """LLM calls started in [since, until), optionally of one conversation or one model."""
    qs = started_in(LLMCall.objects.all(), since=since, until=until, conversation_id=conversation_id)
    return qs.filter(model=model) if model else qs


def window_model_usage(
    *, since: datetime | None = None, until: datetime | None = None, model: str | None = None
) -> list[ModelUsage]:
    """model_usage of the LLM calls started in [since, until), from the rollups (pipeline.rollups):
    exact, the same figures as the grouped query over the calls."""
    found = figures_by_name(MODEL, since=since, until=until, name=model or None)
    return _ordered([_from_figures(name, f) for name, f in found.items()])


def _from_figures(name: str, f: Figures) -> ModelUsage:
    priced = f.sum("priced")
    return ModelUsage(
        model=name, calls=f.calls, input_tokens=f.sum("input_tokens"), output_tokens=f.sum("output_tokens"),
        cache_read_tokens=f.sum("cache_read_tokens"), cache_write_tokens=f.sum("cache_write_tokens"),
        reasoning_tokens=f.sum("reasoning_tokens"), cost_usd=f.sum("cost_usd") if priced else None,
        unpriced_calls=f.calls - priced,
    )


def _ordered(usage: list[ModelUsage]) -> list[ModelUsage]:
    usage.sort(key=lambda u: (u.cost_usd is None, -(u.cost_usd or 0), -u.calls, u.model))
    return usage


def model_usage(calls: QuerySet[LLMCall] | None = None) -> list[ModelUsage]:
    """One ModelUsage per model in `calls` (all LLM calls by default): the costliest first, then
    the unpriced ones by calls."""
    calls = (LLMCall.objects.all() if calls is None else calls).order_by()
    rows = calls.values("model").annotate(
        calls=Count("id"), input_tokens=Sum("input_tokens"), output_tokens=Sum("output_tokens"),
        cache_read_tokens=Sum("cache_read_tokens"), cache_write_tokens=Sum("cache_write_tokens"),
        reasoning_tokens=Sum("reasoning_tokens"), cost=Sum("cost_usd"),
        unpriced_calls=Count("id", filter=Q(cost_usd__isnull=True)),
    )
    usage = [
        ModelUsage(
            model=row["model"], calls=row["calls"], input_tokens=row["input_tokens"] or 0,
            output_tokens=row["output_tokens"] or 0, cache_read_tokens=row["cache_read_tokens"] or 0,
            cache_write_tokens=row["cache_write_tokens"] or 0, reasoning_tokens=row["reasoning_tokens"] or 0,
            cost_usd=row["cost"], unpriced_calls=row["unpriced_calls"],
        )
        for row in rows
    ]
    return _ordered(usage)
