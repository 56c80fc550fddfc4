"""One conversation: header, findings, context-usage chart, and the rounds as a ReAct timeline, live.

The page shows one window of turns (`?page=`, 1 the latest; dashboard.timeline.turn_window; `?round=`
redirects to the page holding that round) and, for that window, the timeline, the context chart and
the findings; the findings' totals are the conversation's stored counts. Its live fragments take
the same `page` and the turns the page lists (`shown`), and describe the window the page holds
(dashboard.timeline.held_window): the latest page follows the newest turns, an older page keeps its
turns. A refresh costs what the window holds, however long the conversation.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TypedDict

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse

from dashboard.queries import HEAVY_COMPRESSION_FIELDS
from dashboard.timeline import (
    MAX_HELD_TURNS,
    TurnWindow,
    build_turns,
    context_chart,
    held_window,
    page_of_round,
    turn_window,
)
from dashboard.views.common import fragments, fragments_response, page
from pipeline.insight.findings import CODES, SEVERITIES, Finding, conversation_findings
from pipeline.models import CompressionEvent, Conversation, Round

MAX_FRAGMENT_ROUNDS = 50
MAX_ID = 2**63 - 1  # ids beyond a 64-bit integer name nothing (and SQLite refuses to compare them)
# Findings about a tool's own call link to its timeline entry; the others to the LLM call page.
TOOL_CODES = ("repeated_tool_call", "oversized_observation", "retry_storm")


@dataclass(frozen=True)
class FindingRow:
    finding: Finding
    href: str
    label: str


def _finding_row(finding: Finding) -> FindingRow:
    if finding.tool_call is not None and (finding.code in TOOL_CODES or finding.llm_call_id is None):
        return FindingRow(finding, f"#tool-{finding.tool_call}", "tool call")
    if finding.llm_call_id is not None:
        return FindingRow(finding, reverse("llm-call", args=[finding.llm_call_id]), "LLM call")
    return FindingRow(finding, "", "")


def _findings_context(conversation: Conversation, window: TurnWindow) -> dict:
    """The findings panel: those about the turns shown, computed fresh on every render from the
    window's calls only. The totals are those of the list when it shows the whole conversation,
    else the conversation's stored counts (pipeline.insight.finding_counts)."""
    findings = conversation_findings(conversation, window.span.since, window.span.until)
    windowed = window.page.paginator.num_pages > 1
    severities: Counter[str] = Counter()
    if windowed:
        for code, n in (conversation.finding_counts or {}).items():
            if code in CODES and isinstance(n, int):
                severities[CODES[code]] += n
    else:
        severities.update(f.severity for f in findings)
    return {"findings": [_finding_row(f) for f in findings], "findings_windowed": windowed,
            "finding_severities": [(s, severities[s]) for s in SEVERITIES if severities[s]], "turn_window": window}


def _header_context(conversation: Conversation, window: TurnWindow) -> dict:
    """The header, and the compressions of the window's span of time (the latest 50)."""
    compressions = (CompressionEvent.objects.filter(window.span.filter("occurred_at"), conversation=conversation)
                    .defer(*HEAVY_COMPRESSION_FIELDS).order_by("-occurred_at")[:50])
    return {"conversation": conversation, "compressions": list(compressions)}


def _timeline_context(conversation: Conversation, window: TurnWindow) -> dict:
    turns = build_turns(conversation, window.rounds, window.numbers, unassigned=window.span)
    # The pager's links keep nothing else of the query: the page takes no other parameter.
    return {"conversation": conversation, "turns": turns, "total_rounds": window.total, "page_obj": window.page,
            "query": "", "turn_window": window}


def _page_holding(conversation: Conversation, raw_round: str) -> str | None:
    """The URL of the page of turns that holds the round `raw_round` of the conversation (links to
    a turn or one of its steps carry `?round=`, as the page a turn is on moves as turns are added);
    None when it names none of the conversation's rounds."""
    try:
        round_id = int(raw_round)
    except ValueError:
        return None
    target = Round.objects.filter(conversation=conversation, pk=round_id).first() if 0 < round_id <= MAX_ID else None
    if target is None:
        return None
    number = page_of_round(target)
    url = reverse("conversation", args=[conversation.pk])
    return f"{url}?page={number}" if number > 1 else url


