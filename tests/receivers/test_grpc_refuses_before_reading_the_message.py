"""OTLP/gRPC checks the key from the metadata before it receives the message: a gzip bomb sent
without a valid key is refused without ever being inflated (as OTLP/HTTP refuses from the
headers: test_otlp_refuses_before_reading_the_body)."""

from __future__ import annotations

import grpc
import pytest
from google.rpc.error_details_pb2 import RetryInfo
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from pipeline.models import ApiKey, Span
from pipeline.models.apikeys import Scope
from tests.receivers.http_wire import memory_kib
from tests.receivers.test_grpc_ingest import EXPORT, one_span_request, raw_export

pytestmark = pytest.mark.django_db(transaction=True)

MiB = 1024 * 1024
BOMB = 60 * MiB  # about 60 KB of gzip on the wire


def bomb(size: int) -> bytes:
    """An Export request of one span with a string attribute of `size` bytes: it gzips to ~1/1000."""
    request = ExportTraceServiceRequest.FromString(one_span_request(name="bomb"))
    span = request.resource_spans[0].scope_spans[0].spans[0]
    span.attributes.append(KeyValue(key="padding", value=AnyValue(string_value="A" * size)))
    return request.SerializeToString()


@pytest.mark.parametrize("key_scope, code, message", [
    (None, grpc.StatusCode.UNAUTHENTICATED, "missing API key"),
    ("ctx_not-a-real-key", grpc.StatusCode.UNAUTHENTICATED, "invalid or revoked API key"),
    (Scope.READ, grpc.StatusCode.PERMISSION_DENIED, "does not have the 'ingest' scope"),
], ids=["no-key", "bad-key", "read-only-key"])
def test_an_unauthorised_gzip_bomb_is_refused_without_being_inflated(grpc_servers, key_scope, code, message):
    server = grpc_servers()
    key = key_scope if key_scope in (None, "ctx_not-a-real-key") else ApiKey.generate("reader", scope=key_scope)[1]
    body = bomb(BOMB)
    with pytest.raises(grpc.RpcError) as warm_up:  # code paths loaded: what follows is the body's cost alone
        raw_export(server, one_span_request(), key, gzip=True)
    assert warm_up.value.code() == code
    before = memory_kib(server.process.pid)

    with pytest.raises(grpc.RpcError) as refused:
        raw_export(server, body, key, gzip=True)

    after = memory_kib(server.process.pid)
    assert refused.value.code() == code
    assert message in refused.value.details()
    # Inflating the message took the server's peak memory up by about three times its size (the
    # inflated buffer, its copy into Python bytes, the slices); refused from the metadata, by nothing.
    assert (after["VmHWM"] - before["VmHWM"]) * 1024 < BOMB // 4, (before, after)
    assert Span.objects.count() == 0


def test_a_bomb_past_the_receive_limit_without_a_key_is_unauthenticated_not_too_large(grpc_servers):
    # gRPC refuses a message that inflates past its receive limit (CTXLENS_MAX_INGEST_BYTES plus a
    # MiB) with RESOURCE_EXHAUSTED while it inflates it: an answer that says the key was checked
    # before the message was received, or it was inflated.
    server = grpc_servers(CTXLENS_MAX_INGEST_BYTES="1000000")
    body = bomb(3 * MiB)

    for key in (None, "ctx_not-a-real-key"):
        with pytest.raises(grpc.RpcError) as refused:
            raw_export(server, body, key, gzip=True)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value.details()

    with pytest.raises(grpc.RpcError) as inflated:  # with a key, gRPC inflates it and stops past its limit
        raw_export(server, body, ApiKey.generate("agent", scope=Scope.INGEST)[1], gzip=True)
    assert inflated.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert Span.objects.count() == 0


def test_a_key_over_its_rate_budget_is_throttled_before_its_message_is_received(grpc_servers):
    # 0.001 spans/s over an hour: a budget of 3.6 spans, spent by four one-span requests.
    server = grpc_servers(CTXLENS_INGEST_RATE_LIMIT="0.001", CTXLENS_INGEST_RATE_WINDOW="3600",
                          CTXLENS_MAX_INGEST_BYTES="1000000")
    key = ApiKey.generate("agent", scope=Scope.INGEST)[1]
    for n in range(4):
        raw_export(server, one_span_request(span=f"{n + 1:016x}"), key)

    with pytest.raises(grpc.RpcError) as refused:  # a message gRPC would refuse as too large once inflated
        raw_export(server, bomb(3 * MiB), key, gzip=True)

    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "over its ingest rate limit" in refused.value.details()
    info = RetryInfo.FromString(dict(refused.value.trailing_metadata())["google.rpc.retryinfo-bin"])
    assert 1 <= info.retry_delay.seconds <= 3
    assert Span.objects.count() == 4


def test_a_gzip_request_with_a_key_is_stored(grpc_servers):
    server = grpc_servers()
    key = ApiKey.generate("agent", scope=Scope.INGEST)[1]

    assert raw_export(server, one_span_request(name="compressed"), key, gzip=True) == ExportTraceServiceResponse()

    assert list(Span.objects.values_list("name", "source")) == [("compressed", "grpc")]


@pytest.mark.parametrize("method", [EXPORT, "/opentelemetry.proto.collector.logs.v1.LogsService/Export"])
def test_a_call_without_a_message_is_refused_as_grpc_refuses_a_unary_one(grpc_servers, method):
    server = grpc_servers()
    key = ApiKey.generate("agent", scope=Scope.INGEST)[1]
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = channel.stream_unary(method, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as refused:
            call(iter(()), metadata=(("authorization", f"Bearer {key}"),), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert f'"{method}" requires exactly one request message' in refused.value.details()
