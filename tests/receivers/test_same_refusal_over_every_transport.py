"""A bad key, an oversized body or a refused span reads the same over OTLP/HTTP (protobuf and JSON),
OTLP/gRPC and the REST API: one ingest service words it, each transport only carries it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import grpc
import httpx
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span as OtlpSpan

from pipeline.ingest.decode.rest import events_to_records
from pipeline.ingest.decode.rest_schema import IngestRequestSerializer
from pipeline.models import ApiKey, Span
from pipeline.models.apikeys import Scope
from tests.conftest import LiveServer, start_uvicorn
from tests.otlp_servers import start_grpc

LIMIT = 20_000
ENV = {"CTXLENS_MAX_INGEST_BYTES": str(LIMIT)}
GOOD_TRACE, GOOD_SPAN, BAD_SPAN = "ab" * 16, "cd" * 8, "ef" * 8
PAST_2262 = 9_300_000_000_000_000_000  # ns: more than 2**63 - 1
TRANSPORTS = ["otlp-protobuf", "otlp-json", "grpc", "rest"]


@pytest.fixture(scope="module")
def servers(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[dict[str, LiveServer]]:
    """uvicorn (OTLP/HTTP and REST, as `make run` serves) and the gRPC server, on the test database."""
    tmp = tmp_path_factory.mktemp("transports")
    with django_db_blocker.unblock():
        started = {"http": start_uvicorn(tmp, ENV), "grpc": start_grpc(tmp, extra_env=ENV)}
    yield started
    for server in started.values():
        server.stop()


def _span(trace: str, span: str, name: str, start: int = 1_700_000_000_000_000_000) -> OtlpSpan:
    return OtlpSpan(trace_id=bytes.fromhex(trace), span_id=bytes.fromhex(span), name=name,
                    start_time_unix_nano=start, end_time_unix_nano=start + 10**8)


def _otlp(*spans: OtlpSpan) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=list(spans))])])


def _otlp_json(request: ExportTraceServiceRequest) -> bytes:
    spans = [{"traceId": s.trace_id.hex(), "spanId": s.span_id.hex(), "name": s.name,
              "startTimeUnixNano": str(s.start_time_unix_nano), "endTimeUnixNano": str(s.end_time_unix_nano)}
             for s in request.resource_spans[0].scope_spans[0].spans]
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()


def _rest_body(*, late: bool = False, padding: int = 0) -> bytes:
    start = "2300-01-01T00:00:00Z" if late else "2026-05-01T12:00:00Z"
    event = {"type": "tool_call", "conversation_id": "c1", "round_id": "r1", "tool_name": "search",
             "tool_call_id": "call_1", "observation": "x" * padding, "started_at": start, "duration_ms": 5}
    return json.dumps({"schema_version": "1.0", "events": [event]}).encode()


def _rest_span_id() -> str:
    """The id REST gives the late tool call's span (derived from the client's ids)."""
    serializer = IngestRequestSerializer(data=json.loads(_rest_body(late=True)))
    assert serializer.is_valid(), serializer.errors
    (record,) = [r for r in events_to_records(serializer.validated_data["events"]) if r.start_time_unix_nano > 2**63]
    return record.span_id


# ---- one bad request per case, in each transport's encoding ----------------------------------

def _otlp_request(case: str) -> ExportTraceServiceRequest:
    if case == "oversized":
        return _otlp(_span(GOOD_TRACE, GOOD_SPAN, "x" * (LIMIT + 10_000)))
    if case == "span-past-2262":
        return _otlp(_span(GOOD_TRACE, GOOD_SPAN, "good"), _span(GOOD_TRACE, BAD_SPAN, "late", PAST_2262))
    if case == "span-with-a-zero-trace-id":
        return _otlp(_span(GOOD_TRACE, GOOD_SPAN, "good"), _span("00" * 16, BAD_SPAN, "bad id"))
    return _otlp(_span(GOOD_TRACE, GOOD_SPAN, "good"))


def _key(case: str) -> str | None:
    if case == "missing-key":
        return None
    if case == "unknown-key":
        ApiKey.generate("someone", scope=Scope.INGEST)
        return "ctx_not-a-real-key"
    return ApiKey.generate("agent", scope=Scope.READ if case == "read-only-key" else Scope.INGEST)[1]


def _headers(key: str | None, content_type: str) -> dict[str, str]:
    return {"Content-Type": content_type, **({"Authorization": f"Bearer {key}"} if key else {})}


def _send_otlp_http(server: LiveServer, case: str, key: str | None, encoding: str) -> tuple[int, str]:
    request = _otlp_request(case)
    body = request.SerializeToString() if encoding == "protobuf" else _otlp_json(request)
    content_type = "application/x-protobuf" if encoding == "protobuf" else "application/json"
    reply = httpx.post(f"{server.url}/v1/traces", content=body, headers=_headers(key, content_type), timeout=30)
    if reply.status_code == 200:  # a partial success carries the message
        if encoding == "protobuf":
            return 200, ExportTraceServiceResponse.FromString(reply.content).partial_success.error_message
        return 200, reply.json().get("partialSuccess", {}).get("errorMessage", "")
    if encoding == "protobuf":
        return reply.status_code, status_pb2.Status.FromString(reply.content).message
    return reply.status_code, reply.json()["message"]


GRPC_STATUS = {grpc.StatusCode.UNAUTHENTICATED: 401, grpc.StatusCode.PERMISSION_DENIED: 403,
               grpc.StatusCode.RESOURCE_EXHAUSTED: 413}


def _send_grpc(server: LiveServer, case: str, key: str | None) -> tuple[int, str]:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                   request_serializer=None, response_deserializer=ExportTraceServiceResponse.FromString)
        metadata = (("authorization", f"Bearer {key}"),) if key else ()
        try:
            response = call(_otlp_request(case).SerializeToString(), metadata=metadata, timeout=30)
        except grpc.RpcError as error:
            return GRPC_STATUS[error.code()], error.details()
    return 200, response.partial_success.error_message


def _send_rest(server: LiveServer, case: str, key: str | None) -> tuple[int, str]:
    body = _rest_body(late=case == "span-past-2262", padding=LIMIT + 10_000 if case == "oversized" else 0)
    reply = httpx.post(f"{server.url}/api/ingest/", content=body, headers=_headers(key, "application/json"),
                       timeout=30)
    data = reply.json()
    return reply.status_code, data["detail"] if "detail" in data else data["events"][0]


SENDERS: dict[str, Callable[[dict[str, LiveServer], str, str | None], tuple[int, str]]] = {
    "otlp-protobuf": lambda servers, case, key: _send_otlp_http(servers["http"], case, key, "protobuf"),
    "otlp-json": lambda servers, case, key: _send_otlp_http(servers["http"], case, key, "json"),
    "grpc": lambda servers, case, key: _send_grpc(servers["grpc"], case, key),
    "rest": lambda servers, case, key: _send_rest(servers["http"], case, key),
}


# ---- what every transport must say ----------------------------------------------------------

def _expected(case: str, transport: str) -> tuple[int, str]:
    late_span = _rest_span_id() if transport == "rest" else BAD_SPAN
    return {
        "missing-key": (401, "missing API key: send 'Authorization: Bearer <key>'"),
        "unknown-key": (401, "invalid or revoked API key"),
        "read-only-key": (403, "this API key does not have the 'ingest' scope"),
        "oversized": (413, f"request body is larger than {LIMIT} bytes (CTXLENS_MAX_INGEST_BYTES)"),
        # OTLP stores the rest of the batch (a partial success); REST stores a request whole or not at all.
        "span-past-2262": (400 if transport == "rest" else 200,
                           f"1 span(s) rejected: span {late_span}: time is past the year 2262 "
                           f"(more than 2**63 - 1 nanoseconds)"),
        "span-with-a-zero-trace-id": (200, f"1 span(s) rejected: span '{BAD_SPAN}': trace_id must be 16 bytes "
                                           f"(32 hex characters), not all zero"),
    }[case]


CASES = [(case, transport) for case in ("missing-key", "unknown-key", "read-only-key", "oversized", "span-past-2262")
         for transport in TRANSPORTS]
# REST derives span ids from the client's own ids: a malformed one cannot be sent that way.
CASES += [("span-with-a-zero-trace-id", transport) for transport in TRANSPORTS if transport != "rest"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("case, transport", CASES, ids=[f"{case}-over-{transport}" for case, transport in CASES])
def test_every_transport_refuses_with_the_same_words(servers, case, transport):
    status, message = SENDERS[transport](servers, case, _key(case))

    assert (status, message) == _expected(case, transport)
    stored = set(Span.objects.values_list("span_id", flat=True))
    partial = case.startswith("span-") and transport != "rest"
    assert stored == ({GOOD_SPAN} if partial else set())  # a partial success stores the good span only
