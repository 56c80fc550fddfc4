"""OTLP/gRPC ingest (`manage.py serve_otlp_grpc`) with the real OpenTelemetry gRPC exporter."""

from __future__ import annotations

import logging

import grpc
import pytest
from google.protobuf.message import Message
from google.rpc.error_details_pb2 import RetryInfo
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span as OtlpSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from pipeline.models import ApiKey, Conversation, LLMCall, Span, ToolCall
from tests.agent_traces import record_turns, span_count

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ingest_key() -> str:
    return ApiKey.generate("grpc agent", scope="ingest")[1]


def exporter(server, key: str, timeout: float = 10) -> OTLPSpanExporter:
    return OTLPSpanExporter(endpoint=f"127.0.0.1:{server.port}", insecure=True,
                            headers={"authorization": f"Bearer {key}"}, timeout=timeout)


def raw_export(server, body: bytes, key: str | None, *, gzip: bool = False, method: str = EXPORT,
               reply: type[Message] = ExportTraceServiceResponse) -> Message:
    """One Export call (TraceService's, or `method` with its `reply`) with a body of our choosing;
    raises grpc.RpcError like any client sees it."""
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=reply.FromString)
        metadata = (("authorization", f"Bearer {key}"),) if key else ()
        compression = grpc.Compression.Gzip if gzip else grpc.Compression.NoCompression
        return call(body, metadata=metadata, timeout=10, compression=compression)


def one_span_request(trace: str = "ab" * 16, span: str = "cd" * 8, name: str = "raw") -> bytes:
    otlp = OtlpSpan(trace_id=bytes.fromhex(trace), span_id=bytes.fromhex(span), name=name,
                    start_time_unix_nano=1_700_000_000_000_000_000, end_time_unix_nano=1_700_000_000_100_000_000)
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[otlp])])]) \
        .SerializeToString()


def test_the_otel_grpc_exporter_stores_an_agent_turn(grpc_servers, ingest_key):
    server = grpc_servers()
    spans = record_turns("grpc-conversation", turns=2)

    assert exporter(server, ingest_key).export(spans) == SpanExportResult.SUCCESS

    assert Span.objects.count() == span_count(turns=2)
    assert set(Span.objects.values_list("source", flat=True)) == {"grpc"}
    conversation = Conversation.objects.get(external_id="grpc-conversation")
    assert conversation.round_count == 2
    assert LLMCall.objects.filter(conversation=conversation, request_model="gpt-4o").count() == 2
    assert ToolCall.objects.filter(conversation=conversation, tool_name="search").count() == 4
    sdk_ids = {(format(s.context.trace_id, "032x"), format(s.context.span_id, "016x")) for s in spans}
    assert set(Span.objects.values_list("trace_id", "span_id")) == sdk_ids


def test_a_resend_stores_nothing_twice(grpc_servers, ingest_key):
    server = grpc_servers()
    spans = record_turns("resend")
    assert exporter(server, ingest_key).export(spans) == SpanExportResult.SUCCESS
    assert exporter(server, ingest_key).export(spans) == SpanExportResult.SUCCESS
    assert Span.objects.count() == span_count()
    assert ToolCall.objects.count() == 2


def test_it_refuses_a_missing_or_unknown_key(grpc_servers):
    server = grpc_servers()
    for key in (None, "ctx_not-a-real-key"):
        with pytest.raises(grpc.RpcError) as refused:
            raw_export(server, one_span_request(), key)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert exporter(server, "ctx_not-a-real-key").export(record_turns("nope")) == SpanExportResult.FAILURE
    assert Span.objects.count() == 0


def test_a_read_key_cannot_ingest(grpc_servers):
    server = grpc_servers()
    read_key = ApiKey.generate("reader", scope="read")[1]
    with pytest.raises(grpc.RpcError) as refused:
        raw_export(server, one_span_request(), read_key)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert Span.objects.count() == 0


