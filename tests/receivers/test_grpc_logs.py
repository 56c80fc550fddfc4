"""OTLP/gRPC LogsService/Export: GenAI message events sent as logs over gRPC reach their LLM calls,
through the same flow as POST /v1/logs, with the key checked from the metadata before the
message is received (as TraceService/Export: test_grpc_refuses_before_reading_the_message)."""

from __future__ import annotations


import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs

from pipeline.models import ApiKey, Conversation, LLMCall, Round, SpanLog
from pipeline.models.apikeys import Scope
from tests.otlp_support import send_chat_with_its_details_event
from tests.receivers.http_wire import memory_kib
from tests.receivers.test_grpc_ingest import raw_export

pytestmark = pytest.mark.django_db(transaction=True)

LOGS_EXPORT = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
MiB = 1024 * 1024
BOMB = 60 * MiB  # about 60 KB of gzip on the wire


def raw_logs_export(server, body: bytes, key: str | None, *, gzip: bool = False) -> ExportLogsServiceResponse:
    return raw_export(server, body, key, gzip=gzip, method=LOGS_EXPORT, reply=ExportLogsServiceResponse)


def logs_request(*records: LogRecord) -> bytes:
    return ExportLogsServiceRequest(resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(log_records=records)])]) \
        .SerializeToString()


def user_message(content: str, trace_id: bytes = b"\xab" * 16) -> LogRecord:
    record = LogRecord(trace_id=trace_id, span_id=b"\xcd" * 8, time_unix_nano=1_763_800_000_000_000_000,
                       event_name="gen_ai.user.message")
    record.body.kvlist_value.values.add(key="content", value=AnyValue(string_value=content))
    return record


def test_the_otel_grpc_log_exporter_fills_the_messages_of_the_chat_span(grpc_servers):
    server = grpc_servers()
    key = ApiKey.generate("agent", scope=Scope.INGEST)[1]
    options = {"endpoint": f"127.0.0.1:{server.port}", "insecure": True, "headers": {"authorization": f"Bearer {key}"}}
    send_chat_with_its_details_event(OTLPSpanExporter(**options), OTLPLogExporter(**options))

    call = LLMCall.objects.get()
    assert call.input_messages == [{"role": "user", "parts": [{"type": "text", "content": "Hi?"}]}]
    assert call.finish_reason == "stop"
    assert SpanLog.objects.get().span_id == call.span_id
    assert (Round.objects.get().user_message, Conversation.objects.get().title) == ("Hi?", "Hi?")


@pytest.mark.parametrize("key", [None, "ctx_not-a-real-key"], ids=["no-key", "bad-key"])
def test_an_unauthorised_log_bomb_is_refused_without_being_inflated(grpc_servers, key):
    server = grpc_servers()
    with pytest.raises(grpc.RpcError) as warm_up:  # code paths loaded: what follows is the body's cost alone
        raw_logs_export(server, logs_request(user_message("Hi")), key, gzip=True)
    assert warm_up.value.code() == grpc.StatusCode.UNAUTHENTICATED
    before = memory_kib(server.process.pid)

    with pytest.raises(grpc.RpcError) as refused:
        raw_logs_export(server, logs_request(user_message("A" * BOMB)), key, gzip=True)

    after = memory_kib(server.process.pid)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert ("missing API key" if key is None else "invalid or revoked API key") in refused.value.details()
    assert (after["VmHWM"] - before["VmHWM"]) * 1024 < BOMB // 4, (before, after)
    assert SpanLog.objects.count() == 0


def test_logs_with_a_key_are_stored_and_bad_ids_reported_in_partial_success(grpc_servers):
    server = grpc_servers()
    key = ApiKey.generate("agent", scope=Scope.INGEST)[1]
    body = logs_request(user_message("Hi"), user_message("short id", trace_id=b"\x01" * 5))

    response = raw_logs_export(server, body, key, gzip=True)

    assert response.partial_success.rejected_log_records == 1
    assert "trace_id/span_id must be 16/8 bytes" in response.partial_success.error_message
    assert list(SpanLog.objects.values_list("trace_id", "event_name", "body")) == [
        ("ab" * 16, "gen_ai.user.message", {"content": "Hi"})]
    assert raw_logs_export(server, logs_request(user_message("Hi")), key) == ExportLogsServiceResponse()
    assert SpanLog.objects.count() == 1  # a re-send stores nothing twice
