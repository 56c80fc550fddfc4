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
class Round:
    """What a round's LLM spans tell about the models its tools are counted for."""

    requested: dict[str, str | None] = field(default_factory=dict)  # tool call id -> requesting model
    latest: tuple[datetime, str | None] | None = None  # (start, model) of the latest-started call

    def add(self, call: NormalisedSpan) -> None:
        """Take in one LLM span (spans in start order: an id asked for twice is the first asker's)."""
        for asked in requested_ids(call):
            self.requested.setdefault(asked, call.llm["model"])
        if self.latest is None or call.started_at >= self.latest[0]:
            self.latest = (call.started_at, call.llm["model"])

    def absorb(self, later: Round) -> None:
        """Take in what a later batch's spans of the round tell."""
        for asked, model in later.requested.items():
            self.requested.setdefault(asked, model)
        if later.latest is not None and (self.latest is None or later.latest[0] >= self.latest[0]):
            self.latest = later.latest


def requested_ids(call: NormalisedSpan) -> list[str]:
    """The tool call ids an LLM span asks for, as a tool span's id is stored (text, cut to size)."""
    return [key for part in tool_calls_of(call.llm["output_messages"] or []) if (key := call_id(part.get("id")))]


def rounds_of(calls: Iterable[NormalisedSpan]) -> dict[tuple[str, str], Round]:
    """The LLM spans' rounds, by (trace_id, round key)."""
    rounds: dict[tuple[str, str], Round] = defaultdict(Round)
    for call in sorted(calls, key=lambda c: c.started_at):
        rounds[(call.record.trace_id, call.round_key)].add(call)
    return rounds


class RecentCalls:
    """The models of the LLM spans this process prepared lately, by (trace_id, round key), so that a
    tool arriving in a later batch than its call is counted up front too. Forgotten wholesale past
    `size` rounds or `size` × 8 requested ids; another worker's calls are unknown here (their tools
    go to the deferred run)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self.clear()

    def add(self, rounds: dict[tuple[str, str], Round]) -> None:
        for key, later in rounds.items():
            self.ids += len(later.requested)
            if self.ids > self.size * 8 or (key not in self.rounds and len(self.rounds) >= self.size):
                self.clear()  # a new dict: a thread reading the old one is not disturbed
                self.ids = len(later.requested)
            self.rounds.setdefault(key, Round()).absorb(later)

    def clear(self) -> None:
        self.rounds: dict[tuple[str, str], Round] = {}
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
    here = rounds_of(c for group in calls.values() for c in group)
    out: dict[tuple[str, str], Precount] = {}
    for tool in tools:
        round_key = (tool.record.trace_id, tool.round_key)
        asked_as = tool.tool["tool_call_id"]
        batch, before = here.get(round_key), recent_calls.rounds.get(round_key)  # before: earlier batches'
        if asked_as and batch is not None and asked_as in batch.requested:
            model = batch.requested[asked_as]
        elif asked_as and before is not None and asked_as in before.requested:
            model = before.requested[asked_as]
        elif earlier := [c for c in calls.get(round_key, ()) if c.started_at <= tool.started_at]:
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
    recent_calls.add(here)
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
