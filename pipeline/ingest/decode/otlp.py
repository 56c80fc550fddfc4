"""OTLP/HTTP bodies → SpanRecords and LogRecords, and the replies OTLP clients expect.

Protobuf is parsed by opentelemetry-proto (upb) and flattened in one pass. OTLP/JSON is walked
by hand: ids are hex (not base64 as protobuf's json_format would assume), enums are integers,
64-bit integers may be strings, keys are lowerCamelCase (snake_case is accepted too), unknown
fields are ignored. A span with ids of the wrong length is rejected on its own and counted
in the reply's partial_success; a body that cannot be decoded raises `OtlpDecodeError` (→ 400).

AnyValues (attribute values, log bodies) nest at most MAX_DEPTH arrays or maps deep in both
encodings: a deeper array or map is replaced with the text TOO_DEEP, and the rest of the span is
kept. (A body nested past what the JSON parser can read at all, thousands of levels, is a 400;
protobuf's own parser refuses past 100 levels.)
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from pipeline.ingest.records import LogRecord, SpanEvent, SpanRecord

PROTOBUF, JSON = "application/x-protobuf", "application/json"
SPAN_KIND_NAMES = {"SPAN_KIND_UNSPECIFIED": 0, "SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2,
                   "SPAN_KIND_CLIENT": 3, "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5}
STATUS_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
MAX_ERRORS_REPORTED = 5
MAX_DEPTH = 32
TOO_DEEP = f"[value nested deeper than {MAX_DEPTH} levels: not kept]"
SCALARS = frozenset({"string_value", "bool_value", "int_value", "double_value", "bytes_value"})  # AnyValue fields


class OtlpDecodeError(ValueError):
    """The body is not an OTLP export request of the declared encoding."""


@dataclass
class Decoded:
    spans: list[SpanRecord] = field(default_factory=list)
    logs: list[LogRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one per rejected item

    @property
    def error_message(self) -> str:
        if not self.errors:
            return ""
        more = f" (and {len(self.errors) - MAX_ERRORS_REPORTED} more)" if len(self.errors) > MAX_ERRORS_REPORTED else ""
        return "; ".join(self.errors[:MAX_ERRORS_REPORTED]) + more


# ---- protobuf -------------------------------------------------------------------------------

def _any(value: Any, depth: int = 0) -> Any:
    which = value.WhichOneof("value")
    if which in SCALARS:
        return getattr(value, which)
    if which == "array_value" or which == "kvlist_value":
        if depth >= MAX_DEPTH:
            return TOO_DEEP
        if which == "array_value":
            return [v.string_value or _any(v, depth + 1) for v in value.array_value.values]
        return _attrs(value.kvlist_value.values, depth + 1)
    return None  # unset, or string_value_strindex (an index into a profiles dictionary we do not have)


def _attrs(key_values: Any, depth: int = 0) -> dict[str, Any]:
    # Most values are strings. A non-empty string_value can only be the oneof's set member (the
    # others read as ""), so it is the value as it is; "" (an empty string or another kind) asks _any.
    out = {}
    for kv in key_values:
        value = kv.value
        out[kv.key] = value.string_value or _any(value, depth)
    return out


def _id_problem(trace_id: bytes, span_id: bytes, parent: bytes, what: str = "span") -> str:
    if len(trace_id) != 16:
        return f"{what} {span_id.hex() or '?'}: trace_id is {len(trace_id)} bytes, must be 16"
    if len(span_id) != 8:
        return f"{what} in trace {trace_id.hex()}: span_id is {len(span_id)} bytes, must be 8"
    if parent and len(parent) != 8:
        return f"{what} {span_id.hex()}: parent_span_id is {len(parent)} bytes, must be 8 or empty"
    return ""


def decode_traces_protobuf(body: bytes) -> Decoded:
    try:
        request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise OtlpDecodeError(f"body is not a valid ExportTraceServiceRequest protobuf ({exc})") from None
    out = Decoded()
    for resource_spans in request.resource_spans:
        resource = _attrs(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            scope_name, scope_version = scope_spans.scope.name, scope_spans.scope.version
            for span in scope_spans.spans:
                trace_id, span_id, parent = span.trace_id, span.span_id, span.parent_span_id
                problem = _id_problem(trace_id, span_id, parent)
                if problem:
                    out.errors.append(problem)
                    continue
                status = span.status
                out.spans.append(SpanRecord(
                    trace_id=trace_id.hex(), span_id=span_id.hex(), name=span.name,
                    start_time_unix_nano=span.start_time_unix_nano, end_time_unix_nano=span.end_time_unix_nano,
                    parent_span_id=parent.hex(), kind=span.kind, status_code=status.code,
                    status_message=status.message, attributes=_attrs(span.attributes),
                    events=[SpanEvent(e.name, e.time_unix_nano, _attrs(e.attributes)) for e in span.events],
                    links=[{"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex(),
                            "attributes": _attrs(link.attributes)} for link in span.links],
                    resource=resource, scope_name=scope_name, scope_version=scope_version,
                ))
    return out


def decode_logs_protobuf(body: bytes) -> Decoded:
    try:
        request = logs_service_pb2.ExportLogsServiceRequest.FromString(body)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise OtlpDecodeError(f"body is not a valid ExportLogsServiceRequest protobuf ({exc})") from None
    out = Decoded()
    for resource_logs in request.resource_logs:
        for scope_logs in resource_logs.scope_logs:
            for log in scope_logs.log_records:
                if (log.trace_id and len(log.trace_id) != 16) or (log.span_id and len(log.span_id) != 8):
                    out.errors.append(f"log record: trace_id/span_id must be 16/8 bytes, got "
                                      f"{len(log.trace_id)}/{len(log.span_id)}")
                    continue
                attributes = _attrs(log.attributes)
                out.logs.append(LogRecord(
                    trace_id=log.trace_id.hex(), span_id=log.span_id.hex(),
                    time_unix_nano=log.time_unix_nano or log.observed_time_unix_nano,
                    event_name=log.event_name or str(attributes.get("event.name", "")),
                    body=_any(log.body) if log.HasField("body") else None, attributes=attributes,
                ))
    return out


# ---- JSON -----------------------------------------------------------------------------------

def _get(obj: dict[str, Any], camel: str, snake: str, default: Any = None) -> Any:
    value = obj.get(camel)
    return obj.get(snake, default) if value is None else value


def _list(obj: dict[str, Any], camel: str, snake: str) -> list[Any]:
    value = _get(obj, camel, snake, [])
    if not isinstance(value, list):
        raise OtlpDecodeError(f"{camel} must be a list")
    return value


def _int(value: Any, name: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool):
        raise OtlpDecodeError(f"{name} must be an integer")
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: JSON's Infinity
        raise OtlpDecodeError(f"{name} must be an integer, got {str(value)[:40]!r}") from None


def _enum(value: Any, names: dict[str, int], name: str) -> int:
    return names.get(value, 0) if isinstance(value, str) and not value.isdigit() else _int(value, name)


def _json_any(value: Any, depth: int = 0) -> Any:
    if not isinstance(value, dict):
        return None
    for key, inner in value.items():
        if key in ("arrayValue", "array_value", "kvlistValue", "kvlist_value") and depth >= MAX_DEPTH:
            return TOO_DEEP
        if key == "stringValue" or key == "string_value":
            return inner
        if key == "intValue" or key == "int_value":
            return _int(inner, "intValue")
        if key == "doubleValue" or key == "double_value":
            return float(inner)
        if key == "boolValue" or key == "bool_value":
            return bool(inner)
        if key == "arrayValue" or key == "array_value":
            return [_json_any(v, depth + 1) for v in (inner or {}).get("values", [])]
        if key == "kvlistValue" or key == "kvlist_value":
            return _json_attrs((inner or {}).get("values", []), depth + 1)
        if key == "bytesValue" or key == "bytes_value":
            return base64.b64decode(inner)
    return None


def _json_attrs(items: Any, depth: int = 0) -> dict[str, Any]:
    if not isinstance(items, list):
        raise OtlpDecodeError("attributes must be a list of {key, value}")
    out = {}
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("key"), str):
            out[item["key"]] = _json_any(item.get("value"), depth)
    return out


def _hex_id(value: Any, size: int) -> str | None:
    """Lower-case hex of an id of `size` bytes, "" when absent, None when malformed."""
    if value in (None, ""):
        return ""
    if not isinstance(value, str) or len(value) != size * 2:
        return None
    try:
        bytes.fromhex(value)
    except ValueError:
        return None
    return value.lower()


def _load_json(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise OtlpDecodeError(f"body is not valid JSON ({exc})") from None
    except RecursionError:  # an arrayValue inside an arrayValue ... a few thousand levels deep
        raise OtlpDecodeError("body is nested too deeply to read (AnyValues keep "
                              f"{MAX_DEPTH} levels of arrays and maps)") from None
    if not isinstance(data, dict):
        raise OtlpDecodeError("body must be a JSON object")
    return data


def _json_span(span: dict[str, Any], resource: dict[str, Any], scope: dict[str, Any]) -> SpanRecord | str:
    trace_id = _hex_id(_get(span, "traceId", "trace_id"), 16)
    span_id = _hex_id(_get(span, "spanId", "span_id"), 8)
    parent = _hex_id(_get(span, "parentSpanId", "parent_span_id"), 8)
    if not trace_id or not span_id or parent is None:
        return (f"span {str(_get(span, 'spanId', 'span_id'))[:40]!r}: traceId must be 32 and spanId/parentSpanId "
                f"16 hex characters (OTLP/JSON ids are hex, not base64)")
    status = span.get("status") or {}
    return SpanRecord(
        trace_id=trace_id, span_id=span_id, parent_span_id=parent, name=str(span.get("name", "")),
        start_time_unix_nano=_int(_get(span, "startTimeUnixNano", "start_time_unix_nano"), "startTimeUnixNano"),
        end_time_unix_nano=_int(_get(span, "endTimeUnixNano", "end_time_unix_nano"), "endTimeUnixNano"),
        kind=_enum(span.get("kind", 0), SPAN_KIND_NAMES, "kind"),
        status_code=_enum(status.get("code", 0), STATUS_NAMES, "status.code"),
        status_message=str(status.get("message", "")), attributes=_json_attrs(span.get("attributes", [])),
        events=[SpanEvent(str(e.get("name", "")), _int(_get(e, "timeUnixNano", "time_unix_nano"), "timeUnixNano"),
                          _json_attrs(e.get("attributes", []))) for e in _list(span, "events", "events")],
        links=[{"trace_id": _hex_id(_get(link, "traceId", "trace_id"), 16) or "",
                "span_id": _hex_id(_get(link, "spanId", "span_id"), 8) or "",
                "attributes": _json_attrs(link.get("attributes", []))} for link in _list(span, "links", "links")],
        resource=resource, scope_name=str(scope.get("name", "")), scope_version=str(scope.get("version", "")),
    )


def decode_traces_json(body: bytes) -> Decoded:
    data = _load_json(body)
    out = Decoded()
    try:
        for resource_spans in _list(data, "resourceSpans", "resource_spans"):
            resource = _json_attrs((resource_spans.get("resource") or {}).get("attributes", []))
            for scope_spans in _list(resource_spans, "scopeSpans", "scope_spans"):
                scope = scope_spans.get("scope") or {}
                for span in _list(scope_spans, "spans", "spans"):
                    record = _json_span(span, resource, scope)
                    if isinstance(record, str):
                        out.errors.append(record)
                    else:
                        out.spans.append(record)
    except (AttributeError, TypeError, ValueError, OverflowError) as exc:  # e.g. doubleValue "abc", Infinity
        raise OtlpDecodeError(f"body does not have the ExportTraceServiceRequest shape ({exc})") from None
    return out


def decode_logs_json(body: bytes) -> Decoded:
    data = _load_json(body)
    out = Decoded()
    try:
        for resource_logs in _list(data, "resourceLogs", "resource_logs"):
            for scope_logs in _list(resource_logs, "scopeLogs", "scope_logs"):
                for log in _list(scope_logs, "logRecords", "log_records"):
                    trace_id = _hex_id(_get(log, "traceId", "trace_id"), 16)
                    span_id = _hex_id(_get(log, "spanId", "span_id"), 8)
                    if trace_id is None or span_id is None:
                        out.errors.append("log record: traceId/spanId must be 32/16 hex characters")
                        continue
                    attributes = _json_attrs(log.get("attributes", []))
                    time = _get(log, "timeUnixNano", "time_unix_nano") or _get(
                        log, "observedTimeUnixNano", "observed_time_unix_nano")
                    out.logs.append(LogRecord(
                        trace_id=trace_id, span_id=span_id, time_unix_nano=_int(time, "timeUnixNano"),
                        event_name=str(_get(log, "eventName", "event_name") or attributes.get("event.name", "")),
                        body=_json_any(log.get("body")), attributes=attributes,
                    ))
    except (AttributeError, TypeError, ValueError, OverflowError) as exc:
        raise OtlpDecodeError(f"body does not have the ExportLogsServiceRequest shape ({exc})") from None
    return out


# ---- replies --------------------------------------------------------------------------------

def export_response(content_type: str, rejected: int, message: str, *, logs: bool = False) -> bytes:
    """ExportTraceServiceResponse (or the logs one), partial_success set only when there is news."""
    if content_type == JSON:
        if not rejected and not message:
            return b"{}"
        count_key = "rejectedLogRecords" if logs else "rejectedSpans"
        return json.dumps({"partialSuccess": {count_key: str(rejected), "errorMessage": message}}).encode()
    if logs:
        reply = logs_service_pb2.ExportLogsServiceResponse()
        if rejected or message:
            reply.partial_success.rejected_log_records = rejected
            reply.partial_success.error_message = message
    else:
        reply = trace_service_pb2.ExportTraceServiceResponse()
        if rejected or message:
            reply.partial_success.rejected_spans = rejected
            reply.partial_success.error_message = message
    return reply.SerializeToString()


def status_body(content_type: str, code: int, message: str) -> bytes:
    """A google.rpc.Status (gRPC `code`, developer-facing `message`) in the reply's encoding."""
    if content_type == PROTOBUF:
        return status_pb2.Status(code=code, message=message).SerializeToString()
    return json.dumps({"code": code, "message": message}).encode()
