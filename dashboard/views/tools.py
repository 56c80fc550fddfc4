"""Tools: per-tool statistics, a latency histogram, errors by type, and one tool's calls."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from dashboard import queries
from dashboard.views.common import fragments, fragments_response, page, window_context, window_param
from pipeline.stats import tool_calls_in, tool_stats

PAGE_SIZE = 50
PARTIALS = {
    "tools-stats": "dashboard/partials/tool_stats.html",
    "tools-errors": "dashboard/partials/tool_errors.html",
}


def _context(request: HttpRequest) -> dict:
    key, since = window_param(request)
    tool = request.GET.get("tool", "")[:255]
    calls = tool_calls_in(since=since, tool_name=tool or None)
    return {
        **window_context(key),
        "tool": tool,
        "tool_stats": tool_stats(tool_calls_in(since=since)),
        "tool_stats_id": "tools-stats",
        "errors_by_type": queries.errors_by_type(calls),
        "histogram": queries.latency_histogram(calls),
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
        "stats": next(iter(tool_stats(tool_calls_in(since=since, tool_name=tool))), None) if tool else None,
    }
    return render(request, "dashboard/tool_calls.html", context)
