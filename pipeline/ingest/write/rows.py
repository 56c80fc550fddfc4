"""Build and insert the rows one ingest batch adds: spans, LLM and tool calls, events.

Runs inside the store's transaction, after pipeline.ingest.write.conversations has found the batch's
conversations and rounds. Span rows are prepared values (no model instances: one per span);
the rest are unsaved instances, linked in memory (pipeline.ingest.write.linking) and inserted with
one executemany per table (pipeline.ingest.write.sql).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

import orjson
from django.utils import timezone

from pipeline.ingest.write import precount, sql
from pipeline.ingest.write.artifacts import store_observation_artifacts
from pipeline.ingest.write.linking import RoundRows, link_compressions, save_requests
from pipeline.ingest.normalise.span import NormalisedSpan
from pipeline.ingest.records import SpanRecord
from pipeline.ingest.write.sanitise import clamp_integers
from pipeline.insight.costs import price_llm_call
from pipeline.rollups import track as rollups
from pipeline.models import CompressionEvent, Conversation, LLMCall, Round, SkillActivation, Span, ToolCall

ROW_MODELS = (Span, LLMCall, ToolCall, CompressionEvent, SkillActivation)
ROLLED_UP = (LLMCall, ToolCall, CompressionEvent)  # rows with rollups (pipeline.rollups)


def jsonable(value: Any) -> Any:
    """Attribute values as JSON can hold them: bytes become base64 text."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        if any(isinstance(v, bytes | dict | list) for v in value.values()):
            return {k: jsonable(v) for k, v in value.items()}
        return value
    if isinstance(value, list):
        return [jsonable(v) for v in value] if any(isinstance(v, bytes | dict | list) for v in value) else value
    return value


