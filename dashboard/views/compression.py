"""Compressions: the list, and one compression's before and after side by side."""

from __future__ import annotations

from dataclasses import dataclass

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from dashboard.context_bars import LABELS, category_tokens
from dashboard.queries import HEAVY_COMPRESSION_FIELDS
from dashboard.views.common import page
from dashboard.views.llm_call import MessageView, message_views
from pipeline.models import CompressionEvent
from pipeline.models.events import CompressionStrategy
from pipeline.semconv import CONTEXT_CATEGORIES

PAGE_SIZE = 50


@dataclass(frozen=True)
class MarkedMessage:
    message: MessageView
    fate: str  # "kept", "dropped", "summarised" (before) or "kept", "summary" (after)


@dataclass(frozen=True)
class CategoryRow:
    category: str
    label: str
    before: int
    after: int

    @property
    def saved(self) -> int:
        return self.before - self.after


@dataclass(frozen=True)
class StrategyCost:
    strategy: str
    label: str
    cost: float
    chosen: bool


def strategy_costs(event: CompressionEvent) -> list[StrategyCost]:
    """The estimated cost of each strategy recorded on the event, in the usual order, the one used marked."""
    costs = event.estimated_costs if isinstance(event.estimated_costs, dict) else {}
    return [
        StrategyCost(value, label, float(costs[value]), value == event.strategy)
        for value, label in CompressionStrategy.choices
        if isinstance(costs.get(value), int | float)
    ]


def _indexes(value: object) -> set[int]:
    return {i for i in value if isinstance(i, int)} if isinstance(value, list) else set()


def before_messages(event: CompressionEvent) -> list[MarkedMessage]:
    dropped, summarised = _indexes(event.dropped), _indexes(event.summarised)
    return [
        MarkedMessage(m, "dropped" if m.index in dropped else "summarised" if m.index in summarised else "kept")
        for m in message_views(event.before_messages)
    ]


def after_messages(event: CompressionEvent) -> list[MarkedMessage]:
    summary = event.summary.strip()
    return [
        MarkedMessage(m, "summary" if summary and summary in m.text else "kept")
        for m in message_views(event.after_messages)
    ]


def _counts(value: object) -> dict[str, int]:
    if not isinstance(value, dict):
        return {}
    return {str(k): category_tokens(v) for k, v in value.items() if isinstance(v, int) and k != "free"}


def category_rows(event: CompressionEvent) -> list[CategoryRow]:
    """Tokens before and after by category, in the usual category order, then any others."""
    before, after = _counts(event.tokens_before_by_category), _counts(event.tokens_after_by_category)
    keys = [c for c in CONTEXT_CATEGORIES if c in before or c in after]
    keys += sorted(k for k in {*before, *after} if k not in keys)
    return [CategoryRow(k, LABELS.get(k, k), before.get(k, 0), after.get(k, 0)) for k in keys]


@page
def compression_list(request: HttpRequest) -> HttpResponse:
    events = (CompressionEvent.objects.select_related("conversation").defer(*HEAVY_COMPRESSION_FIELDS)
              .order_by("-occurred_at", "-pk"))
    page_obj = Paginator(events, PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "dashboard/compressions.html", {"nav": "compressions", "page_obj": page_obj})


@page
def compression_detail(request: HttpRequest, pk: int) -> HttpResponse:
    event = get_object_or_404(CompressionEvent.objects.select_related("conversation"), pk=pk)
    context = {
        "nav": "compressions",
        "event": event,
        "before": before_messages(event),
        "after": after_messages(event),
        "categories": category_rows(event),
        "costs": strategy_costs(event),
        "saved_percent": 100 * event.tokens_saved / event.tokens_before if event.tokens_before else None,
    }
    return render(request, "dashboard/compression.html", context)
