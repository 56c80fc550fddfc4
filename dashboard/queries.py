"""Read-side figures for the dashboard pages that the read API does not already compute.

Every query is bounded by an indexed time range or a LIMIT, so page time does not grow with
the number of stored spans. Windowed call figures (totals, conversations active in the window,
tokens per minute, the latency histogram, errors by type) come from the rollups
(pipeline.rollups), per-tool statistics from pipeline.stats.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from itertools import chain

from django.db import connections, router
from django.db.models import Q, QuerySet
from django.utils import timezone

from pipeline.insight.findings import CODES, SEVERITIES
from pipeline.models import CompressionEvent, Conversation, LLMCall, Status, ToolCall
from pipeline.rollups import sketch
from pipeline.rollups.figures import COMPRESSION, CONVERSATION, MODEL, TOOL, Figures
from pipeline.rollups.read import figures_by_name, per_minute

# Columns that can hold a whole context window (megabytes per row with a real agent). Lists,
# timelines and charts never show them: they are read only on the page of one record.
HEAVY_COMPRESSION_FIELDS = ("before_messages", "after_messages", "dropped", "summarised", "summary",
                            "tokens_before_by_category", "tokens_after_by_category")
HEAVY_LLM_FIELDS = ("input_messages",)
HEAVY_TOOL_FIELDS = ("arguments", "observation")

ACTIVE_FOR = timedelta(minutes=5)  # a conversation with activity this recent counts as active
# Latency histogram buckets (upper bounds in ms); the last bucket is open-ended.
LATENCY_BUCKETS_MS = (10, 50, 100, 250, 500, 1000, 2500, 5000, 10000)


def _since(qs: QuerySet, field: str, since: datetime | None) -> QuerySet:
    return qs if since is None else qs.filter(**{f"{field}__gte": since})


# The distinct models of the stored conversations, read by one index seek per model (a loose
# index scan on the model index): PostgreSQL has no skip scan, so SELECT DISTINCT would walk the
# whole index, every conversation, on each render of the conversations list.
_DISTINCT_MODELS = """
WITH RECURSIVE found(model, n) AS (
    SELECT (SELECT model FROM {table} WHERE model > '' ORDER BY model LIMIT 1), 1
    UNION ALL
    SELECT (SELECT c.model FROM {table} c WHERE c.model > found.model ORDER BY c.model LIMIT 1), n + 1
    FROM found WHERE found.model IS NOT NULL AND n < %s
)
SELECT model FROM found WHERE model IS NOT NULL
"""


def conversation_models(limit: int = 200) -> list[str]:
    """The first `limit` distinct non-empty models of the conversations, in order."""
    database = router.db_for_read(Conversation) or "default"
    with connections[database].cursor() as cursor:
        cursor.execute(_DISTINCT_MODELS.format(table=connections[database].ops.quote_name(
            Conversation._meta.db_table)), [limit])
        return [model for (model,) in cursor.fetchall()]


def tokens_per_minute(minutes: int = 60, now: datetime | None = None) -> dict[str, list]:
    """Input and output tokens and cost in USD of LLM calls per minute over the last `minutes`,
    zero-filled; a minute whose calls all lack a price has cost None (a gap, not $0)."""
    now = (now or timezone.now()).replace(second=0, microsecond=0)
    start = now - timedelta(minutes=minutes - 1)
    by_minute = per_minute(MODEL, start)  # the minute rollups: kept for hours, so always there
    labels, inputs, outputs, costs = [], [], [], []
    for i in range(minutes):
        minute = start + timedelta(minutes=i)
        figures = by_minute.get(minute)
        labels.append(minute.strftime("%H:%M"))
        inputs.append(figures.sum("input_tokens") if figures else 0)
        outputs.append(figures.sum("output_tokens") if figures else 0)
        # a JSON number for the chart (Django's encoder would write a Decimal as a string)
        priced = figures is None or figures.sum("priced")
        costs.append(None if not priced else float(figures.sum("cost_usd")) if figures else 0)
    return {"labels": labels, "input": inputs, "output": outputs, "cost": costs}


@dataclass(frozen=True)
class Totals:
    conversations: int
    llm_calls: int
    input_tokens: int
    output_tokens: int
    tool_calls: int
    tool_errors: int
    compressions: int
    tokens_saved: int
    cost_usd: Decimal | None  # of the priced LLM calls; None when none has a price
    unpriced_calls: int


def _all(figures: dict[str, Figures]) -> Figures:
    total = Figures()
    for f in figures.values():
        total.add(f)
    return total


def totals(since: datetime | None) -> Totals:
    llm = _all(figures_by_name(MODEL, since=since))
    tools = _all(figures_by_name(TOOL, since=since))
    compressions = _all(figures_by_name(COMPRESSION, since=since))
    return Totals(
        # the conversations last active since `since`, counted by the rollups of their last activity
        conversations=_all(figures_by_name(CONVERSATION, since=since)).calls,
        llm_calls=llm.calls,
        input_tokens=llm.sum("input_tokens"),
        output_tokens=llm.sum("output_tokens"),
        tool_calls=tools.calls,
        tool_errors=tools.failures,
        compressions=compressions.calls,
        tokens_saved=compressions.sum("tokens_before") - compressions.sum("tokens_after"),
        cost_usd=llm.sum("cost_usd") if llm.sum("priced") else None,
        unpriced_calls=llm.calls - llm.sum("priced"),
    )


def active_conversations(limit: int = 8, now: datetime | None = None) -> list[Conversation]:
    """Conversations with a running turn or recent activity, most recently active first."""
    recent = (now or timezone.now()) - ACTIVE_FOR
    return list(
        Conversation.objects.filter(Q(status=Status.RUNNING) | Q(last_activity_at__gte=recent))
        .order_by("-last_activity_at")[:limit]
    )


@dataclass(frozen=True)
class FindingCode:
    code: str
    severity: str
    findings: int
    conversations: int  # how many conversations have it


def finding_codes(since: datetime | None, limit: int = 10) -> list[FindingCode]:
    """The most frequent finding codes in the conversations active since `since` (errors first among
    equals), from the counts stored with each conversation (pipeline.insight.finding_counts): no
    findings computed here."""
    findings: Counter = Counter()
    conversations: Counter = Counter()
    stored = _since(Conversation.objects.filter(finding_count__gt=0).order_by(), "last_activity_at", since)
    for counts in stored.values_list("finding_counts", flat=True).iterator(chunk_size=2000):
        for code, n in counts.items():
            if code in CODES and n:
                findings[code] += n
                conversations[code] += 1
    severity = {name: rank for rank, name in enumerate(SEVERITIES)}
    ranked = sorted(findings, key=lambda code: (-findings[code], severity[CODES[code]], code))[:limit]
    return [FindingCode(code, CODES[code], findings[code], conversations[code]) for code in ranked]


def recent_compressions(limit: int = 8) -> list[CompressionEvent]:
    events = CompressionEvent.objects.select_related("conversation").defer(*HEAVY_COMPRESSION_FIELDS)
    return list(events.order_by("-occurred_at")[:limit])


@dataclass(frozen=True)
class ErrorRow:
    at: datetime
    kind: str  # "tool" or "llm"
    name: str
    error_type: str
    message: str
    conversation: Conversation
    anchor: str  # element id on the conversation page
    round_id: int | None  # the turn it is in, which names the page of turns that shows it


def recent_errors(limit: int = 8) -> list[ErrorRow]:
    """The latest failed tool calls and LLM calls, newest first."""
    tools = (ToolCall.objects.filter(success=False).select_related("conversation").defer(*HEAVY_TOOL_FIELDS)
             .order_by("-started_at")[:limit])
    llms = (LLMCall.objects.filter(status=Status.ERROR).select_related("conversation")
            .defer(*HEAVY_LLM_FIELDS, "output_messages").order_by("-started_at")[:limit])
    rows = chain(
        (ErrorRow(t.started_at, "tool", t.tool_name, t.error_type, t.error_message, t.conversation, f"tool-{t.pk}",
                  t.round_id)
         for t in tools),
        (ErrorRow(c.started_at, "llm", c.model or "LLM call", c.error_type, c.error_message, c.conversation,
                  f"llm-{c.pk}", c.round_id) for c in llms),
    )
    return sorted(rows, key=lambda row: row.at, reverse=True)[:limit]


def latency_histogram_of(figures: dict[str, Figures]) -> dict[str, list]:
    """latency_histogram from rollup figures: each sketch bucket counted where its value falls, so a
    call within 2 % of a bound may count on the other side of it."""
    counts = [0] * (len(LATENCY_BUCKETS_MS) + 1)
    for f in figures.values():
        for key, n in f.latency.items():
            value = sketch.value_of(key)
            counts[next((i for i, high in enumerate(LATENCY_BUCKETS_MS) if value < high), len(LATENCY_BUCKETS_MS))] += n
    labels = [f"< {_ms(high)}" for high in LATENCY_BUCKETS_MS] + [f"≥ {_ms(LATENCY_BUCKETS_MS[-1])}"]
    return {"labels": labels, "counts": counts}


def errors_by_type_of(figures: dict[str, Figures], limit: int = 20) -> list[dict]:
    """errors_by_type from rollup figures; last_seen from the latest such failure (an index walk each)."""
    rows = sorted(((-n, name, error_type) for name, f in figures.items() for error_type, n in f.errors.items()))
    out = []
    for minus_count, name, error_type in rows[:limit]:
        latest = (ToolCall.objects.filter(tool_name=name, success=False, error_type=error_type)
                  .order_by("-started_at").values_list("started_at", flat=True).first())
        out.append({"tool_name": name, "error_type": error_type, "count": -minus_count, "last_seen": latest})
    return out


def _ms(value: float) -> str:
    return f"{value / 1000:g} s" if value >= 1000 else f"{value:g} ms"
