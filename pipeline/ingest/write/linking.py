"""Links between the rows of a round, recomputed over everything the round holds.

Spans arrive in any order and in separate requests, so nothing here trusts the batch alone:
for every round a batch touches, the round's stored rows are loaded beside the new ones, the
LLM calls are numbered in start order (step), each tool call is tied to the LLM call that asked
for it (by tool_call_id, else by name and order, else by time), missing tool_call_ids,
arguments and observations are recovered from the LLM calls' messages, and a round whose
root states no answer shows its last LLM answer. The result depends only on the set of rows,
not on the order they came in. New rows are fixed in memory before they are inserted; stored
rows that change are written with one executemany each.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import OuterRef, Subquery

from pipeline.ingest.normalise.messages import last_text, tool_calls_of, tool_responses_of
from pipeline.ingest.write.sql import update_rows
from pipeline.ingest.normalise.values import to_text
from pipeline.models import CompressionEvent, LLMCall, Round, ToolCall

LLM_FIELDS = ("id", "round_id", "trace_id", "span_id", "started_at", "ended_at", "step", "output_messages")
TOOL_FIELDS = ("id", "round_id", "trace_id", "span_id", "started_at", "tool_name", "tool_call_id", "llm_call_id",
               "arguments", "observation", "tokens_pending")
TOOL_LINK_FIELDS = ["llm_call", "tool_call_id", "arguments", "observation", "tokens_pending"]


def _order(row: LLMCall | ToolCall) -> tuple:
    return row.started_at, row.span_id


@dataclass
class RoundRows:
    """The LLM and tool calls of some rounds: stored ones (loaded) and new ones (not yet saved)."""

    llm: dict[int, list[LLMCall]] = field(default_factory=lambda: defaultdict(list))
    tools: dict[int, list[ToolCall]] = field(default_factory=lambda: defaultdict(list))
    changed_llm: dict[int, LLMCall] = field(default_factory=dict)
    changed_tools: dict[int, ToolCall] = field(default_factory=dict)

    @classmethod
    def load(cls, round_ids: Iterable[int]) -> RoundRows:
        rows = cls()
        round_ids = list(round_ids)
        if round_ids:
            for call in LLMCall.objects.filter(round_id__in=round_ids).only(*LLM_FIELDS):
                rows.llm[call.round_id].append(call)
            for tool in ToolCall.objects.filter(round_id__in=round_ids).only(*TOOL_FIELDS):
                rows.tools[tool.round_id].append(tool)
        return rows

    def add(self, llm: Iterable[LLMCall], tools: Iterable[ToolCall]) -> None:
        for call in llm:
            self.llm[call.round_id].append(call)
        for tool in tools:
            self.tools[tool.round_id].append(tool)

    def number_steps(self) -> None:
        """LLM calls in start order; call before the new ones are inserted so they go in right."""
        for calls in self.llm.values():
            calls.sort(key=_order)
            for step, call in enumerate(calls):
                if call.step != step:
                    call.step = step
                    if call.pk:
                        self.changed_llm[call.pk] = call

    def link_tools(self) -> None:
        """Tie tools to their LLM calls; call after the new LLM calls are inserted (they need ids)."""
        for round_id, tools in self.tools.items():
            calls = self.llm.get(round_id, [])
            tools.sort(key=_order)
            if calls:
                for tool in _link_tools(calls, tools):
                    if tool.pk:
                        self.changed_tools[tool.pk] = tool

    def fill_final_answers(self, rounds: Iterable[Round]) -> list[Round]:
        """A round whose root states no answer shows its last LLM call's text answer.

        The stored answer is replaced only while it is empty or one of the round's own LLM
        answers (an earlier fallback), so an answer the root span states is never overwritten.
        """
        changed = []
        for round_ in rounds:
            answers = [(c.ended_at or c.started_at, c.span_id, a) for c in self.llm.get(round_.id, ()) if (a := _answer(c))]
            if not answers:
                continue
            latest = max(answers)[2]
            if round_.final_answer != latest and (
                not round_.final_answer or round_.final_answer in {a for _, _, a in answers}
            ):
                round_.final_answer = latest
                changed.append(round_)
        return changed

    def save_changes(self) -> None:
        update_rows(LLMCall, sorted(self.changed_llm.values(), key=lambda c: c.pk), ["step"])
        update_rows(ToolCall, sorted(self.changed_tools.values(), key=lambda t: t.pk), TOOL_LINK_FIELDS)


def _answer(call: LLMCall) -> str:
    outputs = call.output_messages or []
    return "" if tool_calls_of(outputs) else last_text(outputs, "assistant")


def _better_arguments(stored: Any, requested: Any) -> bool:
    """The model's structured arguments beat a tool span that has none or only a bare string
    (OpenInference records `input.value = "Paris"` when LangChain invokes a tool with a ToolCall)."""
    if requested in (None, "", {}) or stored == requested:
        return False
    return stored in ({}, "", None) or (not isinstance(stored, dict) and isinstance(requested, dict))


def _link_tools(calls: list[LLMCall], tools: list[ToolCall]) -> list[ToolCall]:
    """Tie tools to the LLM call that requested them; returns the tool rows that changed."""
    requested: dict[str, tuple[LLMCall, dict[str, Any]]] = {}
    by_call: dict[int, list[dict[str, Any]]] = {}
    for call in calls:
        parts = tool_calls_of(call.output_messages or [])
        by_call[call.pk] = parts
        for part in parts:
            if part.get("id"):
                requested.setdefault(part["id"], (call, part))
    claimed = {t.tool_call_id for t in tools if t.tool_call_id}
    changed = []
    for tool in tools:
        before = (tool.llm_call_id, tool.tool_call_id, tool.arguments, tool.observation)
        owner: LLMCall | None = None
        part: dict[str, Any] | None = None
        if tool.tool_call_id and tool.tool_call_id in requested:
            owner, part = requested[tool.tool_call_id]
        else:
            earlier = [c for c in calls if c.started_at <= tool.started_at]
            for candidate in reversed(earlier or calls):
                part = next(
                    (p for p in by_call[candidate.pk]
                     if p.get("name") == tool.tool_name and p.get("id") and p["id"] not in claimed),
                    None,
                )
                if part is not None:
                    owner = candidate
                    break
            if owner is None:
                owner = earlier[-1] if earlier else None
            elif not tool.tool_call_id:
                tool.tool_call_id = str(part["id"])[:255]
                claimed.add(tool.tool_call_id)
        if owner is not None and tool.llm_call_id != owner.pk:
            tool.llm_call_id = owner.pk
        if part is not None and _better_arguments(tool.arguments, part.get("arguments")):
            tool.arguments = part["arguments"]
        if before != (tool.llm_call_id, tool.tool_call_id, tool.arguments, tool.observation):
            changed.append(tool)
    missing_observation = [t for t in tools if not t.observation and t.tool_call_id]
    if missing_observation:
        _recover_observations(calls, missing_observation, changed)
    return changed


def _recover_observations(calls: list[LLMCall], tools: list[ToolCall], changed: list[ToolCall]) -> None:
    """Take a tool's observation from an LLM call's input (the tool message with its id)."""
    responses: dict[str, Any] = {}
    stored = [c.pk for c in calls if "input_messages" not in c.get_deferred_fields() and c.input_messages]
    for call in calls:
        if call.pk in stored:
            responses.update(tool_responses_of(call.input_messages))
    loaded = LLMCall.objects.filter(pk__in=[c.pk for c in calls if c.pk not in stored]).values_list(
        "input_messages", flat=True
    )
    for messages in loaded:
        responses.update(tool_responses_of(messages or []))
    for tool in tools:
        if tool.tool_call_id in responses:
            tool.observation = to_text(responses[tool.tool_call_id])
            tool.tokens_pending = bool(tool.observation)
            if tool not in changed:
                changed.append(tool)


def link_compressions(new: list[CompressionEvent], rows: RoundRows, stored_round_ids: set[int]) -> None:
    """A compression belongs to the first LLM call of its round that starts after it."""
    for event in new:
        event.llm_call_id = next(
            (c.pk for c in rows.llm.get(event.round_id, ()) if c.started_at >= event.occurred_at), None
        )
    if stored_round_ids:
        next_call = (
            LLMCall.objects.filter(round_id=OuterRef("round_id"), started_at__gte=OuterRef("occurred_at"))
            .order_by("started_at").values("id")[:1]
        )
        CompressionEvent.objects.filter(round_id__in=stored_round_ids).update(llm_call_id=Subquery(next_call))


def relink_stored(round_ids: set[int], rounds: Iterable[Round]) -> None:
    """Relink rounds whose stored rows changed outside a span batch (e.g. messages from logs)."""
    rows = RoundRows.load(round_ids)
    rows.number_steps()
    rows.link_tools()
    rows.save_changes()
    update_rows(Round, rows.fill_final_answers(rounds), ["final_answer"])
