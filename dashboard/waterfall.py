"""One turn's spans as a tree on a time axis: the waterfall a turn opens on the conversation page.

The timeline shows what ingest mapped (LLM calls, tool calls, compressions, skills); the
waterfall shows every stored span of the turn, so LangGraph nodes, chains, retrievers and the
agent span are visible too. A span belongs to a round as ingest decided when it stored it: same
trace, same conversation, and its own round key (ctxlens.round.id, else the trace id) is the
round's; a conversation-metadata span belongs to no round.

Spans are read without their attributes column (a span can carry a whole context window): one
JSON extraction per row picks the few attributes the waterfall shows (`JsonValues`). The tree is
built in Python: children under their parent, siblings by start time; a span whose parent is not
in the turn (not sent, or past the cap) starts at the root level, and so does a span caught in a
parent cycle. At most MAX_SPANS spans, the earliest by start time; the rest are counted.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

from django.db import NotSupportedError
from django.db.models import Expression, F, JSONField
from django.db.models.functions import Substr
from django.urls import reverse

from dashboard.timeline import page_of_round
from pipeline import semconv as sc
from pipeline.ingest.normalise.span import bounded_key, nanos_to_datetime
from pipeline.ingest.normalise.values import as_int, first, first_str
from pipeline.models import CompressionEvent, LLMCall, Round, Span, ToolCall

MAX_SPANS = 2000
MAX_VALUE_CHARS = 200  # an attribute value longer than this is cut, with "…"
MAX_STATUS_CHARS = 500
MAX_METADATA_CHARS = 8192  # OpenInference's `metadata` JSON is parsed for the LangGraph node only when this small

MODEL_KEYS = ("gen_ai.request.model", "gen_ai.response.model", "llm.model_name")
TOOL_KEYS = ("gen_ai.tool.name", "tool.name")
INPUT_TOKEN_KEYS = ("gen_ai.usage.input_tokens", "llm.token_count.prompt")
OUTPUT_TOKEN_KEYS = ("gen_ai.usage.output_tokens", "llm.token_count.completion")
LANGGRAPH_NODE_KEYS = ("langgraph.node", "traceloop.association.properties.langgraph_node")
# What a row shows on hover and when expanded, in this order: what the span is, which model or
# tool, its tokens, and where it sits in a LangGraph graph.
SHOWN_ATTRIBUTES = (
    "gen_ai.operation.name", "openinference.span.kind", "traceloop.span.kind", sc.SPAN_KIND,
    "gen_ai.agent.name", *MODEL_KEYS, "gen_ai.provider.name", "llm.provider", *TOOL_KEYS, "gen_ai.tool.call.id",
    *INPUT_TOKEN_KEYS, *OUTPUT_TOKEN_KEYS, "llm.token_count.total", "traceloop.entity.name",
    *LANGGRAPH_NODE_KEYS, "traceloop.association.properties.langgraph_step", "error.type",
)
OPENINFERENCE_METADATA = "metadata"  # a JSON string with langgraph_node and langgraph_step
READ_ATTRIBUTES = (*SHOWN_ATTRIBUTES, sc.ROUND_ID, OPENINFERENCE_METADATA)
STATUS = {0: "unset", 1: "ok", 2: "error"}


class JsonValues(Expression):
    """The values of `keys` in a JSON column, as one JSON array (null where a key is missing).

    One parse of the document per row: SQLite's JSON_EXTRACT takes every path at once, where
    Django's key transforms would parse a span's whole attributes (megabytes with a prompt in
    them) three times per key. PostgreSQL's jsonb needs no parse at all.
    """

    def __init__(self, column: str, keys: tuple[str, ...]) -> None:
        super().__init__(output_field=JSONField())
        self.column, self.keys = F(column), keys

    def get_source_expressions(self) -> list[Any]:
        return [self.column]

    def set_source_expressions(self, exprs: list[Any]) -> None:
        (self.column,) = exprs

    def as_sqlite(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        column, params = compiler.compile(self.column)
        paths = [f'$."{key}"' for key in self.keys]  # the keys are this module's constants: no quotes in them
        return f"JSON_EXTRACT({column}, {', '.join(['%s'] * len(paths))})", [*params, *paths]

    def as_postgresql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        column, params = compiler.compile(self.column)
        items = ", ".join([f"({column} -> %s)"] * len(self.keys))
        return f"JSONB_BUILD_ARRAY({items})", [p for key in self.keys for p in (*params, key)]

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        raise NotSupportedError("ctxlens reads span attributes on SQLite and PostgreSQL only")


class TimelineEntry(TypedDict):
    type: str  # llm | tool | compression
    id: int
    anchor: str  # the element id of the entry on the conversation page
    url: str


class WaterfallSpan(TypedDict):
    span_id: str
    parent_span_id: str
    depth: int
    orphan: bool
    name: str
    kind: str
    status: str
    status_message: str
    start_offset_ms: float
    duration_ms: float | None
    running: bool
    model: str
    tool_name: str
    input_tokens: int | None
    output_tokens: int | None
    langgraph_node: str
    attributes: dict[str, Any]
    timeline: TimelineEntry | None


class Waterfall(TypedDict):
    round_id: int
    conversation_id: int
    trace_id: str
    started_at: datetime
    duration_ms: float
    span_count: int
    spans_omitted: int
    max_spans: int
    spans: list[WaterfallSpan]


@dataclass
class _Row:
    pk: int
    span_id: str
    parent_span_id: str
    name: str
    kind: str
    status_code: int
    status_message: str
    start: int
    end: int
    attrs: dict[str, Any]


def _shown(value: Any) -> Any:
    """An attribute value as the waterfall shows it: numbers and booleans as they are, the rest as
    text of at most MAX_VALUE_CHARS."""
    if isinstance(value, bool | int | float):
        return value
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS - 1] + "…"


def _openinference_metadata(attrs: dict[str, Any]) -> dict[str, Any]:
    raw = attrs.get(OPENINFERENCE_METADATA)
    if not isinstance(raw, str) or len(raw) > MAX_METADATA_CHARS:
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _in_round(row: _Row, round_: Round) -> bool:
    """The rule ingest applies (pipeline.ingest.normalise.span.normalise and NormalisedSpan.in_round)."""
    if row.attrs.get(sc.SPAN_KIND) == sc.SPAN_KIND_CONVERSATION:
        return False
    return (bounded_key(first_str(row.attrs, sc.ROUND_ID)) or round_.trace_id) == round_.key


def _rows(round_: Round, limit: int) -> tuple[list[_Row], int]:
    """The round's first `limit` spans by start time, and how many it has in all."""
    spans = (
        Span.objects.filter(trace_id=round_.trace_id, conversation_id=round_.conversation_id)
        .order_by("start_time_unix_nano", "id")
        .values_list("id", "span_id", "parent_span_id", "name", "kind", "status_code",
                     Substr("status_message", 1, MAX_STATUS_CHARS), "start_time_unix_nano", "end_time_unix_nano",
                     JsonValues("attributes", READ_ATTRIBUTES))
    )
    kept: list[_Row] = []
    total = 0
    for values in spans.iterator(chunk_size=500):
        extracted = values[-1] if isinstance(values[-1], list) else []
        row = _Row(*values[:-1], attrs={k: v for k, v in zip(READ_ATTRIBUTES, extracted) if v is not None})
        if not _in_round(row, round_):
            continue
        total += 1
        if len(kept) < limit:
            kept.append(row)
    return kept, total


