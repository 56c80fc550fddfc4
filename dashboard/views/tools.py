"""Tools: per-tool statistics, what their results cost the context, a latency histogram, errors by
type, and one tool's calls."""

from __future__ import annotations

import math
from dataclasses import dataclass

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from dashboard import queries
from dashboard.templatetags.ctxlens import tokens
from dashboard.views.common import fragments, fragments_response, page, window_context, window_param
from pipeline.rollups.figures import TOOL
from pipeline.rollups.read import figures_by_name
from pipeline.stats import ToolStats, stats_of, tool_calls_in, window_tool_stats

PAGE_SIZE = 50
PARTIALS = {
    "tools-stats": "dashboard/partials/tool_stats.html",
    "tools-context": "dashboard/partials/tool_context.html",
    "tools-errors": "dashboard/partials/tool_errors.html",
}


def usd(value: float | None) -> str:
    """$0.46, or two significant digits below a cent ($0.0042, $0.000059); "no price" for None (never $0)."""
    if value is None:
        return "no price"
    sign, value = ("-" if value < 0 else ""), abs(value)
    if 0 < value < 0.01:
        value = float(f"{value:.2g}")
    places = 2 if value >= 0.01 or value == 0 else 1 - math.floor(math.log10(value))
    return f"{sign}${value:,.{places}f}"


def times(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class LevelWhatIf:
    level: str
    tokens_at_level: int  # the tool's full results at this level, summed
    saved_tokens: int  # context tokens; negative: the level would have cost more
    saved: str  # the saved tokens in dollars, formatted


@dataclass(frozen=True)
class ContextCost:
    """One tool's line in the ranking by context cost, with its output-level what-if."""

    tool_name: str
    resends: str  # LLM calls that carried a result, on average ("14")
    context_tokens: int
    cost: str
    levels: list[LevelWhatIf]
    what_if: str  # the best switch, in a sentence ("" without stored full results)
    level_calls: int


def _what_if(stats: ToolStats, levels: list[LevelWhatIf]) -> str:
    best = max(levels, key=lambda level: level.saved_tokens, default=None)
    if best is None:
        return ""
    if best.saved_tokens <= 0:
        return f"No other output level would have saved input tokens on {stats.tool_name}."
    return (f"Switching {stats.tool_name} to {best.level} would have saved {tokens(best.saved_tokens)} input tokens "
            f"({best.saved}).")


def context_ranking(stats: list[ToolStats]) -> list[ContextCost]:
    """Tools whose results were carried by later calls, the costliest first (unpriced ones after the
    priced ones, by tokens)."""
    ranked = sorted((s for s in stats if s.context_tokens), key=lambda s: (
        s.context_cost_usd is None, -(s.context_cost_usd or 0), -s.context_tokens, s.tool_name))
    rows = []
    for s in ranked:
        levels = [LevelWhatIf(level, s.tokens_at_level[level], saving["tokens"], usd(saving["cost_usd"]))
                  for level, saving in (s.level_savings or {}).items()]
        rows.append(ContextCost(s.tool_name, times(s.avg_context_carries), s.context_tokens, usd(s.context_cost_usd),
                                levels, _what_if(s, levels), s.level_calls))
    return rows


def _context(request: HttpRequest) -> dict:
    key, since = window_param(request)
    tool = request.GET.get("tool", "")[:255]
    figures = figures_by_name(TOOL, since=since)  # from the rollups: pipeline.rollups
    stats = stats_of(figures)
    shown = {tool: figures[tool]} if tool and tool in figures else {} if tool else figures
    return {
        **window_context(key),
        "tool": tool,
        "tool_stats": stats,
        "context_ranking": context_ranking(stats),
        "tool_stats_id": "tools-stats",
        "errors_by_type": queries.errors_by_type_of(shown),
        "histogram": queries.latency_histogram_of(shown),
    }


@page
def tools(request: HttpRequest) -> HttpResponse:
    context = _context(request)
    context["nav"] = "tools"
    return render(request, "dashboard/tools.html", context)


@fragments
def tools_fragments(request: HttpRequest) -> JsonResponse:
    context = _context(request)
    parts = {key: (template, context) for key, template in PARTIALS.items()}
    return fragments_response(request, parts, {"histogram": context["histogram"]})


@page
def tool_calls(request: HttpRequest) -> HttpResponse:
    """One tool's calls (or every tool's failures with ?status=error), newest first."""
    key, since = window_param(request)
    tool = request.GET.get("tool", "")[:255]
    status = request.GET.get("status", "")
    calls = (tool_calls_in(since=since, tool_name=tool or None).select_related("conversation", "artifact")
             .defer(*queries.HEAVY_TOOL_FIELDS))
    if status == "error":
        calls = calls.filter(success=False)
    elif status == "ok":
        calls = calls.filter(success=True)
    page_obj = Paginator(calls.order_by("-started_at", "-pk"), PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        **window_context(key),
        "nav": "tools",
        "tool": tool,
        "status": status,
        "page_obj": page_obj,
        "query": query.urlencode(),
        "stats": next(iter(window_tool_stats(since=since, tool_name=tool)), None) if tool else None,
    }
    return render(request, "dashboard/tool_calls.html", context)
