"""A conversation's rounds as a ReAct timeline: LLM calls, tool calls, compressions, skills, in order.

A handful of queries for any number of rounds (one per kind of record), grouped in Python.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.urls import reverse

from dashboard.context_bars import ContextBar, context_bar, usage_series
from dashboard.diff_lines import DiffLine, diff_lines
from dashboard.queries import HEAVY_COMPRESSION_FIELDS, HEAVY_LLM_FIELDS
from pipeline.ingest.normalise.messages import message_text, tool_calls_of
from pipeline.models import CompressionEvent, Conversation, LLMCall, Round, SkillActivation, ToolCall

CHART_CALLS = 500  # the context chart shows at most this many (the latest) LLM calls


@dataclass
class Step:
    kind: str  # "llm", "tool", "compression", "skill"
    at: datetime
    record: LLMCall | ToolCall | CompressionEvent | SkillActivation
    bar: ContextBar | None = None
    thoughts: str = ""
    requested: list[dict] = field(default_factory=list)  # tool calls the LLM asked for
    diff: DiffLine | None = None  # an LLM call's input against the previous call's


@dataclass
class Turn:
    round: Round | None  # None: calls that belong to no round
    number: int
    steps: list[Step]

    @property
    def dom_id(self) -> str:
        return f"round-{self.round.pk}" if self.round else "round-none"


def assistant_thoughts(call: LLMCall) -> str:
    """What the model said besides its tool calls: the text of its output messages."""
    texts = []
    for message in call.output_messages if isinstance(call.output_messages, list) else []:
        if isinstance(message, dict):
            text_only = {"parts": [p for p in message.get("parts", ()) if isinstance(p, dict)
                                   and p.get("type") in ("text", "reasoning")]}
            texts.append(message_text(text_only))
    return "\n\n".join(t for t in texts if t)


def _llm_step(call: LLMCall, diff: DiffLine) -> Step:
    messages = call.output_messages if isinstance(call.output_messages, list) else []
    return Step("llm", call.started_at, call, bar=context_bar(call), thoughts=assistant_thoughts(call),
                requested=tool_calls_of([m for m in messages if isinstance(m, dict)]), diff=diff)


def build_turns(conversation: Conversation, rounds: list[Round], numbers: list[int],
                include_unassigned: bool = False) -> list[Turn]:
    """Turns for `rounds` (in order, with their `numbers` in the conversation), steps sorted by time."""
    ids = [r.pk for r in rounds]
    steps: dict[int | None, list[Step]] = defaultdict(list)

    where = Q(round_id__in=ids) | Q(round__isnull=True) if include_unassigned else Q(round_id__in=ids)

    def of(model):
        return model.objects.filter(where, conversation=conversation)

    calls = list(of(LLMCall).defer(*HEAVY_LLM_FIELDS).order_by("started_at", "pk"))
    lines = diff_lines(calls)  # from the digests loaded with the calls, in a few more queries
    for call in calls:
        steps[call.round_id].append(_llm_step(call, lines[call.pk]))
    for tool in of(ToolCall).select_related("artifact").order_by("started_at"):
        steps[tool.round_id].append(Step("tool", tool.started_at, tool))
    for event in of(CompressionEvent).defer(*HEAVY_COMPRESSION_FIELDS).order_by("occurred_at"):
        steps[event.round_id].append(Step("compression", event.occurred_at, event))
    for skill in of(SkillActivation).order_by("activated_at"):
        steps[skill.round_id].append(Step("skill", skill.activated_at, skill))
    for items in steps.values():
        items.sort(key=lambda step: step.at)
    turns = [Turn(r, n, steps.get(r.pk, [])) for r, n in zip(rounds, numbers, strict=True)]
    if include_unassigned and steps.get(None):
        turns.append(Turn(None, 0, steps[None]))
    return turns


def numbered_rounds(conversation: Conversation, round_ids: list[int]) -> tuple[list[Round], list[int]]:
    """The rounds of `conversation` among `round_ids`, oldest first, and their numbers in the
    conversation (the position the conversation page gives them), in one query."""
    earlier = (
        Round.objects.filter(conversation=OuterRef("conversation"))
        .filter(Q(started_at__lt=OuterRef("started_at")) | Q(started_at=OuterRef("started_at"), pk__lt=OuterRef("pk")))
        .order_by()
        .values("conversation")
        .annotate(n=Count("pk"))
        .values("n")
    )
    rounds = list(
        Round.objects.filter(conversation=conversation, pk__in=round_ids)
        .annotate(earlier=Coalesce(Subquery(earlier), 0))
        .order_by("started_at", "pk")
    )
    return rounds, [r.earlier + 1 for r in rounds]


def context_chart(conversation: Conversation) -> dict:
    """Context usage per LLM call across the conversation, with compression markers between calls."""
    calls = list(
        LLMCall.objects.filter(conversation=conversation)
        .only("pk", "started_at", "input_tokens", "context_tokens", "context_window", "context_composition")
        .order_by("-started_at")[:CHART_CALLS]
    )[::-1]
    series = usage_series(calls)
    starts = [call.started_at for call in calls]
    since = starts[0] if starts else None
    events = CompressionEvent.objects.filter(conversation=conversation).order_by("occurred_at").only(
        "pk", "occurred_at", "strategy", "tokens_before", "tokens_after")
    if since is not None:
        events = events.filter(occurred_at__gte=since)
    series["compressions"] = [
        {
            # The marker sits on the first call made after the compression.
            "index": min(bisect_left(starts, event.occurred_at), max(len(starts) - 1, 0)),
            "strategy": event.get_strategy_display(),
            "tokens_before": event.tokens_before,
            "tokens_after": event.tokens_after,
            "url": reverse("compression", args=[event.pk]),
        }
        for event in events[:200]
    ]
    return series
