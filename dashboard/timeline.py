"""A conversation's rounds as a ReAct timeline: LLM calls, tool calls, compressions, skills, in order.

A handful of queries for any number of rounds (one per kind of record), grouped in Python. The
page shows one window of turns at a time (`turn_window`: the latest turns, about STEPS_PER_PAGE
steps of them, or an older page; `held_window`: the one a live page holds as turns are added), and
its context chart the LLM calls of the same span of time, so the work of a page does not grow with
the conversation.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.core.paginator import Page, Paginator
from django.db.models import Q
from django.urls import reverse

from dashboard.context_bars import ContextBar, context_bar, usage_series
from dashboard.diff_lines import DiffLine, diff_lines
from dashboard.queries import HEAVY_COMPRESSION_FIELDS, HEAVY_LLM_FIELDS
from pipeline.ingest.normalise.messages import message_text, tool_calls_of
from pipeline.insight.conversation_rows import up_to_latest_call
from pipeline.models import CompressionEvent, Conversation, LLMCall, Round, SkillActivation, ToolCall

CHART_CALLS = 500  # the context chart shows at most this many (the latest) LLM calls of its window
# The conversation page shows about this many steps (LLM and tool calls) a page, in whole turns:
# as many turns as the conversation's average turn fills it with, from 1 to MAX_TURNS_PER_PAGE.
STEPS_PER_PAGE = 50
MAX_TURNS_PER_PAGE = 20
MAX_HELD_TURNS = 2 * MAX_TURNS_PER_PAGE  # an older page held live: its turns, and late ones between them


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


@dataclass(frozen=True)
class TimeSpan:
    """[since, until); None: open on that side."""

    since: datetime | None = None
    until: datetime | None = None

    def filter(self, field: str) -> Q:
        q = Q()
        if self.since is not None:
            q &= Q(**{f"{field}__gte": self.since})
        if self.until is not None:
            q &= Q(**{f"{field}__lt": self.until})
        return q

    def __contains__(self, at: datetime) -> bool:
        return (self.since is None or at >= self.since) and (self.until is None or at < self.until)


@dataclass(frozen=True)
class TurnWindow:
    """One page of a conversation's turns (page 1: the latest): its rounds oldest first, their
    numbers in the conversation, and the span of time it covers, from its first turn's start (the
    oldest page: from the beginning) to the start of the next newer turn (the latest page: open)."""

    page: Page
    rounds: list[Round]
    numbers: list[int]
    span: TimeSpan
    moved: bool = False  # an older page held live (held_window) whose number now names other turns

    @property
    def total(self) -> int:
        return self.page.paginator.count

    @property
    def first_number(self) -> int:
        return self.numbers[0] if self.numbers else 0

    @property
    def last_number(self) -> int:
        return self.numbers[-1] if self.numbers else 0


def turns_per_page(conversation: Conversation) -> int:
    """How many turns a page of the conversation shows: STEPS_PER_PAGE steps of its average turn
    (from its stored counts, so the pages stay put while it grows slowly)."""
    steps = conversation.llm_call_count + conversation.tool_call_count
    if not conversation.round_count or not steps:
        return MAX_TURNS_PER_PAGE
    return max(1, min(MAX_TURNS_PER_PAGE, STEPS_PER_PAGE * conversation.round_count // steps))


def _after(round_: Round) -> Q:
    """The turns after `round_` in the order the pages number them: (start, id)."""
    return Q(started_at__gt=round_.started_at) | Q(started_at=round_.started_at, pk__gt=round_.pk)


def _before(round_: Round) -> Q:
    return Q(started_at__lt=round_.started_at) | Q(started_at=round_.started_at, pk__lt=round_.pk)


def _next_start(conversation: Conversation, round_: Round) -> datetime | None:
    """When the turn after `round_` started (None: it is the latest)."""
    return (Round.objects.filter(_after(round_), conversation=conversation)
            .order_by("started_at", "pk").values_list("started_at", flat=True).first())


def page_of_round(round_: Round) -> int:
    """The page of its conversation's turns (1, the latest) that shows the round."""
    newer = Round.objects.filter(_after(round_), conversation_id=round_.conversation_id)
    return newer.count() // turns_per_page(round_.conversation) + 1


def turn_window(conversation: Conversation, page_number: object = 1) -> TurnWindow:
    """The page `page_number` of the conversation's turns, newest page first (a bad or too large
    number gives the nearest page, like the lists)."""
    newest_first = Round.objects.filter(conversation=conversation).order_by("-started_at", "-pk")
    per_page = turns_per_page(conversation)
    page = Paginator(newest_first, per_page).get_page(page_number)
    rounds = list(page.object_list)[::-1]
    newest = page.paginator.count - (page.number - 1) * per_page
    numbers = list(range(newest - len(rounds) + 1, newest + 1))
    since = rounds[0].started_at if rounds and page.has_next() else None
    until = _next_start(conversation, rounds[-1]) if rounds and page.has_previous() else None
    return TurnWindow(page, rounds, numbers, TimeSpan(since, until))


