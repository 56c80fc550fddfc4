"""Tool observation tokens counted before the ingest transaction, when the model is known.

A tool call's observation is counted for the model of the LLM call that asked for it, and which
call that is, linking decides inside the transaction (pipeline.ingest.write.linking). Counted in
the deferred run instead (pipeline.ingest.write.deferred), every tool span cost a second
transaction: the rows read again, updated, their rollups rewritten.

`precount` (run by `prepare_spans`: CPU only, no database) guesses the call — the LLM span of the
same trace and round that requested the tool's call id, else the last one started before it —
from the batch, and else from the LLM spans this process saw in earlier batches (`RecentCalls`:
an agent exporting spans as they end sends its tools after the call that asked for them), and
counts the observation for that model. `apply` (in the transaction, after linking) keeps the
count only when the call the tool was linked to (new or stored) counts the same way (same
encoding, margin and approximation) and the observation is the one counted; any other tool call
stays pending for the deferred run, as before. A wrong guess costs a count, never a wrong
figure: both paths count with `count_observation`.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from pipeline.ingest.normalise.messages import call_id, tool_calls_of
from pipeline.ingest.normalise.span import NormalisedSpan
from pipeline.models import LLMCall, ToolCall
from pipeline.tokens.counting import count_tokens_bounded, model_profile

logger = logging.getLogger(__name__)

# Longer observations are left to the deferred run: counting them (about 0.1 s per 100 KB) would
# hold up the request's reply, and a re-sent batch would pay for it again.
MAX_PRECOUNT_CHARS = 32_768


@dataclass(frozen=True)
class Precount:
    observation: str  # the text counted
    key: tuple[str, int, bool]  # how it was counted (`counting_key`)
    tokens: int
    estimated: bool
    approximate: bool


def counting_key(model: str | None) -> tuple[str, int, bool]:
    """What an observation's count depends on besides its text: models with equal keys count alike."""
    profile = model_profile(model)
    return profile.encoding_name, profile.margin_scaled, profile.approximate


def count_observation(observation: str, model: str | None) -> tuple[int, bool, bool]:
    """(observation_tokens, tokens_estimated, tokens_approximate) of a tool call's observation,
    counted for `model` (the model of the LLM call that requested the tool, None without one)."""
    tokens, estimated = count_tokens_bounded(observation, model)
    return tokens, estimated, estimated or model_profile(model).approximate


@dataclass
class _Round:
    """What a round's LLM spans tell about the models its tools are counted for."""

    requested: dict[str, str | None] = field(default_factory=dict)  # tool call id -> requesting model
    latest: tuple[datetime, str | None] | None = None  # (start, model) of the latest-started call


def requested_ids(call: NormalisedSpan) -> list[str]:
    """The tool call ids an LLM span asks for, as a tool span's id is stored (text, cut to size)."""
    return [key for part in tool_calls_of(call.llm["output_messages"] or []) if (key := call_id(part.get("id")))]


