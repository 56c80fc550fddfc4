"""The OTLP/HTTP JSON encoding of an ExportTraceServiceRequest (the SDK offers none for Python)."""

from __future__ import annotations

import base64
import json

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


def _b64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex()


def request_to_json(request: ExportTraceServiceRequest) -> bytes:
    """The OTLP/HTTP JSON body: ids as hex (the spec's deviation from proto3 JSON), enums as integers."""
    body = json_format.MessageToDict(request, use_integers_for_enums=True)
    for resource_spans in body.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for field in ("traceId", "spanId", "parentSpanId"):
                    if field in span:
                        span[field] = _b64_to_hex(span[field])
                for link in span.get("links", []):
                    for field in ("traceId", "spanId"):
                        if field in link:
                            link[field] = _b64_to_hex(link[field])
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