def _tree_order(rows: list[_Row]) -> list[tuple[_Row, int, bool]]:
    """(row, depth, orphan) depth first, roots and siblings in start order (`rows` is in start order).

    A root is a span without a parent in `rows`; in a parent cycle (a → b → a), which reaches no
    root, the earliest span of the cycle is made one."""
    by_id = {row.span_id: row for row in rows}
    children: dict[str, list[_Row]] = defaultdict(list)
    roots: list[_Row] = []
    for row in rows:
        if row.parent_span_id in by_id and row.parent_span_id != row.span_id:
            children[row.parent_span_id].append(row)
        else:
            roots.append(row)

    def subtree(root: _Row) -> list[tuple[_Row, int]]:
        found, stack = [], [(root, 0)]
        while stack:  # not recursive: a hostile trace can nest thousands deep
            row, depth = stack.pop()
            if row.span_id in reached:
                continue
            reached.add(row.span_id)
            found.append((row, depth))
            stack.extend((child, depth + 1) for child in reversed(children.get(row.span_id, ())))
        return found

    reached: set[str] = set()
    trees = [subtree(root) for root in roots]
    for row in rows:
        if row.span_id not in reached:
            trees.append(subtree(row))
    position = {row.span_id: i for i, row in enumerate(rows)}
    trees.sort(key=lambda tree: position[tree[0][0].span_id])
    return [(row, depth, depth == 0 and bool(row.parent_span_id)) for tree in trees for row, depth in tree]


