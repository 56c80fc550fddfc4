"""One conversation: header, findings, context-usage chart, and the rounds as a ReAct timeline, live."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse

from dashboard.queries import HEAVY_COMPRESSION_FIELDS
from dashboard.timeline import build_turns, context_chart, numbered_rounds
from dashboard.views.common import fragments, fragments_response, page
from pipeline.insight.findings import SEVERITIES, Finding, conversation_findings
from pipeline.models import CompressionEvent, Conversation, Round

LATEST_ROUNDS = 100  # the page shows the latest rounds; ?all=1 shows every one
MAX_FRAGMENT_ROUNDS = 50
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


def _findings_context(conversation: Conversation) -> dict:
    """The findings panel: computed fresh, like the findings API, on every render."""
    findings = conversation_findings(conversation)
    severities = Counter(f.severity for f in findings)
    return {"findings": [_finding_row(f) for f in findings],
            "finding_severities": [(s, severities[s]) for s in SEVERITIES if severities[s]]}


def _header_context(conversation: Conversation) -> dict:
    compressions = (CompressionEvent.objects.filter(conversation=conversation).defer(*HEAVY_COMPRESSION_FIELDS)
                    .order_by("-occurred_at")[:50])
    return {"conversation": conversation, "compressions": list(compressions)}


def _timeline_context(conversation: Conversation, show_all: bool) -> dict:
    rounds_qs = Round.objects.filter(conversation=conversation).order_by("-started_at", "-pk")
    total = rounds_qs.count()
    rounds = list(rounds_qs if show_all else rounds_qs[:LATEST_ROUNDS])[::-1]
    first = total - len(rounds) + 1
    turns = build_turns(conversation, rounds, list(range(first, first + len(rounds))), include_unassigned=True)
    return {"conversation": conversation, "turns": turns, "total_rounds": total, "hidden_rounds": total - len(rounds)}


@page
def conversation_detail(request: HttpRequest, pk: int) -> HttpResponse:
    conversation = get_object_or_404(Conversation, pk=pk)
    context = {
        **_header_context(conversation),
        **_findings_context(conversation),
        **_timeline_context(conversation, request.GET.get("all") == "1"),
        "nav": "conversations",
        "context_chart": context_chart(conversation),
    }
    return render(request, "dashboard/conversation.html", context)


MAX_ID = 2**63 - 1  # ids beyond a 64-bit integer name nothing (and SQLite refuses to compare them)


def _round_ids(raw: str) -> list[int] | None:
    try:
        ids = [int(part) for part in raw.split(",") if part.strip()]
    except ValueError:
        return None
    return [i for i in ids if 0 < i <= MAX_ID][:MAX_FRAGMENT_ROUNDS]


@fragments
def conversation_fragments(request: HttpRequest, pk: int) -> JsonResponse:
    """Header, compressions and chart always; `?rounds=1,2` those rounds; `?timeline=1` the whole
    timeline (the latest rounds, or every one with `&all=1`)."""
    conversation = Conversation.objects.filter(pk=pk).first()
    if conversation is None:
        return JsonResponse({"error": "no such conversation"}, status=404)
    round_ids = _round_ids(request.GET.get("rounds", ""))
    if round_ids is None:
        return JsonResponse({"error": "rounds must be a comma-separated list of ids"}, status=400)
    header = _header_context(conversation)
    parts = {
        "conversation-header": ("dashboard/partials/conversation_header.html", header),
        "conversation-compressions": ("dashboard/partials/conversation_compressions.html", header),
        "conversation-findings": ("dashboard/partials/conversation_findings.html", _findings_context(conversation)),
    }
    if request.GET.get("timeline") == "1":
        show_all = request.GET.get("all") == "1"
        parts["timeline"] = ("dashboard/partials/timeline.html", _timeline_context(conversation, show_all))
    elif round_ids:
        rounds, numbers = numbered_rounds(conversation, round_ids)
        for turn in build_turns(conversation, rounds, numbers):
            parts[turn.dom_id] = ("dashboard/partials/round.html", {"turn": turn, "conversation": conversation})
    return fragments_response(request, parts, {"context_chart": context_chart(conversation)})
