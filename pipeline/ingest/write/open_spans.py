"""A REST turn's open and finished versions made one: the span its round_start began and its
round_end finished.

A span stored open (end time 0) is replaced by its finished version (first write wins for every
other span). An OTLP span's finished version says all there is to say; a REST round_end need not
repeat what its round_start said (the turn's start time, its user message), and the two may
arrive in either order, or at once in concurrent requests. So under the trace lock (`store._store`), whichever
arrives second is merged with the stored one: the finished version's attributes win, the open
one's fill the gaps, the earlier start is kept. The merged span replaces the stored one when it
says more than it; an open version that adds nothing to a finished span is a duplicate.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from pipeline.ingest.normalise.span import NormalisedSpan, normalise
from pipeline.ingest.records import SpanEvent, SpanRecord
from pipeline.ingest.write import sql
from pipeline.ingest.write.rows import encode_span_json
from pipeline.models import Span

logger = logging.getLogger(__name__)

Key = tuple[str, str]
STORED_COLUMNS = ("trace_id", "span_id", "name", "start_time_unix_nano", "end_time_unix_nano", "parent_span_id",
                  "otel_kind", "status_code", "status_message", "attributes", "events", "links", "resource",
                  "scope_name", "scope_version")


def complete_spans(spans: list[NormalisedSpan], stored: dict[Key, int]) -> tuple[list[NormalisedSpan], set[Key]]:
    """`spans`, each merged with its other version where that one is stored (`stored`: the end
    time of each stored span of the batch), and the keys of the stored spans the merged ones
    replace. Call under the trace lock, in the transaction that stores the result."""
    halves = {key: s for s in spans if (key := (s.record.trace_id, s.record.span_id)) in stored
              and (stored[key] == 0) != (s.record.end_time_unix_nano == 0)}
    if not halves:
        return spans, set()
    ids = [pk for _, _, pk in sql.by_spans(Span, ["id"], halves)]
    merged: dict[Key, NormalisedSpan] = {}
    for row in Span.objects.filter(pk__in=ids).values(*STORED_COLUMNS):
        key = (row["trace_id"], row["span_id"])
        arriving = halves[key].record
        try:
            if arriving.end_time_unix_nano > 0:  # finishing the stored open span: always replaces it
                merged[key] = normalise(merge(opened=_stored_record(row), finished=arriving))
            elif says_more(opened=arriving, finished=row):
                merged[key] = normalise(merge(opened=arriving, finished=_stored_record(row)))
        except Exception:  # each half was read alone: the one arriving is stored (or not) as it came
            logger.exception("could not merge span %s/%s with its stored version", *key)
    encode_span_json(merged.values())
    return [merged.get((s.record.trace_id, s.record.span_id), s) for s in spans], set(merged)


def merge(*, opened: SpanRecord, finished: SpanRecord) -> SpanRecord:
    """The finished version, with the open one's start where earlier, its attributes where the
    finished one has none, and its longer name ("invoke_agent planner" over "invoke_agent")."""
    name = opened.name if len(opened.name) > len(finished.name) and opened.name.startswith(finished.name) else finished.name
    return replace(finished, name=name, attributes={**opened.attributes, **finished.attributes},
                   start_time_unix_nano=min(opened.start_time_unix_nano, finished.start_time_unix_nano))


def says_more(*, opened: SpanRecord, finished: dict[str, Any]) -> bool:
    """Whether the open version adds to the stored finished span: an attribute, an earlier start, a longer name."""
    return (not opened.attributes.keys() <= finished["attributes"].keys()
            or opened.start_time_unix_nano < finished["start_time_unix_nano"]
            or len(opened.name) > len(finished["name"]) and opened.name.startswith(finished["name"]))


def _stored_record(row: dict[str, Any]) -> SpanRecord:
    return SpanRecord(
        row["trace_id"], row["span_id"], row["name"], row["start_time_unix_nano"], row["end_time_unix_nano"],
        parent_span_id=row["parent_span_id"], kind=row["otel_kind"], status_code=row["status_code"],
        status_message=row["status_message"], attributes=row["attributes"],
        events=[SpanEvent(e["name"], e["time_unix_nano"], e.get("attributes") or {}) for e in row["events"]],
        links=row["links"], resource=row["resource"], scope_name=row["scope_name"], scope_version=row["scope_version"],
    )