def held_window(conversation: Conversation, page_number: object, shown: list[int]) -> TurnWindow:
    """The window of turns a live page holds, `shown` being the ids of the turns it lists, oldest
    first. The latest page follows the newest turns: its window is page 1's now. An older page
    keeps its turns, from the first to the last it lists (and any turn that arrived late between
    them, up to MAX_HELD_TURNS), as pages are counted from the newest turn and its number names
    turns one newer with each new turn; its `moved` says so. Its page (the pager) is still its
    number's. When the page's first or last turn is gone, the number's window it is."""
    current = turn_window(conversation, page_number)
    if current.page.number == 1 or not shown or [r.pk for r in current.rounds] == shown:
        return current
    ends = {r.pk: r for r in Round.objects.filter(conversation=conversation, pk__in={shown[0], shown[-1]}).order_by()}
    first, last = ends.get(shown[0]), ends.get(shown[-1])
    if first is None or last is None or (last.started_at, last.pk) < (first.started_at, first.pk):
        return current
    between = Round.objects.filter(conversation=conversation, started_at__gte=first.started_at,
                                   started_at__lte=last.started_at)  # the index's range; the ties below
    rounds = list(between.filter(Q(pk=first.pk) | _after(first)).filter(Q(pk=last.pk) | _before(last))
                  .order_by("started_at", "pk")[:MAX_HELD_TURNS])
    if not rounds:  # moved or deleted since they were read
        return current
    older = Round.objects.filter(_before(first), conversation=conversation, started_at__lte=first.started_at).count()
    numbers = list(range(older + 1, older + len(rounds) + 1))
    span = TimeSpan(first.started_at if older else None, _next_start(conversation, rounds[-1]))
    moved = [r.pk for r in rounds] != [r.pk for r in current.rounds]
    return TurnWindow(current.page, rounds, numbers, span, moved=moved)


def build_turns(conversation: Conversation, rounds: list[Round], numbers: list[int],
                unassigned: TimeSpan | None = None) -> list[Turn]:
    """Turns for `rounds` (in order, with their `numbers` in the conversation), steps sorted by time;
    with `unassigned`, a last turn of the records of no round in that span of time."""
    ids = [r.pk for r in rounds]
    steps: dict[int | None, list[Step]] = defaultdict(list)

    def of(model, at: str):
        # The conversation inside each branch, not around them: the rounds' ids find theirs by the
        # round index, and the records of no round by the conversation's time index, within the
        # span, instead of one walk of all the conversation's records.
        where = Q(round_id__in=ids)
        if unassigned is not None:
            where |= Q(conversation=conversation, round__isnull=True) & unassigned.filter(at)
        return model.objects.filter(where)

    calls = list(of(LLMCall, "started_at").defer(*HEAVY_LLM_FIELDS).order_by("started_at", "pk"))
    lines = diff_lines(calls)  # from the digests loaded with the calls, in a few more queries
    for call in calls:
        steps[call.round_id].append(_llm_step(call, lines[call.pk]))
    for tool in of(ToolCall, "started_at").select_related("artifact").order_by("started_at"):
        steps[tool.round_id].append(Step("tool", tool.started_at, tool))
    for event in of(CompressionEvent, "occurred_at").defer(*HEAVY_COMPRESSION_FIELDS).order_by("occurred_at"):
        steps[event.round_id].append(Step("compression", event.occurred_at, event))
    for skill in of(SkillActivation, "activated_at").order_by("activated_at"):
        steps[skill.round_id].append(Step("skill", skill.activated_at, skill))
    for items in steps.values():
        items.sort(key=lambda step: step.at)
    turns = [Turn(r, n, steps.get(r.pk, [])) for r, n in zip(rounds, numbers, strict=True)]
    if unassigned is not None and steps.get(None):
        turns.append(Turn(None, 0, steps[None]))
    return turns


def context_chart(conversation: Conversation, span: TimeSpan | None = None) -> dict:
    """Context usage per LLM call in `span` of the conversation (all of it when None; at most the
    latest CHART_CALLS calls), with compression markers between calls."""
    span = span or TimeSpan()
    window = span.filter("started_at")
    if span.until is None:
        window &= up_to_latest_call(conversation.pk)
    calls = list(
        LLMCall.objects.filter(window, conversation=conversation)
        .only("pk", "started_at", "input_tokens", "context_tokens", "context_window", "context_composition")
        .order_by("-started_at")[:CHART_CALLS]
    )[::-1]
    series = usage_series(calls)
    starts = [call.started_at for call in calls]
    since = starts[0] if starts else None
    # The compressions of the span (a window without LLM calls charts none of another window's),
    # and none before the first call charted.
    events = CompressionEvent.objects.filter(span.filter("occurred_at"), conversation=conversation).order_by(
        "occurred_at").only("pk", "occurred_at", "strategy", "tokens_before", "tokens_after")
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
