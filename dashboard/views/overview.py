"""The overview: tokens and cost per minute, totals, active conversations, models, tools, findings,
compressions, errors."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from dashboard import queries
from dashboard.views.common import fragments, fragments_response, page, window_context, window_param
from pipeline.insight import finding_counts
from pipeline.insight.usage import window_model_usage
from pipeline.stats import window_tool_stats

PARTIALS = {
    "overview-totals": "dashboard/partials/overview_totals.html",
    "overview-active": "dashboard/partials/overview_active.html",
    "overview-tools": "dashboard/partials/tool_stats.html",
    "overview-compressions": "dashboard/partials/overview_compressions.html",
    "overview-errors": "dashboard/partials/overview_errors.html",
    "overview-models": "dashboard/partials/overview_models.html",
    "overview-findings": "dashboard/partials/overview_findings.html",
}


def _context(request: HttpRequest) -> dict:
    key, since = window_param(request)
    finding_counts.resume()  # once per process: counts an earlier process left stale
    return {
        **window_context(key),
        "totals": queries.totals(since),
        "active": queries.active_conversations(),
        "tool_stats": window_tool_stats(since=since),
        "tool_stats_id": "overview-tools",
        "compressions": queries.recent_compressions(),
        "errors": queries.recent_errors(),
        "model_usage": window_model_usage(since=since),
        "finding_codes": queries.finding_codes(since),
    }


@page
def overview(request: HttpRequest) -> HttpResponse:
    context = _context(request)
    context.update(nav="overview", partials=PARTIALS, tokens_chart=queries.tokens_per_minute())
    return render(request, "dashboard/overview.html", context)


@fragments
def overview_fragments(request: HttpRequest) -> JsonResponse:
    context = _context(request)
    parts = {key: (template, context) for key, template in PARTIALS.items()}
    return fragments_response(request, parts, {"tokens_chart": queries.tokens_per_minute()})