def test_a_revoked_key_cannot_ingest(grpc_servers):
    server = grpc_servers()
    key, raw = ApiKey.generate("revoked", scope="all")
    key.revoke()
    with pytest.raises(grpc.RpcError) as refused:
        raw_export(server, one_span_request(), raw)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_it_answers_invalid_argument_to_a_body_that_is_not_otlp(grpc_servers, ingest_key):
    server = grpc_servers()
    with pytest.raises(grpc.RpcError) as refused:
        raw_export(server, b"\xff\xff\xff not protobuf", ingest_key)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ExportTraceServiceRequest" in refused.value.details()


def test_bad_spans_are_reported_in_partial_success_and_the_rest_stored(grpc_servers, ingest_key):
    server = grpc_servers()
    good = ExportTraceServiceRequest.FromString(one_span_request())
    bad = OtlpSpan(trace_id=b"\x01" * 5, span_id=b"\x02" * 8, name="short trace id", start_time_unix_nano=1)
    good.resource_spans[0].scope_spans[0].spans.append(bad)

    response = raw_export(server, good.SerializeToString(), ingest_key)

    assert response.partial_success.rejected_spans == 1
    assert "trace_id" in response.partial_success.error_message
    assert list(Span.objects.values_list("name", flat=True)) == ["raw"]


def test_a_key_over_its_rate_limit_gets_resource_exhausted_with_retry_info(grpc_servers, ingest_key):
    # 0.001 spans/s over an hour: a budget of 3.6 spans.
    server = grpc_servers(CTXLENS_INGEST_RATE_LIMIT="0.001", CTXLENS_INGEST_RATE_WINDOW="3600")
    for n in range(4):
        raw_export(server, one_span_request(span=f"{n + 1:016x}"), ingest_key)
    with pytest.raises(grpc.RpcError) as refused:
        raw_export(server, one_span_request(span="ff" * 8), ingest_key)

    # RESOURCE_EXHAUSTED with RetryInfo: the OTLP specification's throttling answer, retried.
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    info = RetryInfo.FromString(dict(refused.value.trailing_metadata())["google.rpc.retryinfo-bin"])
    assert 1 <= info.retry_delay.seconds <= 3
    assert Span.objects.count() == 4
    other_key = ApiKey.generate("another agent", scope="ingest")[1]
    raw_export(server, one_span_request(span="ff" * 8), other_key)  # other keys are not affected
    assert Span.objects.count() == 5


def test_the_otel_exporter_waits_out_the_rate_limit_and_loses_nothing(grpc_servers, ingest_key, caplog):
    server = grpc_servers(CTXLENS_INGEST_RATE_LIMIT="6", CTXLENS_INGEST_RATE_WINDOW="1")
    client = exporter(server, ingest_key, timeout=20)
    caplog.set_level(logging.WARNING, logger="opentelemetry.exporter.otlp.proto.grpc.exporter")
    batches = [record_turns(f"throttled-{n}") for n in range(5)]  # 6 spans each: every batch spends a window

    results = [client.export(batch) for batch in batches]

    assert results == [SpanExportResult.SUCCESS] * 5
    assert Span.objects.count() == 5 * span_count()
    assert "RESOURCE_EXHAUSTED" in caplog.text  # it was throttled, and retried as RetryInfo said


def test_a_request_over_the_size_limit_is_refused_and_stores_nothing(grpc_servers, ingest_key):
    server = grpc_servers(CTXLENS_MAX_INGEST_BYTES="20000")
    big = ExportTraceServiceRequest.FromString(one_span_request())
    big.resource_spans[0].scope_spans[0].spans[0].name = "x" * 50_000

    for gzip in (False, True):  # compressed it is tiny: the limit holds after decompression too
        with pytest.raises(grpc.RpcError) as refused:
            raw_export(server, big.SerializeToString(), ingest_key, gzip=gzip)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert Span.objects.count() == 0
    raw_export(server, one_span_request(), ingest_key)  # a request within the limit still goes in
    assert Span.objects.count() == 1
