"""OpenTelemetry SDK spans (ReadableSpan) as SpanRecords: the in-process way in.

An agent the server runs in its own process hands its finished SDK spans to
pipeline.ingest.inprocess.StoreSpanExporter, which decodes them here; the receivers decode OTLP
bytes in pipeline.ingest.decode.otlp into the same records.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from pipeline.ingest.records import SpanEvent, SpanRecord


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def span_record(span: ReadableSpan) -> SpanRecord:
    """An SDK span as the internal SpanRecord that every way in produces."""
    ctx = span.get_span_context()
    return SpanRecord(
        trace_id=format(ctx.trace_id, "032x"),
        span_id=format(ctx.span_id, "016x"),
        parent_span_id=format(span.parent.span_id, "016x") if span.parent else "",
        name=span.name,
        start_time_unix_nano=span.start_time or 0,
        end_time_unix_nano=span.end_time or 0,
        kind=span.kind.value + 1,  # the SDK counts from INTERNAL = 0, OTLP from UNSPECIFIED = 0
        status_code=span.status.status_code.value,
        status_message=span.status.description or "",
        attributes={k: _plain(v) for k, v in (span.attributes or {}).items()},
        events=[SpanEvent(e.name, e.timestamp, {k: _plain(v) for k, v in (e.attributes or {}).items()}) for e in span.events],
        links=[
            {"trace_id": format(link.context.trace_id, "032x"), "span_id": format(link.context.span_id, "016x"),
             "attributes": dict(link.attributes or {})}
            for link in span.links
        ],
        resource={k: _plain(v) for k, v in span.resource.attributes.items()},
        scope_name=span.instrumentation_scope.name if span.instrumentation_scope else "",
        scope_version=(span.instrumentation_scope.version or "") if span.instrumentation_scope else "",
    )
