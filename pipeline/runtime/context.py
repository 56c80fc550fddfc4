"""The context window: how important each LangChain message is, and what fills the window.

Importance (design document §Context Management): CRITICAL user messages and failed tool
calls, HIGH tool observations (and skill instructions and compressed summaries, which stand
in for them), MEDIUM the assistant's thoughts and answers, LOW system messages. A message can
carry its own marker in `additional_kwargs["ctxlens"]` ({"category": ..., "importance": ...}),
which is how skill messages and summaries are recognised after they have been injected.

Categories are semconv.CONTEXT_CATEGORIES: system, skills, user, assistant,
tool_observations, compressed_summaries and free (what is left of the model's window).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from pipeline.runtime.settings import runtime_settings
from pipeline.semconv import CONTEXT_CATEGORIES
from pipeline.tokens.counting import (
    context_window,
    count_message_tokens,
    count_messages,
    is_approximate,
    scale_to_total,
)

MARKER = "ctxlens"
SUMMARY_CATEGORY = "compressed_summaries"
SKILLS_CATEGORY = "skills"


class MessageImportance(IntEnum):
    """Lower is more important; compression removes the least important first."""

    CRITICAL = 1  # user messages and errors: never dropped
    HIGH = 2  # tool observations
    MEDIUM = 3  # the assistant's thoughts
    LOW = 4  # system messages


def marker(message: BaseMessage) -> dict[str, Any]:
    value = message.additional_kwargs.get(MARKER) if isinstance(message.additional_kwargs, dict) else None
    return value if isinstance(value, dict) else {}


def with_marker(message: BaseMessage, **fields: Any) -> BaseMessage:
    """A copy of `message` whose ctxlens marker also holds `fields`."""
    kwargs = {**message.additional_kwargs, MARKER: {**marker(message), **fields}}
    return message.model_copy(update={"additional_kwargs": kwargs})


def category_of(message: BaseMessage) -> str:
    declared = marker(message).get("category")
    if declared in CONTEXT_CATEGORIES and declared != "free":
        return declared
    if isinstance(message, SystemMessage):
        return "system"
    if isinstance(message, ToolMessage):
        return "tool_observations"
    if isinstance(message, HumanMessage):
        return "user"
    return "assistant"  # AIMessage and anything else the model produced


def importance_of(message: BaseMessage) -> MessageImportance:
    declared = marker(message).get("importance")
    if declared is not None:
        try:
            return MessageImportance[str(declared).upper()] if isinstance(declared, str) else MessageImportance(declared)
        except (KeyError, ValueError):
            pass
    category = category_of(message)
    if isinstance(message, ToolMessage):
        return MessageImportance.CRITICAL if message.status == "error" else MessageImportance.HIGH
    if category in (SKILLS_CATEGORY, SUMMARY_CATEGORY):
        return MessageImportance.HIGH
    if category == "user":
        return MessageImportance.CRITICAL
    if category == "system":
        return MessageImportance.LOW
    return MessageImportance.MEDIUM


def message_tokens(messages: Sequence[BaseMessage], model: str) -> list[int]:
    return [count_message_tokens(m, model) for m in messages]


@dataclass(frozen=True)
class MessageTokens:
    """Per-message tokens on the scale `measure` decides by: when a provider's exact counter is
    registered for the model its total is the truth, and the tokenizer's per-message counts are
    scaled to it (`factor`); `count` puts a further message (an extract, a notice) on that scale."""

    per_message: list[int]
    factor: float = 1.0

    @property
    def total(self) -> int:
        return sum(self.per_message)

    def count(self, message: BaseMessage, model: str) -> int:
        tokens = count_message_tokens(message, model)
        return tokens if self.factor == 1.0 else max(round(tokens * self.factor), 1)


def count_on_measure_scale(messages: Sequence[BaseMessage], model: str) -> MessageTokens:
    """Every message counted once, scaled to a provider's exact total when there is one."""
    counted = count_messages(messages, model)
    approximated = sum(counted.per_message)
    if not counted.exact_total or not approximated or counted.tokens == approximated:
        return MessageTokens(list(counted.per_message))
    scaled = scale_to_total(dict(enumerate(counted.per_message)), counted.tokens)
    return MessageTokens([scaled[i] for i in range(len(messages))], counted.tokens / approximated)


