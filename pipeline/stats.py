"""Per-tool statistics over stored tool calls, for the read API and the dashboard pages.

Context cost: `context_tokens` and `context_cost_usd` sum what each call's result cost the later
LLM calls that carried it (pipeline.ingest.write.tool_context); `avg_context_carries` is how
many calls carried a result, on average over the tool's calls. The output-level what-if covers
the calls whose full result is stored (`level_calls`): `tokens_at_level` sums their tokens at
each level, and `level_savings` says what switching them to a level would have saved —
(observation tokens − tokens at the level) × the calls that carried them, priced at the tool's
average context cost per token (None without a price). A negative saving is a cost.

Windowed statistics (`window_tool_stats`: the dashboard pages and the read API without a
conversation) come from the rollups (pipeline.rollups): exact sums and counts, and p50/p95/p99
read from a DDSketch-style histogram, within 2 % of the duration at the percentile's rank.
Statistics of any other set of calls (`tool_stats(queryset)`, e.g. one conversation's) read the
calls: their percentiles are continuous (linear interpolation between the two nearest ranks, the
definition of PostgreSQL's `percentile_cont` and of numpy's default): PostgreSQL computes them
in the grouped query; on SQLite, which has no percentile function, the durations are fetched
unsorted and sorted per tool in Python (the fastest of the ways measured).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TypedDict

from django.db import connections
from django.db.models import Aggregate, Avg, Count, F, FloatField, IntegerField, Q, QuerySet, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

from pipeline.insight.levels import LEVELS
from pipeline.models import ToolCall
from pipeline.rollups import sketch
from pipeline.rollups.figures import TOOL, Figures
from pipeline.rollups.read import figures_by_name

PERCENTILES = (0.5, 0.95, 0.99)


@dataclass(frozen=True, slots=True)
class ToolStats:
    tool_name: str
    calls: int
    successes: int
    failures: int
    success_rate: float  # 0..1
    retries: int
    cache_hits: int  # calls answered from the tool-result cache
    cache_hit_rate: float  # cache_hits / calls, 0..1
    avg_duration_ms: float | None
    p50_duration_ms: float | None
    p95_duration_ms: float | None
    p99_duration_ms: float | None
    avg_observation_tokens: float
    total_observation_tokens: int
    context_tokens: int = 0  # the results' tokens, summed over every LLM call that carried them
    context_cost_usd: float | None = None  # those tokens priced per carrying call; None: none priced
    avg_context_carries: float = 0.0  # LLM calls that carried a result, per call of the tool
    level_calls: int = 0  # calls whose full result is stored, which the what-if covers
    tokens_at_level: dict[str, int] | None = None  # {"brief", "standard", "full"}: their tokens at each level
    level_savings: dict[str, LevelSaving] | None = None  # {"brief", ...}: switching them to that level

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class LevelSaving(TypedDict):
    tokens: int  # context tokens saved (negative: spent)
    cost_usd: float | None  # at the tool's average context cost per token; None without a price


HAS_LEVELS = Q(tokens_at_level__has_key=LEVELS[0])


def _at_level(level: str) -> Cast:
    return Cast(KT(f"tokens_at_level__{level}"), IntegerField())


def _context_aggregates() -> dict[str, Aggregate]:
    """The sums behind the context-cost and output-level fields (see the module docstring)."""
    sums: dict[str, Aggregate] = {
        "sum_context_tokens": Sum("context_tokens"),
        "sum_context_cost": Sum("context_cost_usd"),
        "sum_context_carries": Sum("context_carries"),
        "level_calls": Count("id", filter=HAS_LEVELS),
        "level_carried": Sum(F("observation_tokens") * F("context_carries"), filter=HAS_LEVELS),
    }
    for level in LEVELS:
        sums[f"at_{level}"] = Sum(_at_level(level), filter=HAS_LEVELS)
        sums[f"carried_{level}"] = Sum(_at_level(level) * F("context_carries"), filter=HAS_LEVELS)
    return sums


def _context_fields(row: dict) -> dict[str, object]:
    tokens, cost = row["sum_context_tokens"] or 0, row["sum_context_cost"]
    fields: dict[str, object] = {
        "context_tokens": tokens,
        "context_cost_usd": None if cost is None else float(cost),
        "avg_context_carries": (row["sum_context_carries"] or 0) / row["calls"] if row["calls"] else 0.0,
        "level_calls": row["level_calls"],
    }
    if row["level_calls"]:
        per_token = Decimal(cost) / tokens if cost is not None and tokens else None
        fields["tokens_at_level"] = {level: row[f"at_{level}"] or 0 for level in LEVELS}
        savings = {}
        for level in LEVELS:
            saved = (row["level_carried"] or 0) - (row[f"carried_{level}"] or 0)
            savings[level] = LevelSaving(tokens=saved, cost_usd=None if per_token is None else float(saved * per_token))
        fields["level_savings"] = savings
    return fields


class PercentileCont(Aggregate):
    """PostgreSQL's ordered-set aggregate `percentile_cont(p) WITHIN GROUP (ORDER BY expr)`."""

    function = "PERCENTILE_CONT"
    template = "%(function)s(%(percentile)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression: str, percentile: float, **extra: object) -> None:
        if not 0 <= percentile <= 1:
            raise ValueError("percentile must be in [0, 1]")
        super().__init__(expression, percentile=float(percentile), **extra)