def _base64(value: Any) -> str:
    """orjson's `default` for attribute values: bytes as `jsonable` writes them, anything else refused."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError


SPAN_COLUMNS = (
    "trace_id", "span_id", "parent_span_id", "name", "kind", "otel_kind", "status_code", "status_message",
    "start_time", "end_time", "start_time_unix_nano", "end_time_unix_nano", "duration_ms", "service_name",
    "scope_name", "scope_version", "attributes", "events", "links", "resource", "conversation_id", "source",
    "received_at",
)


class _SpanJson:
    """The JSON columns of Span rows (attributes, events, links, resource), prepared."""

    def __init__(self) -> None:
        self.prepare = sql.Prepare()
        self.empty = self.prepare.json([])
        self.resources: dict[int, Any] = {}  # the spans of one ResourceSpans share its dict

    def json(self, value: Any) -> Any:
        """`prepare.json(jsonable(value))`. Where that is orjson's text (SQLite), orjson writes bytes
        as base64 itself, so the values, which seldom hold any, are not walked first."""
        if self.prepare.json_as_text:
            try:
                return orjson.dumps(value, default=_base64, option=sql.ORJSON_AS_JSON).decode()
            except TypeError:  # what orjson refuses: prepare.json decides, as before
                pass
        return self.prepare.json(jsonable(value))

    def columns(self, r: SpanRecord) -> tuple[Any, Any, Any, Any]:
        json = self.json
        resource = self.resources.get(id(r.resource))
        if resource is None:
            resource = self.resources[id(r.resource)] = json(r.resource)
        events = json([{"name": e.name, "time_unix_nano": e.time_unix_nano, "attributes": e.attributes}
                       for e in r.events]) if r.events else self.empty
        return json(r.attributes), events, json(r.links) if r.links else self.empty, resource


def encode_span_json(spans: Iterable[NormalisedSpan]) -> None:
    """Set each span's `span_json` where the database takes JSON as text (SQLite): on the request's
    thread, before the transaction, because encoding the attributes is the largest part of a Span
    row and the transactions run one at a time. (PostgreSQL's driver encodes as it executes.)"""
    encoder = _SpanJson()
    if encoder.prepare.json_as_text:
        for s in spans:
            s.span_json = encoder.columns(s.record)


class _SpanRows:
    """Prepared Span rows (no model instances: this runs for every span), in SPAN_COLUMNS order."""

    def __init__(self, source: str) -> None:
        self.encoder = _SpanJson()
        self.prepare = self.encoder.prepare
        self.source = source[:16]
        self.received = self.prepare.datetime(timezone.now())

    def values(self, s: NormalisedSpan, conversation_id: int) -> list[Any]:
        r = s.record
        attributes, events, links, resource = s.span_json or self.encoder.columns(r)
        return [
            r.trace_id, r.span_id, r.parent_span_id, r.name[:1000], s.span_kind, r.kind, r.status_code,
            r.status_message, self.prepare.datetime(s.started_at), self.prepare.datetime(s.ended_at),
            r.start_time_unix_nano, r.end_time_unix_nano, s.duration_ms, s.service_name, r.scope_name[:255],
            r.scope_version[:64], attributes, events, links, resource, conversation_id, self.source, self.received,
        ]


def build_rows(
    spans: list[NormalisedSpan],
    conversations: dict[str, Conversation],
    rounds: dict[tuple[int, str], Round],
    source: str,
) -> dict[str, list]:
    """Prepared Span rows and unsaved model instances for the rest, by model."""
    out: dict[str, list] = {"span": [], "llm": [], "tool": [], "compression": [], "skill": []}
    span_rows = _SpanRows(source)
    new_llm_call, new_tool_call = sql.row_maker(LLMCall), sql.row_maker(ToolCall)
    for s in spans:
        r = s.record
        conversation_id = conversations[r.trace_id].id
        out["span"].append(span_rows.values(s, conversation_id))
        if not s.in_round:
            continue
        round_id = rounds[(conversation_id, s.round_key)].id
        common = {"trace_id": r.trace_id, "span_id": r.span_id, "conversation_id": conversation_id,
                  "round_id": round_id}
        timing = {
            "started_at": s.started_at, "ended_at": s.ended_at, "duration_ms": s.duration_ms,
            "status": s.status, "error_type": s.error_type, "error_message": s.error_message,
        }
        if s.llm is not None:
            call = new_llm_call(**common, **timing, **s.llm)
            price_llm_call(call)
            out["llm"].append(call)
        elif s.tool is not None:
            fields = dict(s.tool)
            fields.pop("artifact_ref")
            out["tool"].append(new_tool_call(**common, **timing, success=s.status == "ok", **fields))
        elif s.compression is not None:
            out["compression"].append(CompressionEvent(**common, occurred_at=s.started_at, **s.compression))
        elif s.skill is not None:
            out["skill"].append(SkillActivation(
                **common, activated_at=s.started_at, status=s.status, error_message=s.error_message, **s.skill
            ))
    return out


def insert_rows(
    spans: list[NormalisedSpan], rows: dict[str, list], links: RoundRows, stored_rounds: set[int],
    counts: dict[tuple[str, str], precount.Precount] | None = None,
) -> None:
    """Insert in dependency order, linking new rows to each other and to the stored ones on the way;
    `counts`: tool observations counted before the transaction, kept where the linking confirms them."""
    links.add(rows["llm"], rows["tool"])
    links.number_steps()
    sql.insert_values(Span, SPAN_COLUMNS, rows["span"])
    sql.insert_rows(LLMCall, rows["llm"])
    rollups.inserted(LLMCall, rows["llm"])
    sql.fetch_ids(LLMCall, rows["llm"])
    save_requests(rows["llm"])
    links.link_tools()
    if rows["tool"]:
        refs = {(s.record.trace_id, s.record.span_id): s.tool["artifact_ref"] for s in spans if s.tool}
        store_observation_artifacts(rows["tool"], refs)
        precount.apply(rows["tool"], links.calls(), counts or {})
        sql.insert_rows(ToolCall, rows["tool"])
        rollups.inserted(ToolCall, rows["tool"])
        sql.fetch_ids(ToolCall, rows["tool"])
    if rows["compression"] or (stored_rounds and rows["llm"]):
        link_compressions(rows["compression"], links, stored_rounds)
    CompressionEvent.objects.bulk_create(clamp_integers(rows["compression"]))
    rollups.inserted(CompressionEvent, rows["compression"])
    SkillActivation.objects.bulk_create(clamp_integers(rows["skill"]))
    links.save_changes()


def delete_span_rows(keys: Iterable[tuple[str, str]]) -> None:
    """Remove the rows of spans that are about to be replaced by their finished versions."""
    for trace_id, span_id in keys:
        for model in ROW_MODELS:
            rows = model.objects.filter(trace_id=trace_id, span_id=span_id)
            rollups.deleting(model, list(rows.values_list("pk", flat=True)) if model in ROLLED_UP else [])
            rows.delete()