class RecentCalls:
    """The models of the LLM spans this process prepared lately, by (trace_id, round key), so that a
    tool arriving in a later batch than its call is counted up front too. Forgotten wholesale past
    `size` rounds or `size` × 8 requested ids; another worker's calls are unknown here (their tools
    go to the deferred run)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self.clear()

    def add(self, calls: Iterable[NormalisedSpan]) -> None:
        for call in sorted(calls, key=lambda c: c.started_at):
            key, ids = (call.record.trace_id, call.round_key), requested_ids(call)
            self.ids += len(ids)
            if self.ids > self.size * 8 or (key not in self.rounds and len(self.rounds) >= self.size):
                self.clear()  # a new dict: a thread reading the old one is not disturbed
                self.ids = len(ids)
            seen = self.rounds.setdefault(key, _Round())
            for asked in ids:
                seen.requested.setdefault(asked, call.llm["model"])
            if seen.latest is None or call.started_at >= seen.latest[0]:
                seen.latest = (call.started_at, call.llm["model"])

    def clear(self) -> None:
        self.rounds: dict[tuple[str, str], _Round] = {}
        self.ids = 0


recent_calls = RecentCalls()


def precount(spans: Iterable[NormalisedSpan]) -> dict[tuple[str, str], Precount]:
    """Counts of the batch's pending tool observations, by (trace_id, span_id), for the model of
    the LLM span the tool is expected to be linked to (of the batch, else seen before); tools with
    no such span are left out."""
    calls: dict[tuple[str, str], list[NormalisedSpan]] = defaultdict(list)
    tools: list[NormalisedSpan] = []
    for s in spans:
        if s.llm is not None and s.in_round:
            calls[(s.record.trace_id, s.round_key)].append(s)
        elif (s.tool is not None and s.in_round and s.tool["tokens_pending"]
              and len(s.tool["observation"] or "") <= MAX_PRECOUNT_CHARS):
            tools.append(s)
    out: dict[tuple[str, str], Precount] = {}
    requested: dict[tuple[str, str], dict[str, str | None]] = {}
    for tool in tools:
        round_key = (tool.record.trace_id, tool.round_key)
        group = calls.get(round_key, [])
        if round_key not in requested:
            requested[round_key] = {}
            for call in sorted(group, key=lambda c: c.started_at):
                for key in requested_ids(call):
                    requested[round_key].setdefault(key, call.llm["model"])
        asked_as = tool.tool["tool_call_id"]
        before = recent_calls.rounds.get(round_key)  # earlier batches' calls
        if asked_as and asked_as in requested[round_key]:
            model = requested[round_key][asked_as]
        elif asked_as and before is not None and asked_as in before.requested:
            model = before.requested[asked_as]
        elif earlier := [c for c in group if c.started_at <= tool.started_at]:
            model = max(earlier, key=lambda c: c.started_at).llm["model"]
        elif before is not None and before.latest is not None:
            model = before.latest[1]
        else:
            continue
        observation = tool.tool["observation"]
        try:
            counted = count_observation(observation, model)
        except Exception:  # the deferred run tries again, and stores an estimate if it fails too
            logger.warning("could not count tool observation %s/%s up front", tool.record.trace_id,
                           tool.record.span_id, exc_info=True)
            continue
        out[(tool.record.trace_id, tool.record.span_id)] = Precount(observation, counting_key(model), *counted)
    recent_calls.add(c for group in calls.values() for c in group)
    return out


def without_logged_traces(counts: dict[tuple[str, str], Precount],
                          logged: set[str]) -> dict[tuple[str, str], Precount]:
    """The counts of tools outside `logged` traces: a trace's event logs rewrite its calls' output
    messages in the transaction (pipeline.ingest.write.logs), after which linking may give a tool
    to another call than the one its count was kept for; those tools are counted in the deferred run."""
    return {key: counted for key, counted in counts.items() if key[0] not in logged} if logged else counts


def apply(tools: Iterable[ToolCall], calls: Iterable[LLMCall], counts: dict[tuple[str, str], Precount]) -> None:
    """Fill the counts of linked, unsaved `tools` whose precount holds for the call each was linked
    to (one of `calls`, the batch's new LLM calls and the stored ones linking read, with their
    model); the others stay pending."""
    if not counts:
        return
    keys: dict[int, tuple] = {}
    models = {call.pk: call.model for call in calls}
    for tool in tools:
        counted = counts.get((tool.trace_id, tool.span_id))
        if counted is None or not tool.tokens_pending or tool.llm_call_id not in models:
            continue
        if tool.observation != counted.observation:
            continue
        if tool.llm_call_id not in keys:
            keys[tool.llm_call_id] = counting_key(models[tool.llm_call_id])
        if keys[tool.llm_call_id] == counted.key:
            tool.observation_tokens, tool.tokens_estimated, tool.tokens_approximate = (
                counted.tokens, counted.estimated, counted.approximate)
            tool.tokens_pending = False