def tool_calls_in(
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    conversation_id: int | None = None,
    tool_name: str | None = None,
) -> QuerySet[ToolCall]:
    """Tool calls started in [since, until), optionally of one conversation or one tool."""
    qs = started_in(ToolCall.objects.all(), since=since, until=until, conversation_id=conversation_id)
    return qs.filter(tool_name=tool_name) if tool_name else qs


def started_in(qs: QuerySet, *, since: datetime | None, until: datetime | None,
               conversation_id: int | None) -> QuerySet:
    """Calls of `qs` started in [since, until), optionally of one conversation."""
    if since is not None:
        qs = qs.filter(started_at__gte=since)
    if until is not None:
        qs = qs.filter(started_at__lt=until)
    if conversation_id is not None:
        qs = qs.filter(conversation_id=conversation_id)
    return qs


WINDOW_RE = re.compile(r"\A(\d{1,6})([mhdw])\Z")
WINDOW_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
# Longer windows would reach back past year 1 (999999w is 19,000 years); nothing is that old.
MAX_WINDOW = timedelta(days=100 * 365)


def parse_window(text: str) -> timedelta:
    """`15m`, `1h`, `7d`, `2w` as a timedelta, at most 100 years; ValueError for anything else."""
    match = WINDOW_RE.match(text.strip())
    if not match or int(match.group(1)) == 0:
        raise ValueError("use a number and a unit m, h, d or w, e.g. 15m, 1h, 7d")
    window = timedelta(**{WINDOW_UNITS[match.group(2)]: int(match.group(1))})
    if window > MAX_WINDOW:
        raise ValueError("at most 100 years; leave the window out for all time")
    return window


def tool_stats(calls: QuerySet[ToolCall] | None = None) -> list[ToolStats]:
    """One ToolStats per tool name in `calls` (all tool calls by default), most called first."""
    calls = ToolCall.objects.all() if calls is None else calls
    calls = calls.order_by()  # no default ordering inside GROUP BY
    postgres = connections[calls.db].vendor == "postgresql"
    extra = {}
    if postgres:
        extra = {f"p{round(p * 100)}": PercentileCont("duration_ms", p) for p in PERCENTILES}
    rows = calls.values("tool_name").annotate(
        calls=Count("id"),
        successes=Count("id", filter=Q(success=True)),
        retries=Sum("retry_count"),
        cache_hits=Count("id", filter=Q(cache_hit=True)),
        avg_duration_ms=Avg("duration_ms"),
        avg_observation_tokens=Avg("observation_tokens"),
        total_observation_tokens=Sum("observation_tokens"),
        **_context_aggregates(),
        **extra,
    )
    rows = list(rows)
    percentiles = {} if postgres else _percentiles_in_python(calls)
    result = []
    for row in rows:
        name = row["tool_name"]
        if postgres:
            p50, p95, p99 = row["p50"], row["p95"], row["p99"]
        else:
            p50, p95, p99 = percentiles.get(name, (None, None, None))
        result.append(
            ToolStats(
                tool_name=name,
                calls=row["calls"],
                successes=row["successes"],
                failures=row["calls"] - row["successes"],
                success_rate=row["successes"] / row["calls"] if row["calls"] else 0.0,
                retries=row["retries"] or 0,
                cache_hits=row["cache_hits"],
                cache_hit_rate=row["cache_hits"] / row["calls"] if row["calls"] else 0.0,
                avg_duration_ms=row["avg_duration_ms"],
                p50_duration_ms=p50,
                p95_duration_ms=p95,
                p99_duration_ms=p99,
                avg_observation_tokens=float(row["avg_observation_tokens"] or 0.0),
                total_observation_tokens=row["total_observation_tokens"] or 0,
                **_context_fields(row),
            )
        )
    result.sort(key=lambda s: (-s.calls, s.tool_name))
    return result


