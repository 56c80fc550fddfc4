"""Context compression: TRUNCATE, EXTRACT and SUMMARIZE over LangChain messages.

Invariants (each tested, also as properties):
- an AIMessage with tool calls and its ToolMessages are kept, shortened or removed together,
  so the result stays valid for a provider API;
- CRITICAL messages (user messages, failed tool calls) are never removed or changed;
- the result is never larger than the input (nothing changes when nothing can be saved).

What is protected: the leading system prompt, every unit holding a CRITICAL message (its other
messages may still be shortened), and the newest `keep_last` units. Compression works oldest
first and stops once the conversation is under the target, `TARGET_FACTOR` × the threshold of
the window (60 % with the default 0.8), so the next few turns fit without compressing again.

- TRUNCATE removes the oldest units and leaves a one-line notice.
- EXTRACT replaces old messages by extracts (the head of their text, tool calls kept), drops
  old system notices, and removes the oldest units only while the extracts leave the
  conversation over the threshold.
- SUMMARIZE extracts now and asks a `Summariser` (any LangChain chat model) for a summary of
  the originals in the background; `apply_summaries` swaps the extracts for the cached summary
  from the next round on.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from pipeline.runtime.settings import runtime_settings
from pipeline.runtime.context import (
    SUMMARY_CATEGORY,
    ContextUsage,
    MessageImportance,
    importance_of,
    marker,
    measure,
    message_tokens,
    needs_compression,
    tool_call_ids,
    with_marker,
)
from pipeline.runtime.summariser import Summariser
from pipeline.tokens.counting import context_window, count_message_tokens

TARGET_FACTOR = 0.75
EXTRACT_CHARS = 240
MIN_SUMMARY_TOKENS = 16
Keep = Callable[[BaseMessage], bool]


class CompressionStrategy(str, Enum):
    TRUNCATE = "truncate"
    EXTRACT = "extract"
    SUMMARIZE = "summarize"


@dataclass
class CompressionResult:
    """One compression: the messages before and after, token accounting, and what was lost."""

    strategy: CompressionStrategy
    before: list[BaseMessage]
    after: list[BaseMessage]
    usage_before: ContextUsage
    usage_after: ContextUsage
    dropped: list[int] = field(default_factory=list)  # indexes into `before`
    summarised: list[int] = field(default_factory=list)  # indexes into `before`, replaced by extracts/summary
    summary: str = ""
    summary_status: str = ""  # SUMMARIZE: scheduled | cached | pending | cost_cap | applied
    started_ns: int = 0
    ended_ns: int = 0

    @property
    def tokens_before(self) -> int:
        return self.usage_before.tokens

    @property
    def tokens_after(self) -> int:
        return self.usage_after.tokens


def group_units(messages: Sequence[BaseMessage]) -> list[list[int]]:
    """Indexes grouped into units: an AIMessage with its ToolMessages, or one message alone."""
    units: list[list[int]] = []
    owner: dict[str, int] = {}
    for index, message in enumerate(messages):
        call_id = getattr(message, "tool_call_id", None)
        if call_id is not None and call_id in owner:
            units[owner.pop(call_id)].append(index)
            continue
        units.append([index])
        for call in tool_call_ids(message):
            owner[call] = len(units) - 1
    return units


def extract_text(text: str, limit: int = EXTRACT_CHARS) -> str:
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    return f"{flat[:limit]} … [extract of {len(text)} characters]"


def _text(message: BaseMessage) -> str:
    return str(message.text)  # the text blocks of a list content, joined


def summary_key(messages: Sequence[BaseMessage]) -> str:
    identity = [[m.type, _text(m), getattr(m, "tool_call_id", None), tool_call_ids(m)] for m in messages]
    return hashlib.sha256(json.dumps(identity, ensure_ascii=False).encode()).hexdigest()[:32]


class ContextCompressor:
    """Compresses one conversation's messages for one model's window."""

    def __init__(
        self,
        model: str,
        *,
        window: int | None = None,
        threshold: float | None = None,
        strategy: CompressionStrategy | str = CompressionStrategy.EXTRACT,
        summariser: Summariser | None = None,
        keep_last: int = 2,
        extract_chars: int = EXTRACT_CHARS,
    ) -> None:
        self.model = model
        self.window = window or context_window(model)
        self.threshold = runtime_settings().compression_threshold if threshold is None else threshold
        self.strategy = CompressionStrategy(strategy)
        self.summariser = summariser
        self.keep_last = keep_last
        self.extract_chars = extract_chars

    @property
    def target(self) -> int:
        return int(self.window * self.threshold * TARGET_FACTOR)

    def usage(self, messages: Sequence[BaseMessage]) -> ContextUsage:
        return measure(messages, self.model, self.window)

    def needs_compression(self, usage: ContextUsage) -> bool:
        return needs_compression(usage, self.threshold)

    def prepare(
        self, messages: list[BaseMessage], *, round_start: bool = False, keep: Keep | None = None
    ) -> tuple[list[BaseMessage], list[CompressionResult]]:
        """What the agent calls before each model call: ready summaries (at a round's start),
        then a compression if the window is over the threshold. `keep` as for `compress`."""
        results: list[CompressionResult] = []
        if round_start and self.summariser is not None:
            applied = self.apply_summaries(messages)
            if applied:
                results.append(applied)
                messages = applied.after
        if self.needs_compression(self.usage(messages)):
            compressed = self.compress(messages, keep=keep)
            if compressed:
                results.append(compressed)
                messages = compressed.after
        return messages, results

    def compress(
        self, messages: Sequence[BaseMessage], strategy: CompressionStrategy | str | None = None, *,
        keep: Keep | None = None,
    ) -> CompressionResult | None:
        """Compress down towards the target; None when nothing could be saved.

        Messages for which `keep(message)` is true are treated as CRITICAL this time (the agent
        keeps the instructions of skills active in the current round that way).
        """
        strategy = CompressionStrategy(strategy or self.strategy)
        started = time.time_ns()
        before = list(messages)
        tokens = message_tokens(before, self.model)
        usage_before = measure(before, self.model, self.window, tokens)
        slots: list[BaseMessage | None] = list(before)
        units = group_units(before)
        importance = [MessageImportance.CRITICAL if keep and keep(m) else importance_of(m) for m in before]
        pinned = 0
        while pinned < len(before) and isinstance(before[pinned], SystemMessage):
            pinned += 1
        tail = set(range(max(len(units) - self.keep_last, 0), len(units)))
        candidates = [u for n, u in enumerate(units) if n not in tail and u[0] >= pinned]
        total = sum(tokens)
        dropped: list[int] = []
        summarised: list[int] = []
        result_status = ""

        def drop(unit: list[int]) -> int:
            saved = 0
            for i in unit:
                if slots[i] is not None:
                    saved += tokens[i]
                    slots[i] = None
                    dropped.append(i)
                    if i in summarised:
                        summarised.remove(i)
            return saved

        if strategy is not CompressionStrategy.TRUNCATE:
            marked: list[int] = []
            for unit in candidates:
                if total <= self.target:
                    break
                critical = any(importance[i] is MessageImportance.CRITICAL for i in unit)
                for i in unit:
                    if importance[i] is MessageImportance.CRITICAL or marker(before[i]).get("compressed"):
                        continue
                    if importance[i] is MessageImportance.LOW and len(unit) == 1:
                        total -= drop(unit)
                        continue
                    shorter = self._extract(before[i], tokens[i])
                    count = count_message_tokens(shorter, self.model)
                    if count < tokens[i]:
                        slots[i], total, tokens[i] = shorter, total - tokens[i] + count, count
                        summarised.append(i)
                pending = any(marker(before[i]).get("summary_key") for i in unit)
                if strategy is CompressionStrategy.SUMMARIZE and not critical and not pending:
                    marked.extend(i for i in unit if slots[i] is not None)
            if strategy is CompressionStrategy.SUMMARIZE and marked and self.summariser is not None:
                key = summary_key([slots[i] for i in marked])  # type: ignore[misc]
                for i in marked:
                    slots[i] = with_marker(slots[i], summary_key=key)  # type: ignore[arg-type]
                result_status = self.summariser.request(key, [before[i] for i in marked])

        # Removing is lossy: TRUNCATE removes down to the target, the others only while the
        # extracts leave the conversation over the threshold.
        limit = self.target if strategy is CompressionStrategy.TRUNCATE else int(self.window * self.threshold)
        notice_at: int | None = None
        for unit in candidates:
            if total <= limit:
                break
            if not any(importance[i] is MessageImportance.CRITICAL for i in unit):
                notice_at = unit[0] if notice_at is None else notice_at
                total -= drop(unit)

        after = [m for m in slots if m is not None]
        after_tokens = [t for m, t in zip(slots, tokens, strict=True) if m is not None]
        if dropped:
            notice = HumanMessage(
                content=f"[Context compressed: {len(dropped)} earlier messages were removed to fit the window.]",
                additional_kwargs={"ctxlens": {"category": SUMMARY_CATEGORY, "importance": "high"}},
            )
            cost = count_message_tokens(notice, self.model)
            if notice_at is not None and cost < usage_before.tokens - total:
                position = sum(1 for m in slots[:notice_at] if m is not None)
                after.insert(position, notice)
                after_tokens.insert(position, cost)
                total += cost
        if total >= usage_before.tokens:
            return None
        return CompressionResult(
            strategy=strategy, before=before, after=after, usage_before=usage_before,
            usage_after=measure(after, self.model, self.window, after_tokens), dropped=sorted(dropped),
            summarised=sorted(summarised), summary_status=result_status, started_ns=started, ended_ns=time.time_ns(),
        )

    def _extract(self, message: BaseMessage, tokens: int) -> BaseMessage:
        original = marker(message).get("original_tokens") or tokens
        content = extract_text(_text(message), self.extract_chars)
        update: dict = {"content": content}
        if isinstance(message, AIMessage):
            update["response_metadata"] = {}
        copy = message.model_copy(update=update)
        return with_marker(copy, category=SUMMARY_CATEGORY, compressed="extract", original_tokens=original)

    def apply_summaries(self, messages: Sequence[BaseMessage]) -> CompressionResult | None:
        """Swap extracts marked for a background summary for that summary, once it is cached."""
        if self.summariser is None:
            return None
        started = time.time_ns()
        before = list(messages)
        tokens = message_tokens(before, self.model)
        groups: dict[str, list[int]] = {}
        for index, message in enumerate(before):
            key = marker(message).get("summary_key")
            if key:
                groups.setdefault(key, []).append(index)
        replace: dict[int, BaseMessage | None] = {}
        summaries: list[str] = []
        for key, indexes in groups.items():
            text = self.summariser.cached(key)
            if not text:
                continue
            message = self._summary_message(key, text, len(indexes), sum(tokens[i] for i in indexes))
            if message is None:
                continue
            summaries.append(_text(message))
            replace.update(dict.fromkeys(indexes))
            replace[indexes[0]] = message
        if not summaries:
            return None
        after = [replace[i] if i in replace else m for i, m in enumerate(before)]
        after = [m for m in after if m is not None]
        return CompressionResult(
            strategy=CompressionStrategy.SUMMARIZE, before=before, after=after,
            usage_before=measure(before, self.model, self.window, tokens),
            usage_after=measure(after, self.model, self.window), summarised=sorted(replace),
            summary="\n\n".join(summaries), summary_status="applied", started_ns=started, ended_ns=time.time_ns(),
        )

    def _summary_message(self, key: str, text: str, count: int, budget: int) -> HumanMessage | None:
        """The summary as one message, cut to fit `budget` tokens; None if it cannot save any."""
        marker_fields = {"category": SUMMARY_CATEGORY, "importance": "high", "summary_of": key}
        for limit in (len(text), *(int(len(text) * f) for f in (0.5, 0.25, 0.1))):
            body = text if limit >= len(text) else text[:limit].rstrip() + " …"
            message = HumanMessage(
                content=f"[Summary of {count} earlier messages]\n{body}", additional_kwargs={"ctxlens": marker_fields}
            )
            tokens = count_message_tokens(message, self.model)
            if tokens < budget and tokens >= MIN_SUMMARY_TOKENS:
                return message
        return None
