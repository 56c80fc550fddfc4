"""Finishing spans that were stored open (end time 0), such as the turn a REST round_start began.

The store replaces a stored open span by its finished version (first write wins for every
other span). The finished version need not repeat what the open one said — a REST round_end
carries neither the turn's start time nor its user message — so before storing, the finished
record takes the stored start time and the stored attributes it does not override.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.ingest.records import SpanRecord
from pipeline.ingest.write import sql
from pipeline.models import Span


def complete_open_spans(records: Sequence[SpanRecord]) -> int:
    """Merge each finished record with its stored open version; returns how many were merged.

    Call inside the transaction that then stores `records` with `store_spans`.
    """
    finished = {(r.trace_id, r.span_id): r for r in records if r.end_time_unix_nano > 0}
    if not finished:
        return 0
    open_ids = [pk for _, _, pk, end in sql.by_spans(Span, ["id", "end_time_unix_nano"], finished) if end == 0]
    if not open_ids:
        return 0
    stored = Span.objects.filter(pk__in=open_ids).values_list(
        "trace_id", "span_id", "name", "start_time_unix_nano", "attributes")
    merged = 0
    for trace_id, span_id, name, start, attributes in stored:
        record = finished.get((trace_id, span_id))
        if record is None:
            continue
        record.start_time_unix_nano = min(start, record.start_time_unix_nano)
        record.attributes = {**attributes, **record.attributes}
        if len(name) > len(record.name) and name.startswith(record.name):  # "invoke_agent planner"
            record.name = name
        merged += 1
    return merged