def interpolate(ordered: list[float], p: float) -> float | None:
    """The continuous percentile `p` of an ascending list (percentile_cont's definition)."""
    if not ordered:
        return None
    position = p * (len(ordered) - 1)
    lower = int(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)


def _percentiles_in_python(calls: QuerySet[ToolCall]) -> dict[str, tuple[float | None, ...]]:
    """p50, p95 and p99 of duration_ms per tool: the durations, unsorted, sorted here.

    Measured on SQLite with 100,000 tool calls (bench/tool_stats.py): fetching them unsorted and
    sorting in Python takes about a third of the time of ORDER BY in SQL or of ranking them with
    window functions and fetching only the rows next to each percentile.
    """
    durations: dict[str, list[float]] = defaultdict(list)
    rows = calls.order_by().filter(duration_ms__isnull=False).values_list("tool_name", "duration_ms")
    for name, duration in rows.iterator(chunk_size=10_000):
        durations[name].append(duration)
    result: dict[str, tuple[float | None, ...]] = {}
    for name, values in durations.items():
        values.sort()
        result[name] = tuple(interpolate(values, p) for p in PERCENTILES)
    return result


def window_tool_stats(
    *, since: datetime | None = None, until: datetime | None = None, tool_name: str | None = None
) -> list[ToolStats]:
    """tool_stats of the calls started in [since, until), from the rollups (module docstring)."""
    return stats_of(figures_by_name(TOOL, since=since, until=until, name=tool_name or None))


def stats_of(figures: dict[str, Figures]) -> list[ToolStats]:
    """ToolStats from rollup figures by tool name, most called first."""
    result = [_from_figures(name, f) for name, f in figures.items()]
    result.sort(key=lambda s: (-s.calls, s.tool_name))
    return result


def _from_figures(name: str, f: Figures) -> ToolStats:
    calls, successes = f.calls, f.sum("successes")
    n = f.sum("duration_n")
    p50, p95, p99 = sketch.quantiles(f.latency, PERCENTILES)
    priced = f.sum("context_priced")
    row = {"calls": calls, "sum_context_tokens": f.sum("context_tokens"),
           "sum_context_cost": f.sum("context_cost_usd") if priced else None,
           "sum_context_carries": f.sum("context_carries"), "level_calls": f.sum("level_calls"),
           "level_carried": f.sum("level_carried")}
    for level in LEVELS:
        row[f"at_{level}"] = f.sum(f"at_{level}")
        row[f"carried_{level}"] = f.sum(f"carried_{level}")
    return ToolStats(
        tool_name=name, calls=calls, successes=successes, failures=calls - successes,
        success_rate=successes / calls if calls else 0.0, retries=f.sum("retry_count"),
        cache_hits=f.sum("cache_hits"), cache_hit_rate=f.sum("cache_hits") / calls if calls else 0.0,
        avg_duration_ms=f.sum("duration_ms") / n if n else None,
        p50_duration_ms=p50, p95_duration_ms=p95, p99_duration_ms=p99,
        avg_observation_tokens=f.sum("observation_tokens") / calls if calls else 0.0,
        total_observation_tokens=f.sum("observation_tokens"),
        **_context_fields(row),
    )
