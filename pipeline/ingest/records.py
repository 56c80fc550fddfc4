"""The one internal shape every way in produces: OTLP/HTTP, OTLP/gRPC, the REST API and the
pipeline's in-process exporter all turn what they receive into SpanRecords, and the
normaliser stores those."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class SpanEvent:
    name: str
    time_unix_nano: int
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class SpanRecord:
    trace_id: str  # 32 lower-case hex characters
    span_id: str  # 16 lower-case hex characters
    name: str
    start_time_unix_nano: int
    end_time_unix_nano: int = 0
    parent_span_id: str = ""
    kind: int = 0  # OTLP Span.SpanKind: 0 unspecified, 1 internal, 2 server, 3 client, ...
    status_code: int = 0  # 0 unset, 1 ok, 2 error
    status_message: str = ""
    # Attribute values are plain Python: str, bool, int, float, bytes, list, dict (kvlist).
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)
    links: list[dict[str, Any]] = field(default_factory=list)
    resource: dict[str, Any] = field(default_factory=dict)
    scope_name: str = ""
    scope_version: str = ""


@dataclass(slots=True)
class LogRecord:
    """An OTLP log record, as /v1/logs hands it to the store (GenAI message events)."""

    trace_id: str  # 32 hex, or "" when the record is not tied to a trace
    span_id: str  # 16 hex, or ""
    time_unix_nano: int
    event_name: str = ""  # LogRecord.event_name, else the `event.name` attribute
    body: Any = None  # plain Python, like attribute values
    attributes: dict[str, Any] = field(default_factory=dict)
