"""Stored Span rows → OTLP ExportTraceServiceRequest, SpanLog rows → ExportLogsServiceRequest,
with their original ids and content.

`spans_to_request()` rebuilds what arrived: trace/span/parent ids, times, kind, status,
attributes, events, links, resource and instrumentation scope, with spans grouped by
resource and scope as an SDK would. `logs_to_request()` rebuilds each log record from what
ingest kept of it (pipeline.ingest.write.logs.save_logs): ids, time, event name, body and
attributes, so the receiving ctxlens stores the same row (the same digest) and a re-send is a
no-op there too. `pipeline.runtime.telemetry.otlp_json.request_to_json()` gives the OTLP/HTTP JSON encoding
(hex ids, integer enums, camelCase), which `google.protobuf.json_format` alone gets wrong.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Status
from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan

from pipeline.models import Span, SpanLog

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def any_value(value: Any) -> AnyValue:
    """One attribute value as OTLP AnyValue; nested lists and dicts become array/kvlist values."""
    out = AnyValue()
    if value is None:
        return out  # an empty AnyValue is OTLP's null
    if isinstance(value, bool):
        out.bool_value = value
    elif isinstance(value, int):
        if INT64_MIN <= value <= INT64_MAX:
            out.int_value = value
        else:
            out.string_value = str(value)  # no OTLP type holds it exactly
    elif isinstance(value, float):
        out.double_value = value
    elif isinstance(value, str):
        out.string_value = value
    elif isinstance(value, (bytes, bytearray, memoryview)):
        out.bytes_value = bytes(value)
    elif isinstance(value, Mapping):
        out.kvlist_value.values.extend(key_values(value))
    elif isinstance(value, (list, tuple)):
        out.array_value.values.extend(any_value(item) for item in value)
    else:
        out.string_value = str(value)
    return out


def key_values(attributes: Mapping[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=str(key), value=any_value(value)) for key, value in attributes.items()]


def _id_bytes(hex_id: str, length: int) -> bytes:
    """A stored hex id as OTLP bytes; empty (no parent) stays empty; anything malformed is dropped."""
    if not hex_id:
        return b""
    try:
        raw = bytes.fromhex(hex_id)
    except ValueError:
        return b""
    return raw if len(raw) == length else b""


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _event(event: Mapping[str, Any]) -> OtlpSpan.Event:
    return OtlpSpan.Event(
        name=str(event.get("name", "")),
        time_unix_nano=_int(event.get("time_unix_nano", event.get("timeUnixNano"))),
        attributes=key_values(event.get("attributes") or {}),
        dropped_attributes_count=_int(event.get("dropped_attributes_count")),
    )


def _link(link: Mapping[str, Any]) -> OtlpSpan.Link:
    return OtlpSpan.Link(
        trace_id=_id_bytes(str(link.get("trace_id", link.get("traceId", ""))), 16),
        span_id=_id_bytes(str(link.get("span_id", link.get("spanId", ""))), 8),
        trace_state=str(link.get("trace_state", link.get("traceState", "")) or ""),
        attributes=key_values(link.get("attributes") or {}),
        dropped_attributes_count=_int(link.get("dropped_attributes_count")),
        flags=_int(link.get("flags")),
    )


def span_to_otlp(span: Span) -> OtlpSpan:
    return OtlpSpan(
        trace_id=_id_bytes(span.trace_id, 16),
        span_id=_id_bytes(span.span_id, 8),
        parent_span_id=_id_bytes(span.parent_span_id, 8),
        name=span.name,
        kind=span.otel_kind,
        start_time_unix_nano=span.start_time_unix_nano,
        end_time_unix_nano=span.end_time_unix_nano,
        attributes=key_values(span.attributes or {}),
        events=[_event(event) for event in span.events or [] if isinstance(event, Mapping)],
        links=[_link(link) for link in span.links or [] if isinstance(link, Mapping)],
        status=Status(code=span.status_code, message=span.status_message),
    )


def _resource_of(span: Span) -> dict[str, Any]:
    resource = dict(span.resource or {})
    if span.service_name and "service.name" not in resource:
        resource["service.name"] = span.service_name
    return resource


def spans_to_request(spans: Iterable[Span]) -> ExportTraceServiceRequest:
    """One request holding `spans`, grouped by resource, then by instrumentation scope, in order."""
    groups: dict[str, tuple[dict[str, Any], dict[tuple[str, str], list[OtlpSpan]]]] = {}
    for span in spans:
        resource = _resource_of(span)
        resource_key = json.dumps(resource, sort_keys=True, default=str)
        _, scopes = groups.setdefault(resource_key, (resource, {}))
        scopes.setdefault((span.scope_name, span.scope_version), []).append(span_to_otlp(span))
    request = ExportTraceServiceRequest()
    for resource, scopes in groups.values():
        resource_spans = ResourceSpans(resource=Resource(attributes=key_values(resource)))
        for (scope_name, scope_version), otlp_spans in scopes.items():
            resource_spans.scope_spans.append(
                ScopeSpans(scope=InstrumentationScope(name=scope_name, version=scope_version), spans=otlp_spans)
            )
        request.resource_spans.append(resource_spans)
    return request


def log_to_otlp(log: SpanLog) -> LogRecord:
    record = LogRecord(
        trace_id=_id_bytes(log.trace_id, 16),
        span_id=_id_bytes(log.span_id, 8),
        time_unix_nano=log.time_unix_nano,
        event_name=log.event_name,
        attributes=key_values(log.attributes or {}),
    )
    if log.body is not None:  # None: the record had no body
        record.body.CopyFrom(any_value(log.body))
    return record


def logs_to_request(logs: Iterable[SpanLog]) -> ExportLogsServiceRequest:
    """One request holding `logs`, in order (ingest keeps no resource or scope of a log record)."""
    records = [log_to_otlp(log) for log in logs]
    return ExportLogsServiceRequest(resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(log_records=records)])])
