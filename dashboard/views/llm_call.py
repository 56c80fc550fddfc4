"""One LLM call: the messages the model saw, what it answered, and its context-window bar; its
input side by side with the previous call's, the kept prefix folded, the rest marked by what
changed (pipeline.insight.calls.call_diff); its cost split by kind of token."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from dashboard.context_bars import LABELS, context_bar
from dashboard.diff_lines import diff_line, signed_tokens
from dashboard.timeline import assistant_thoughts
from dashboard.views.common import page
from pipeline.ingest.normalise.digest import message_tokens
from pipeline.ingest.normalise.messages import message_text
from pipeline.insight.calls import call_diff
from pipeline.insight.costs import llm_call_cost_parts
from pipeline.models import LLMCall

MAX_MESSAGE_CHARS = 50_000


@dataclass(frozen=True)
class MessageView:
    index: int
    role: str
    text: str
    length: int  # characters before clipping

    @property
    def clipped(self) -> bool:
        return self.length > len(self.text)


def message_views(messages: object) -> list[MessageView]:
    """Role and text of each message in the GenAI parts shape, long texts clipped."""
    views = []
    for index, message in enumerate(messages if isinstance(messages, list) else []):
        if not isinstance(message, dict):
            continue
        text = message_text(message)
        views.append(MessageView(index, str(message.get("role", "")), text[:MAX_MESSAGE_CHARS], len(text)))
    return views


@dataclass(frozen=True)
class DiffMessage:
    message: MessageView
    fate: str  # "kept", "added", "changed", "uncached" (this input) or "kept", "removed", "changed" (previous)
    tokens: int | None  # its share of the call's input tokens; None when the digest does not cover it


@dataclass(frozen=True)
class DiffSide:
    """One input of the comparison: the kept prefix (folded on the page) and the messages after it."""

    prefix: list[DiffMessage]
    rest: list[DiffMessage]

    @property
    def count(self) -> int:
        return len(self.prefix) + len(self.rest)


def diff_side(call: LLMCall, kept: int, fates: dict[int, str], after_prefix: str) -> DiffSide:
    """`call`'s input, message k (the k-th message, as the digest counts them) marked `fates[k]`,
    or `after_prefix` past the kept prefix."""
    tokens = message_tokens(call.input_digest if isinstance(call.input_digest, list) else [], call.input_tokens)
    marked = [
        DiffMessage(m, "kept" if k < kept else fates.get(k, after_prefix), tokens[k] if k < len(tokens) else None)
        for k, m in enumerate(message_views(call.input_messages))
    ]
    return DiffSide(marked[:kept], marked[kept:])


def diff_sides(call: LLMCall, previous: LLMCall, diff: dict) -> tuple[DiffSide, DiffSide]:
    """(previous input, this input), each message marked by what became of it."""
    kept = diff["kept_prefix_messages"]
    before = {item["index"]: "removed" for item in diff["removed"]}
    before |= {item["previous_index"]: "changed" for item in diff["changed"]}
    after = {item["index"]: "added" for item in diff["added"]}
    after |= {item["index"]: "changed" for item in diff["changed"]}
    # Shared messages past a broken prefix were cached before and are not now.
    return (diff_side(previous, kept, before, "kept"),
            diff_side(call, kept, after, "uncached" if diff["cache_break"] else "kept"))


@dataclass(frozen=True)
class CategoryDelta:
    category: str
    label: str
    tokens: int

    @property
    def text(self) -> str:
        return signed_tokens(self.tokens)


def category_deltas(diff: dict) -> list[CategoryDelta]:
    return [CategoryDelta(c, LABELS.get(c, c), n) for c, n in diff["token_delta_by_category"].items()]


COST_PARTS = (("input", "input"), ("cache_read", "cache read"), ("cache_write", "cache write"),
              ("output", "output"), ("request", "per request"))


def cost_split(call: LLMCall) -> list[tuple[str, Decimal]]:
    """The call's cost by kind of token, the parts it has, when it is priced per token."""
    if call.cost_usd is None:
        return []
    parts = llm_call_cost_parts(call) or {}
    return [(label, parts[key]) for key, label in COST_PARTS if parts.get(key)]


@page
def llm_call_detail(request: HttpRequest, pk: int) -> HttpResponse:
    call = get_object_or_404(LLMCall.objects.select_related("conversation", "round"), pk=pk)
    diff = call_diff(call)
    previous = LLMCall.objects.filter(pk=diff["previous_call_id"]).first() if diff["previous_call_id"] else None
    context = {
        "nav": "conversations",
        "call": call,
        "conversation": call.conversation,
        "bar": context_bar(call),
        "thoughts": assistant_thoughts(call),
        "input_messages": message_views(call.input_messages),
        "output_messages": message_views(call.output_messages),
        "tool_calls": call.tool_calls.order_by("started_at"),
        "diff": diff,
        "line": diff_line(diff, call.cache_read_tokens),
        "by_category": category_deltas(diff),
        "previous": previous,
        "sides": diff_sides(call, previous, diff) if previous is not None else None,
        "cost_parts": cost_split(call),
    }
    return render(request, "dashboard/llm_call.html", context)