@dataclass(frozen=True)
class ContextUsage:
    """What fills the model's window, by category; `free` is what is left."""

    model: str
    window: int
    by_category: dict[str, int]
    messages: int
    approximate: bool = False  # counted with a tokenizer that only approximates the model's

    @property
    def tokens(self) -> int:
        return sum(v for k, v in self.by_category.items() if k != "free")

    @property
    def ratio(self) -> float:
        return self.tokens / self.window if self.window else 0.0

    def composition(self) -> dict[str, int]:
        return {name: self.by_category.get(name, 0) for name in CONTEXT_CATEGORIES}


def measure(
    messages: Sequence[BaseMessage], model: str, window: int | None = None, tokens: Sequence[int] | None = None
) -> ContextUsage:
    """Token accounting of a conversation by category; pass `tokens` when already counted.

    Counted with pipeline.tokens.counting's one rule (the dashboard counts stored messages the
    same way); when a provider's exact counter is registered for the model, its total is the
    truth and the categories are scaled to it."""
    window = window or context_window(model)
    exact_total = None
    approximate = is_approximate(model)
    if tokens is None:
        counted = count_messages(messages, model)
        tokens, approximate = counted.per_message, counted.approximate
        exact_total = counted.tokens if counted.exact_total else None
    by_category = dict.fromkeys(CONTEXT_CATEGORIES, 0)
    for message, count in zip(messages, tokens, strict=True):
        by_category[category_of(message)] += count
    if exact_total is not None:
        by_category = scale_to_total(by_category, exact_total)
    used = sum(by_category.values())
    by_category["free"] = max(window - used, 0)
    return ContextUsage(model=model, window=window, by_category=by_category, messages=len(messages),
                        approximate=approximate)


def with_extra(usage: ContextUsage, category: str, tokens: int) -> ContextUsage:
    """`usage` plus `tokens` in `category` that are not messages (e.g. the skill listing the model
    reads in a tool description), taken from what is free."""
    by_category = {**usage.by_category, category: usage.by_category.get(category, 0) + tokens}
    by_category["free"] = max(usage.window - sum(v for k, v in by_category.items() if k != "free"), 0)
    return ContextUsage(model=usage.model, window=usage.window, by_category=by_category, messages=usage.messages)


def needs_compression(usage: ContextUsage, threshold: float | None = None) -> bool:
    """True above CTXLENS_COMPRESSION_THRESHOLD (0.8) of the window."""
    limit = runtime_settings().compression_threshold if threshold is None else threshold
    return usage.tokens > usage.window * limit


def tool_call_ids(message: BaseMessage) -> list[str]:
    """Ids of the calls an AIMessage makes (valid and invalid ones: both need an answer)."""
    if not isinstance(message, AIMessage):
        return []
    calls = [*message.tool_calls, *message.invalid_tool_calls]
    return [str(c.get("id")) for c in calls if c.get("id")]


def pairing_problems(messages: Sequence[BaseMessage]) -> list[str]:
    """Why a conversation would be refused by a provider API; empty when it is valid.

    Every ToolMessage must follow (in the same block of tool messages) the AIMessage that
    called it, and every tool call must have its ToolMessage before the next non-tool message.
    """
    problems: list[str] = []
    open_ids: set[str] = set()
    for index, message in enumerate(messages):
        if isinstance(message, ToolMessage):
            if message.tool_call_id not in open_ids:
                problems.append(f"message {index}: ToolMessage {message.tool_call_id!r} answers no open tool call")
            open_ids.discard(message.tool_call_id)
            continue
        if open_ids:
            problems.append(f"message {index}: tool calls {sorted(open_ids)} have no ToolMessage")
        open_ids = set(tool_call_ids(message))
    if open_ids:
        problems.append(f"end: tool calls {sorted(open_ids)} have no ToolMessage")
    return problems
