"""The OTLP/HTTP JSON encoding of an export request, spans or logs (the SDK offers none for Python)."""

from __future__ import annotations

import base64
import json
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


def _ids_to_hex(item: dict[str, Any], *fields: str) -> None:
    for field in fields:
        if field in item:
            item[field] = base64.b64decode(item[field]).hex()


def request_to_json(request: ExportTraceServiceRequest | ExportLogsServiceRequest) -> bytes:
    """The OTLP/HTTP JSON body: ids as hex (the spec's deviation from proto3 JSON), enums as integers."""
    body = json_format.MessageToDict(request, use_integers_for_enums=True)
    for resource_spans in body.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                _ids_to_hex(span, "traceId", "spanId", "parentSpanId")
                for link in span.get("links", []):
                    _ids_to_hex(link, "traceId", "spanId")
    for resource_logs in body.get("resourceLogs", []):
        for scope_logs in resource_logs.get("scopeLogs", []):
            for record in scope_logs.get("logRecords", []):
                _ids_to_hex(record, "traceId", "spanId")
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
