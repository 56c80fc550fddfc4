"""Context compression: TRUNCATE, EXTRACT and SUMMARIZE over LangChain messages.

The seeds' rules (design document §Context Management):
- nothing is compressed while the conversation has fewer than `min_messages` (20) messages;
- the current round and the `protect_rounds` (5) rounds before it are protected: EXTRACT and
  SUMMARIZE touch only older rounds (a round starts at each user message);
- HIGH-importance messages (tool observations the model still needs, skill instructions,
  earlier summaries) are never extracted, summarised or removed by EXTRACT and SUMMARIZE: only
  the assistant's thoughts and answers (MEDIUM) are shortened and old system notices (LOW)
  removed;
- TRUNCATE keeps the last `truncate_keep` (5) messages and removes what came before them;
- with strategy AUTO the strategy is chosen per compression (`choose`): EXTRACT below 30
  messages, SUMMARIZE from the LLM threshold of 50 messages on when its estimated cost fits what
  is left of the summariser's hourly budget, else EXTRACT. The estimated cost of every strategy
  (the seeds' CompressionCostEstimate: USD per 1,000 tokens compressed) is kept on the result
  and travels on the compression span, configured or chosen.

Invariants, which win over those rules where they collide (each tested, also as properties):
- an AIMessage with tool calls and its ToolMessages are kept, shortened or removed together,
  so the result stays valid for a provider API. TRUNCATE therefore keeps more than 5 messages
  when the 5th-last is a ToolMessage: its tool call and sibling observations stay with it;
- CRITICAL messages (user messages, failed tool calls) are never removed or changed, not even
  by TRUNCATE, and neither is the leading system prompt. TRUNCATE leaves the current round
  alone too (the model is working on its tool results), even when it is longer than 5 messages;
- a request must fit the model's window, or the provider refuses it. When a conversation is
  over the whole window (not just the threshold) after the rules above, the minimum message
  count, the protected rounds and the protection of HIGH messages give way: tool observations
  and thoughts are extracted, oldest first (earlier rounds before the current one), then whole
  units removed, until the conversation is under the threshold again. The newest tool call
  with its observations (while the model has not answered them: skill messages injected after
  them do not count), CRITICAL messages and the system prompt are never touched;
- the result is never larger than the input (nothing changes when nothing can be saved).

Compression works oldest first and stops once the conversation is under the target,
`TARGET_FACTOR` × the threshold of the window (60 % with the default 0.8), so the next few turns
fit without compressing again (TRUNCATE, as the seeds say, always cuts down to its tail).

- TRUNCATE removes old units and leaves a one-line notice.
- EXTRACT replaces old messages by extracts (the head of their text, tool calls kept) and
  drops old system notices.
- SUMMARIZE extracts now and asks a `Summariser` (any LangChain chat model) for a summary of
  the originals in the background; `apply_summaries` swaps the extracts for the cached summary
  from the next round on, placed where the last of them was (after every question they
  answer). Only whole units that were extracted are summarised (an answer without tool calls,
  or, past the window, a tool call with all its observations), so swapping the summary in never
  separates a tool call from its observation.
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
    MessageTokens,
    category_of,
    count_on_measure_scale,
    importance_of,
    marker,
    measure,
    needs_compression,
    tool_call_ids,
    with_marker,
)
from pipeline.runtime.summariser import Summariser
from pipeline.tokens.counting import context_window

TARGET_FACTOR = 0.75
EXTRACT_CHARS = 240
MIN_SUMMARY_TOKENS = 16
MIN_MESSAGES = 20  # the seeds: no compression below 20 messages
PROTECT_ROUNDS = 5  # the seeds: the current round and the 5 before it are left alone
TRUNCATE_KEEP = 5  # the seeds: TRUNCATE keeps the last 5 messages
AUTO_EXTRACT_BELOW = 30  # the seeds' automatic choice: EXTRACT below 30 messages …
LLM_THRESHOLD = 50  # … SUMMARIZE from 50 messages on, if the estimated cost fits the hour's budget
Keep = Callable[[BaseMessage], bool]


class CompressionStrategy(str, Enum):
    TRUNCATE = "truncate"
    EXTRACT = "extract"
    SUMMARIZE = "summarize"
    AUTO = "auto"  # a setting only: every compression records the strategy `choose` picked


# The seeds' CompressionCostEstimate: estimated USD per 1,000 tokens of context compressed.
COST_PER_1K_TOKENS = {
    CompressionStrategy.TRUNCATE: 0.0,
    CompressionStrategy.EXTRACT: 0.001,
    CompressionStrategy.SUMMARIZE: 0.003,
}


def estimate_costs(tokens: int, summarize_per_1k: float | None = None) -> dict[str, float]:
    """Estimated USD of compressing `tokens` with each strategy (SUMMARIZE at the summariser's rate)."""
    rates = {**COST_PER_1K_TOKENS}
    if summarize_per_1k is not None:
        rates[CompressionStrategy.SUMMARIZE] = summarize_per_1k
    return {strategy.value: round(tokens / 1000 * rate, 6) for strategy, rate in rates.items()}


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
    estimated_costs: dict[str, float] = field(default_factory=dict)  # strategy -> estimated USD
    selection: str = ""  # why this strategy: "configured", or the automatic choice's reason
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


def newest_tool_unit(messages: Sequence[BaseMessage], units: list[list[int]]) -> list[int] | None:
    """The unit of the newest AIMessage that calls tools (with its ToolMessages) while the model
    has not read its results yet: no AIMessage follows it, only skill, user or system messages."""
    for unit in reversed(units):
        if isinstance(messages[unit[0]], AIMessage):
            return unit if tool_call_ids(messages[unit[0]]) else None
    return None


def round_numbers(messages: Sequence[BaseMessage]) -> list[int]:
    """The round of each message: a round starts at each user message (not at injected skill
    messages or summaries, which are HumanMessages too); what precedes the first one is -1."""
    numbers: list[int] = []
    current = -1
    for message in messages:
        if isinstance(message, HumanMessage) and category_of(message) == "user":
            current += 1
        numbers.append(current)
    return numbers


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
    """Compresses one conversation's messages for one model's window (rules: module docstring)."""

    def __init__(
        self,
        model: str,
        *,
        window: int | None = None,
        threshold: float | None = None,
        strategy: CompressionStrategy | str = CompressionStrategy.AUTO,
        summariser: Summariser | None = None,
        extract_chars: int = EXTRACT_CHARS,
        min_messages: int = MIN_MESSAGES,
        protect_rounds: int = PROTECT_ROUNDS,
        truncate_keep: int = TRUNCATE_KEEP,
        llm_threshold: int = LLM_THRESHOLD,
    ) -> None:
        self.model = model
        self.window = window or context_window(model)
        self.threshold = runtime_settings().compression_threshold if threshold is None else threshold
        self.strategy = CompressionStrategy(strategy)
        self.summariser = summariser
        self.extract_chars = extract_chars
        self.min_messages = min_messages
        self.protect_rounds = protect_rounds
        self.truncate_keep = truncate_keep
        self.llm_threshold = llm_threshold

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

    def estimate_costs(self, tokens: int) -> dict[str, float]:
        return estimate_costs(tokens, self.summariser.cost_per_1k_tokens if self.summariser else None)

    def choose(
        self, message_count: int, costs: dict[str, float], strategy: CompressionStrategy | str | None = None
    ) -> tuple[CompressionStrategy, str]:
        """The strategy for this compression and why: the one asked for, else the automatic choice
        (the seeds' `_select_compression_strategy`, with the hour's budget read from the summariser)."""
        wanted = CompressionStrategy(strategy or self.strategy)
        if wanted is not CompressionStrategy.AUTO:
            return wanted, "configured"
        if message_count < AUTO_EXTRACT_BELOW:
            return CompressionStrategy.EXTRACT, f"auto: {message_count} messages, under {AUTO_EXTRACT_BELOW}"
        if message_count < self.llm_threshold:
            return CompressionStrategy.EXTRACT, f"auto: {message_count} messages, under the LLM threshold of {self.llm_threshold}"
        if self.summariser is None:
            return CompressionStrategy.EXTRACT, "auto: no summariser configured"
        cost = costs[CompressionStrategy.SUMMARIZE.value]
        left = max(self.summariser.max_cost_per_hour - self.summariser.spent_this_hour(), 0.0)
        if cost < left:
            return CompressionStrategy.SUMMARIZE, (
                f"auto: {message_count} messages ≥ {self.llm_threshold}; summary ≈ ${cost:.4f} "
                f"within the ${left:.4f} left of this hour's budget"
            )
        return CompressionStrategy.EXTRACT, (
            f"auto: summary ≈ ${cost:.4f} is over the ${left:.4f} left of this hour's budget"
        )

    def compress(
        self, messages: Sequence[BaseMessage], strategy: CompressionStrategy | str | None = None, *,
        keep: Keep | None = None,
    ) -> CompressionResult | None:
        """Compress by the rules of the module docstring; None when nothing could be saved.

        Messages for which `keep(message)` is true are treated as CRITICAL this time (the agent
        keeps the instructions of skills active in the current round that way).
        """
        started = time.time_ns()
        before = list(messages)
        counted = count_on_measure_scale(before, self.model)  # the scale `prepare` decided on
        tokens = counted.per_message
        total = counted.total
        over_window = total > self.window
        if len(before) < self.min_messages and not over_window:
            return None
        costs = self.estimate_costs(total)
        chosen, selection = self.choose(len(before), costs, strategy)
        usage_before = measure(before, self.model, self.window, tokens)
        slots: list[BaseMessage | None] = list(before)
        units = group_units(before)
        importance = [MessageImportance.CRITICAL if keep and keep(m) else importance_of(m) for m in before]
        rounds = round_numbers(before)
        current = rounds[-1] if rounds else -1
        pinned = 0
        while pinned < len(before) and isinstance(before[pinned], SystemMessage):
            pinned += 1
        # Units the rules may touch: not the leading system prompt, not the current round, and
        # (EXTRACT, SUMMARIZE) not the protected rounds or (TRUNCATE) not the last messages.
        movable = [u for u in units if u[0] >= pinned and rounds[u[0]] != current]
        if chosen is CompressionStrategy.TRUNCATE:
            tail_start = max(len(before) - self.truncate_keep, 0)
            candidates = [u for u in movable if u[-1] < tail_start]
        else:
            candidates = [u for u in movable if rounds[u[0]] < current - self.protect_rounds]
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

        def critical(unit: list[int]) -> bool:
            return any(importance[i] is MessageImportance.CRITICAL for i in unit)

        already_short: set[int] = set()  # tried, but an extract would not be smaller

        def shorten(i: int) -> int:
            shorter = self._extract(before[i], tokens[i])
            count = counted.count(shorter, self.model)
            if count >= tokens[i]:
                already_short.add(i)
                return 0
            saved = tokens[i] - count
            slots[i], tokens[i] = shorter, count
            summarised.append(i)
            return saved

        notice_at: int | None = None
        if chosen is CompressionStrategy.TRUNCATE:
            for unit in candidates:
                if not critical(unit):
                    notice_at = unit[0] if notice_at is None else notice_at
                    total -= drop(unit)
        else:
            for unit in candidates:
                if total <= self.target:
                    break
                for i in unit:
                    if importance[i] in (MessageImportance.CRITICAL, MessageImportance.HIGH):
                        continue  # never compressed: user messages, errors, observations, skills, summaries
                    if marker(before[i]).get("compressed"):
                        continue
                    if importance[i] is MessageImportance.LOW and len(unit) == 1:
                        total -= drop(unit)
                        continue
                    total -= shorten(i)

        if total > self.window:  # the request would be refused: the window wins over the rules
            # Oldest first, so earlier rounds go before the current one; never the newest tool call
            # with its observations, the results the model is about to read (skill messages may
            # follow them), nor the last unit.
            newest = newest_tool_unit(before, units)
            last_resort = [u for u in units[:-1] if u[0] >= pinned and u is not newest]
            for unit in last_resort:
                if total <= int(self.window * self.threshold):
                    break
                for i in unit:
                    if slots[i] is not None and importance[i] is not MessageImportance.CRITICAL \
                            and not marker(before[i]).get("compressed") and i not in summarised:
                        total -= shorten(i)
            for unit in last_resort:
                if total <= int(self.window * self.threshold):
                    break
                if not critical(unit) and any(slots[i] is not None for i in unit):
                    notice_at = unit[0] if notice_at is None else notice_at
                    total -= drop(unit)

        if chosen is CompressionStrategy.SUMMARIZE and self.summariser is not None:
            marked = [  # whole units, each shortened as far as it goes: the summary can stand for them
                i for unit in units
                if not critical(unit) and any(i in summarised for i in unit)
                and all(i in summarised or i in already_short for i in unit)
                and not any(marker(before[i]).get("summary_key") for i in unit)
                for i in unit
            ]
            if marked:
                key = summary_key([slots[i] for i in marked])  # type: ignore[misc]
                for i in marked:
                    slots[i] = with_marker(slots[i], summary_key=key)  # type: ignore[arg-type]
                result_status = self.summariser.request(key, [before[i] for i in marked])

        after = [m for m in slots if m is not None]
        after_tokens = [t for m, t in zip(slots, tokens, strict=True) if m is not None]
        if dropped:
            notice = HumanMessage(
                content=f"[Context compressed: {len(dropped)} earlier messages were removed to fit the window.]",
                additional_kwargs={"ctxlens": {"category": SUMMARY_CATEGORY, "importance": "high"}},
            )
            cost = counted.count(notice, self.model)
            if notice_at is not None and cost < usage_before.tokens - total:
                position = sum(1 for m in slots[:notice_at] if m is not None)
                after.insert(position, notice)
                after_tokens.insert(position, cost)
                total += cost
        if total >= usage_before.tokens:
            return None
        return CompressionResult(
            strategy=chosen, before=before, after=after, usage_before=usage_before,
            usage_after=measure(after, self.model, self.window, after_tokens), dropped=sorted(dropped),
            summarised=sorted(summarised), summary_status=result_status, estimated_costs=costs,
            selection=selection, started_ns=started, ended_ns=time.time_ns(),
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
        counted = count_on_measure_scale(before, self.model)
        tokens = counted.per_message
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
            message = self._summary_message(key, text, len(indexes), sum(tokens[i] for i in indexes), counted)
            if message is None:
                continue
            summaries.append(_text(message))
            replace.update(dict.fromkeys(indexes))
            # At the last message it stands for: never before a user message whose answer it summarises.
            replace[indexes[-1]] = message
        if not summaries:
            return None
        after_tokens = [counted.count(replace[i], self.model) if replace.get(i) is not None else t
                        for i, t in enumerate(tokens) if i not in replace or replace[i] is not None]
        after = [replace[i] if i in replace else m for i, m in enumerate(before)]
        after = [m for m in after if m is not None]
        return CompressionResult(
            strategy=CompressionStrategy.SUMMARIZE, before=before, after=after,
            usage_before=measure(before, self.model, self.window, tokens),
            usage_after=measure(after, self.model, self.window, after_tokens), summarised=sorted(replace),
            summary="\n\n".join(summaries), summary_status="applied", selection="the background summary is ready",
            started_ns=started, ended_ns=time.time_ns(),
        )

    def _summary_message(
        self, key: str, text: str, count: int, budget: int, counted: MessageTokens
    ) -> HumanMessage | None:
        """The summary as one message, cut to fit `budget` tokens; None if it cannot save any."""
        marker_fields = {"category": SUMMARY_CATEGORY, "importance": "high", "summary_of": key}
        for limit in (len(text), *(int(len(text) * f) for f in (0.5, 0.25, 0.1))):
            body = text if limit >= len(text) else text[:limit].rstrip() + " …"
            message = HumanMessage(
                content=f"[Summary of {count} earlier messages]\n{body}", additional_kwargs={"ctxlens": marker_fields}
            )
            tokens = counted.count(message, self.model)
            if tokens < budget and tokens >= MIN_SUMMARY_TOKENS:
                return message
        return None
