"""What one call adds to its rollups, and Figures: the sums that add and subtract.

A conversation is rolled up too (kind "conversation", name ""): it counts once, in the bucket of
its last activity, so the conversations active since a moment — the overview's count — are the
rollups from that moment on. When its last activity moves, its count moves with it.

A call's contribution is computed from its row (a saved or unsaved LLMCall / ToolCall, or the
values of COLUMNS read from the database), so the same function serves ingest, updates,
deletes, the rebuild and the raw rows at a window's edges: whatever path a row takes, it
counts the same.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from pipeline.insight.levels import LEVELS
from pipeline.models import CompressionEvent, Conversation, LLMCall, ToolCall
from pipeline.rollups import sketch

TOOL, MODEL, COMPRESSION, CONVERSATION = "tool", "model", "compression", "conversation"
KIND_OF = {ToolCall: TOOL, LLMCall: MODEL, CompressionEvent: COMPRESSION, Conversation: CONVERSATION}
MODEL_OF = {TOOL: ToolCall, MODEL: LLMCall, COMPRESSION: CompressionEvent, CONVERSATION: Conversation}
NAME_COLUMN = {TOOL: "tool_name", MODEL: "model", COMPRESSION: "strategy"}  # conversations: one name, ""
TIME_COLUMN = {TOOL: "started_at", MODEL: "started_at", COMPRESSION: "occurred_at", CONVERSATION: "last_activity_at"}
COLUMNS = {
    TOOL: ("tool_name", "started_at", "duration_ms", "success", "error_type", "retry_count", "cache_hit",
           "observation_tokens", "input_tokens", "context_tokens", "context_carries", "context_cost_usd",
           "tokens_at_level"),
    MODEL: ("model", "started_at", "duration_ms", "status", "error_type", "input_tokens", "output_tokens",
            "cache_read_tokens", "cache_write_tokens", "reasoning_tokens", "cost_usd"),
    COMPRESSION: ("strategy", "occurred_at", "tokens_before", "tokens_after"),
    CONVERSATION: ("last_activity_at",),
}
DECIMALS = frozenset({"cost_usd", "context_cost_usd"})  # kept as decimal strings in the JSON sums


@dataclass
class Figures:
    """Calls, sums by field, failed calls by error type and the latency sketch of some calls."""

    calls: int = 0
    sums: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    latency: Counter = field(default_factory=Counter)

    def add(self, other: Figures, sign: int = 1) -> None:
        self.calls += sign * other.calls
        for key, value in other.sums.items():
            self.sums[key] += sign * value
        sketch.merge(self.errors, other.errors, sign)
        sketch.merge(self.latency, other.latency, sign)

    def add_stored(self, calls: int, sums: dict, errors: dict, latency: dict, sign: int = 1) -> None:
        """add(Figures.from_stored(...), sign) without building one: the read path merges many rows."""
        self.calls += sign * calls
        own = self.sums
        for key, value in sums.items():
            own[key] += sign * (Decimal(value) if key in DECIMALS else value)
        for into, other in ((self.errors, errors), (self.latency, latency)):
            for key, count in other.items():
                into[key] += sign * count
                if not into[key]:
                    del into[key]

    def sum(self, key: str) -> Any:
        return self.sums.get(key, Decimal(0) if key in DECIMALS else 0)

    @property
    def failures(self) -> int:
        return sum(self.errors.values())

    def stored(self) -> dict[str, Any]:
        """The Rollup columns holding these figures."""
        sums = {k: str(v) if k in DECIMALS else v for k, v in self.sums.items() if v}
        return {"calls": self.calls, "sums": sums, "errors": dict(self.errors), "latency": dict(self.latency)}

    @classmethod
    def from_stored(cls, calls: int, sums: dict, errors: dict, latency: dict) -> Figures:
        return cls(calls, Counter({k: Decimal(v) if k in DECIMALS else v for k, v in sums.items()}),
                   Counter(errors), Counter(latency))


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


def contribution(kind: str, row: dict[str, Any]) -> tuple[str, datetime, Figures]:
    """(name, started_at in UTC, figures) of one call (or compression, or conversation: its last
    activity), from the values of COLUMNS[kind]."""
    figures = Figures()
    add_contribution(kind, row, figures)
    return (*name_and_start(kind, row), figures)


def name_and_start(kind: str, row: dict[str, Any]) -> tuple[str, datetime]:
    """The rollup name and the time (UTC) of one call, compression or conversation: which buckets it goes to."""
    return (row[NAME_COLUMN[kind]] or "") if kind in NAME_COLUMN else "", _utc(row[TIME_COLUMN[kind]])


def _bump(counter: Counter, key: str, sign: int) -> None:
    counter[key] += sign
    if not counter[key]:
        del counter[key]


def add_contribution(kind: str, row: dict[str, Any], into: Figures, sign: int = 1) -> None:
    """Add (sign=1) or take out (sign=-1) one call's figures, read from the values of COLUMNS[kind]:
    `into.add(contribution(kind, row)[2], sign)` without building the call's own Figures (ingest
    does this for every call it writes). A conversation is one count, nothing more."""
    into.calls += sign
    if kind == CONVERSATION:
        return
    sums = into.sums
    if kind == COMPRESSION:
        sums["tokens_before"] += sign * (row["tokens_before"] or 0)
        sums["tokens_after"] += sign * (row["tokens_after"] or 0)
        return
    duration = row["duration_ms"]
    if duration is not None:
        sums["duration_n"] += sign
        sums["duration_ms"] += sign * duration
        _bump(into.latency, sketch.bucket_of(duration), sign)
    if kind == TOOL:
        if not row["success"]:
            _bump(into.errors, row["error_type"] or "", sign)
        for key in ("retry_count", "observation_tokens", "input_tokens", "context_tokens", "context_carries"):
            sums[key] += sign * (row[key] or 0)
        sums["successes"] += sign * bool(row["success"])
        sums["cache_hits"] += sign * bool(row["cache_hit"])
        if row["context_cost_usd"] is not None:
            sums["context_cost_usd"] += sign * Decimal(row["context_cost_usd"])
            sums["context_priced"] += sign
        levels = row["tokens_at_level"]
        if isinstance(levels, dict) and LEVELS[0] in levels:
            carries = row["context_carries"] or 0
            sums["level_calls"] += sign
            sums["level_carried"] += sign * (row["observation_tokens"] or 0) * carries
            for level in LEVELS:
                at = _int(levels.get(level))
                sums[f"at_{level}"] += sign * at
                sums[f"carried_{level}"] += sign * at * carries
    else:
        if row["status"] == "error":
            _bump(into.errors, row["error_type"] or "", sign)
        for key in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens"):
            sums[key] += sign * (row[key] or 0)
        if row["cost_usd"] is not None:
            sums["cost_usd"] += sign * Decimal(row["cost_usd"])
            sums["priced"] += sign


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def values_of(kind: str, instance: Any) -> dict[str, Any]:
    return {column: getattr(instance, column) for column in COLUMNS[kind]}