def _page_url(round_: Round) -> str:
    """The conversation page that shows the round: the page of turns it is on (1, the latest: no `?page=`)."""
    page = reverse("conversation", args=[round_.conversation_id])
    number = page_of_round(round_)
    return f"{page}?page={number}" if number > 1 else page


@dataclass
class _Records:
    """What ingest made of the spans: timeline entries, and the LLM calls' and tool calls' figures."""

    entries: dict[str, TimelineEntry]
    calls: dict[str, tuple[str, int, int]]  # span id: (model, input tokens, output tokens)
    tools: dict[str, str]  # span id: tool name


def _records(round_: Round, span_ids: set[str]) -> _Records:
    # By round (an indexed foreign key), not by an IN list of up to MAX_SPANS span ids, which
    # Django takes longer to compile than the database takes to run.
    page = _page_url(round_)
    out = _Records({}, {}, {})

    def of(model: type) -> Any:
        return model.objects.filter(round_id=round_.pk, trace_id=round_.trace_id)

    def add(kind: str, span_id: str, pk: int) -> None:
        anchor = f"{kind}-{pk}"
        out.entries[span_id] = TimelineEntry(type=kind, id=pk, anchor=anchor, url=f"{page}#{anchor}")

    # A span with several compressions links to the first.
    for span_id, pk in of(CompressionEvent).order_by("-pk").values_list("span_id", "pk"):
        if span_id in span_ids:
            add("compression", span_id, pk)
    for span_id, pk, tool_name in of(ToolCall).values_list("span_id", "pk", "tool_name"):
        if span_id in span_ids:
            add("tool", span_id, pk)
            out.tools[span_id] = tool_name
    for span_id, pk, *figures in of(LLMCall).values_list("span_id", "pk", "model", "input_tokens", "output_tokens"):
        if span_id in span_ids:
            add("llm", span_id, pk)
            out.calls[span_id] = tuple(figures)
    return out


def round_waterfall(round_: Round, limit: int = MAX_SPANS) -> Waterfall:
    rows, total = _rows(round_, limit)
    start = min((row.start for row in rows), default=0)
    end = max((max(row.start, row.end) for row in rows), default=0)
    records = _records(round_, {row.span_id for row in rows}) if rows else _Records({}, {}, {})
    spans: list[WaterfallSpan] = []
    for row, depth, orphan in _tree_order(rows):
        attrs = row.attrs
        metadata = _openinference_metadata(attrs)
        model, input_tokens, output_tokens = records.calls.get(row.span_id, (None, None, None))
        running = row.end <= 0
        spans.append(WaterfallSpan(
            span_id=row.span_id,
            parent_span_id=row.parent_span_id,
            depth=depth,
            orphan=orphan,
            name=row.name,
            kind=row.kind,
            status=STATUS.get(row.status_code, "unset"),
            status_message=row.status_message,
            start_offset_ms=round((row.start - start) / 1e6, 3),
            duration_ms=None if running else round(max(0, row.end - row.start) / 1e6, 3),
            running=running,
            model=model or first_str(attrs, *MODEL_KEYS)[:MAX_VALUE_CHARS],
            tool_name=records.tools.get(row.span_id) or first_str(attrs, *TOOL_KEYS)[:MAX_VALUE_CHARS],
            input_tokens=input_tokens if input_tokens is not None else as_int(first(attrs, *INPUT_TOKEN_KEYS)),
            output_tokens=output_tokens if output_tokens is not None else as_int(first(attrs, *OUTPUT_TOKEN_KEYS)),
            langgraph_node=(first_str(attrs, *LANGGRAPH_NODE_KEYS) or first_str(metadata, "langgraph_node"))[:MAX_VALUE_CHARS],
            attributes={key: _shown(attrs[key]) for key in SHOWN_ATTRIBUTES if key in attrs},
            timeline=records.entries.get(row.span_id),
        ))
    return Waterfall(
        round_id=round_.pk,
        conversation_id=round_.conversation_id,
        trace_id=round_.trace_id,
        started_at=nanos_to_datetime(start) if rows else round_.started_at,
        duration_ms=round((end - start) / 1e6, 3),
        span_count=total,
        spans_omitted=total - len(rows),
        max_spans=limit,
        spans=spans,
    )