@page
def conversation_detail(request: HttpRequest, pk: int) -> HttpResponse:
    conversation = get_object_or_404(Conversation, pk=pk)
    if "round" in request.GET:
        # A redirect, so that the address (which the live refresh and the pager read) names the
        # page; the browser keeps the link's #anchor across it.
        return redirect(_page_holding(conversation, request.GET["round"])
                        or reverse("conversation", args=[conversation.pk]))
    window = turn_window(conversation, request.GET.get("page"))
    context = {
        **_header_context(conversation, window),
        **_findings_context(conversation, window),
        **_timeline_context(conversation, window),
        "nav": "conversations",
        "context_chart": context_chart(conversation, window.span),
    }
    return render(request, "dashboard/conversation.html", context)


def _round_ids(raw: str, limit: int = MAX_FRAGMENT_ROUNDS) -> list[int] | None:
    try:
        ids = [int(part) for part in raw.split(",") if part.strip()]
    except ValueError:
        return None
    return [i for i in ids if 0 < i <= MAX_ID][:limit]


class WindowData(TypedDict):
    """What the page needs to keep its timeline on the window the fragments describe: the turns
    it holds (the others leave the page), the line above them, the pager's count of pages, and
    whether an older page's number now names other turns (static/js/conversation.js)."""

    rounds: list[int]
    first: int
    last: int
    total: int
    pages: int
    moved: bool


def _window_data(window: TurnWindow) -> WindowData:
    return WindowData(rounds=[r.pk for r in window.rounds], first=window.first_number, last=window.last_number,
                      total=window.total, pages=window.page.paginator.num_pages, moved=window.moved)


@fragments
def conversation_fragments(request: HttpRequest, pk: int) -> JsonResponse:
    """Header, compressions, findings and chart always; `?rounds=1,2` those rounds (those of the
    window only), and with `?shown=` (the ids of the turns the page lists, oldest first) the turns
    of the window it does not list; `?timeline=1` the whole timeline; all of them for the window of
    `?page=` (1, the latest, unless given) that the page holds (held_window), described in `data`."""
    conversation = Conversation.objects.filter(pk=pk).first()
    if conversation is None:
        return JsonResponse({"error": "no such conversation"}, status=404)
    round_ids = _round_ids(request.GET.get("rounds", ""))
    shown = _round_ids(request.GET.get("shown", ""), 2 * MAX_HELD_TURNS)
    if round_ids is None or shown is None:
        return JsonResponse({"error": "rounds and shown must be comma-separated lists of ids"}, status=400)
    window = held_window(conversation, request.GET.get("page"), shown)
    header = _header_context(conversation, window)
    parts = {
        "conversation-header": ("dashboard/partials/conversation_header.html", header),
        "conversation-compressions": ("dashboard/partials/conversation_compressions.html", header),
        "conversation-findings": ("dashboard/partials/conversation_findings.html",
                                  _findings_context(conversation, window)),
    }
    if request.GET.get("timeline") == "1":
        parts["timeline"] = ("dashboard/partials/timeline.html", _timeline_context(conversation, window))
    else:
        # Only turns of the window, numbered as it numbers them: a turn outside it (a new turn
        # while an older page is shown) stays off the page; a turn of the window that the page
        # does not list (the latest page moving on) joins it.
        wanted = set(round_ids)
        if "shown" in request.GET:
            wanted |= {r.pk for r in window.rounds} - set(shown)
        held = [(r, n) for r, n in zip(window.rounds, window.numbers, strict=True) if r.pk in wanted]
        if held:
            for turn in build_turns(conversation, [r for r, _ in held], [n for _, n in held]):
                parts[turn.dom_id] = ("dashboard/partials/round.html", {"turn": turn, "conversation": conversation})
    return fragments_response(request, parts, {"context_chart": context_chart(conversation, window.span),
                                               "turn_window": _window_data(window)})
