"""POST /v1/traces with the real OpenTelemetry SDK and OTLP/HTTP exporter, and OTLP/JSON by hand."""

from __future__ import annotations

import gzip
import json
import time

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from pipeline.models import Conversation, LLMCall, Round, Span, ToolCall
from tests.otlp_support import JSON, PROTOBUF, auth, make_key, row_counts

pytestmark = pytest.mark.django_db(transaction=True)

TOOL_CALLS = [{"type": "tool_call", "id": "call_w1", "name": "get_weather", "arguments": {"city": "Paris"}}]


def _provider(server, key: str, compression: Compression, batch: bool) -> TracerProvider:
    exporter = OTLPSpanExporter(
        endpoint=f"{server.url}/v1/traces", headers=auth(key), compression=compression, timeout=10
    )
    provider = TracerProvider(resource=Resource.create({"service.name": "weather-agent"}))
    provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    return provider


def _run_turn(provider: TracerProvider, *, failing_tool: bool = False) -> str:
    """One agent turn as the GenAI conventions describe it: invoke_agent > chat, execute_tool, chat."""
    tracer = provider.get_tracer("test-agent")
    with tracer.start_as_current_span("invoke_agent weather", attributes={
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "weather",
        "gen_ai.conversation.id": "sdk-conv-1", "ctxlens.round.user_message": "Weather in Paris?",
    }) as root:
        with tracer.start_as_current_span("chat gpt-4o", kind=SpanKind.CLIENT, attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
            "gen_ai.response.model": "gpt-4o-2024-08-06", "gen_ai.provider.name": "openai",
            "gen_ai.usage.input_tokens": 42, "gen_ai.usage.output_tokens": 7,
            "gen_ai.usage.cache_read.input_tokens": 10, "gen_ai.usage.reasoning.output_tokens": 3,
            "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}]}]),
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": TOOL_CALLS, "finish_reason": "tool_call"}]),
        }):
            time.sleep(0.002)
        with tracer.start_as_current_span("execute_tool get_weather", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather",
            "gen_ai.tool.call.id": "call_w1", "gen_ai.tool.call.arguments": json.dumps({"city": "Paris"}),
            "gen_ai.tool.call.result": "Sunny, 21C",
        }) as tool:
            if failing_tool:
                tool.set_status(Status(StatusCode.ERROR, "weather service down"))
                tool.set_attribute("error.type", "TimeoutError")
        with tracer.start_as_current_span("chat gpt-4o", kind=SpanKind.CLIENT, attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
            "gen_ai.usage.input_tokens": 60, "gen_ai.usage.output_tokens": 12,
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "Sunny."}]}]),
        }):
            pass
        return format(root.get_span_context().trace_id, "032x")


@pytest.mark.parametrize("compression", [Compression.Gzip, Compression.NoCompression, Compression.Deflate])
def test_sdk_exporter_stores_a_tool_calling_turn(otlp_server, compression):
    provider = _provider(otlp_server, make_key(), compression, batch=True)
    trace_id = _run_turn(provider)
    assert provider.force_flush(10_000)
    provider.shutdown()

    conversation = Conversation.objects.get(external_id="sdk-conv-1")
    assert conversation.service_name == "weather-agent"
    assert conversation.agent_name == "weather"
    assert (conversation.round_count, conversation.llm_call_count, conversation.tool_call_count) == (1, 2, 1)
    assert (conversation.input_tokens, conversation.output_tokens) == (102, 19)
    assert conversation.model == "gpt-4o"  # the newest call's model
    round_ = Round.objects.get(conversation=conversation)
    assert (round_.trace_id, round_.status, round_.user_message, round_.final_answer) == (
        trace_id, "ok", "Weather in Paris?", "Sunny.")
    first, second = LLMCall.objects.filter(round=round_).order_by("step")
    assert (first.model, first.request_model, first.provider) == ("gpt-4o-2024-08-06", "gpt-4o", "openai")
    assert (first.input_tokens, first.output_tokens, first.cache_read_tokens, first.reasoning_tokens) == (42, 7, 10, 3)
    assert first.finish_reason == "tool_call"
    assert (second.step, second.input_tokens, second.output_tokens) == (1, 60, 12)
    tool = ToolCall.objects.get(round=round_)
    assert (tool.tool_name, tool.tool_call_id, tool.arguments, tool.observation, tool.success) == (
        "get_weather", "call_w1", {"city": "Paris"}, "Sunny, 21C", True)
    assert tool.llm_call == first
    assert Span.objects.filter(trace_id=trace_id).count() == 4


def test_spans_exported_one_by_one_children_first_give_the_same_turn(otlp_server):
    provider = _provider(otlp_server, make_key(), Compression.NoCompression, batch=False)
    _run_turn(provider, failing_tool=True)  # SimpleSpanProcessor: one request per span, root last
    provider.shutdown()

    conversation = Conversation.objects.get(external_id="sdk-conv-1")
    assert Conversation.objects.count() == 1  # the trace placeholder was folded into the named one
    assert (conversation.llm_call_count, conversation.tool_call_count, conversation.error_count) == (2, 1, 1)
    tool = ToolCall.objects.get()
    assert (tool.success, tool.error_type, tool.error_message) == (False, "TimeoutError", "weather service down")
    assert tool.llm_call == LLMCall.objects.get(step=0)
    assert Round.objects.get().status == "ok"


def test_resent_batch_changes_nothing(otlp_server):
    key = make_key()
    provider = _provider(otlp_server, key, Compression.Gzip, batch=True)
    _run_turn(provider)
    provider.force_flush(10_000)
    before = row_counts()
    request = trace_service_pb2.ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    stored = Span.objects.get(name="execute_tool get_weather")
    span.trace_id, span.span_id = bytes.fromhex(stored.trace_id), bytes.fromhex(stored.span_id)
    span.name, span.start_time_unix_nano = "something else", 1
    reply = httpx.post(f"{otlp_server.url}/v1/traces", content=request.SerializeToString(),
                       headers={**auth(key), "Content-Type": PROTOBUF})
    assert reply.status_code == 200
    assert row_counts() == before
    assert Span.objects.get(span_id=stored.span_id).name == "execute_tool get_weather"  # first write wins
    provider.shutdown()


def _json_request(trace_hex: str, root_hex: str, tool_hex: str) -> dict:
    """OTLP/JSON as the spec maps it: hex ids (any case), int64 as strings, integer enums."""
    def kv(key, value):
        return {"key": key, "value": value}

    start = time.time_ns() - 5_000_000_000
    return {"resourceSpans": [{
        "resource": {"attributes": [kv("service.name", {"stringValue": "json-agent"})]},
        "scopeSpans": [{"scope": {"name": "handmade", "version": "1"}, "spans": [
            {"traceId": trace_hex, "spanId": tool_hex, "parentSpanId": root_hex, "name": "execute_tool search",
             "kind": 1, "startTimeUnixNano": str(start + 2_000_000), "endTimeUnixNano": str(start + 9_000_000),
             "attributes": [kv("gen_ai.operation.name", {"stringValue": "execute_tool"}),
                            kv("gen_ai.tool.name", {"stringValue": "search"}),
                            kv("gen_ai.tool.call.id", {"stringValue": "call_j1"}),
                            kv("gen_ai.tool.call.arguments", {"kvlistValue": {"values": [
                                kv("q", {"stringValue": "otlp"}), kv("limit", {"intValue": "5"})]}}),
                            kv("gen_ai.tool.call.result", {"stringValue": "3 results"}),
                            kv("ctxlens.tool.retry_count", {"intValue": 2}),
                            kv("ctxlens.tool.cache_hit", {"boolValue": False})],
             "status": {"code": 2, "message": "partial"},
             "events": [{"name": "exception", "timeUnixNano": str(start + 8_000_000), "attributes": [
                 kv("exception.type", {"stringValue": "SearchError"})]}]},
            {"traceId": trace_hex, "spanId": root_hex, "name": "invoke_agent", "kind": 1,
             "startTimeUnixNano": start, "endTimeUnixNano": str(start + 10_000_000),
             "attributes": [kv("gen_ai.operation.name", {"stringValue": "invoke_agent"}),
                            kv("session.id", {"stringValue": "json-session"}),
                            kv("input.value", {"stringValue": "find otlp"})],
             "status": {"code": 1}, "unknownField": {"ignored": True}},
        ]}],
    }]}


@pytest.mark.parametrize("compress", [False, True])
def test_otlp_json_by_hand_is_stored_and_answered_in_json(otlp_server, compress):
    trace_hex, root_hex, tool_hex = "5B8EFFF798038103D269B633813FC60C", "EEE19B7EC3C1B174", "EEE19B7EC3C1B173"
    body = json.dumps(_json_request(trace_hex, root_hex, tool_hex)).encode()
    headers = {**auth(make_key()), "Content-Type": "application/json; charset=utf-8"}
    if compress:
        body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
    reply = httpx.post(f"{otlp_server.url}/v1/traces", content=body, headers=headers)

    assert (reply.status_code, reply.headers["content-type"], reply.json()) == (200, JSON, {})
    conversation = Conversation.objects.get(external_id="json-session")
    assert (conversation.service_name, conversation.title, conversation.error_count) == ("json-agent", "find otlp", 1)
    tool = ToolCall.objects.get(trace_id=trace_hex.lower())
    assert (tool.span_id, tool.tool_name, tool.tool_call_id) == (tool_hex.lower(), "search", "call_j1")
    assert (tool.arguments, tool.observation, tool.retry_count, tool.cache_hit) == ({"q": "otlp", "limit": 5}, "3 results", 2, False)
    assert (tool.success, tool.error_type, tool.error_message) == (False, "SearchError", "partial")
    assert tool.duration_ms == pytest.approx(7.0)
    span = Span.objects.get(span_id=root_hex.lower())
    assert (span.parent_span_id, span.status_code, span.scope_name) == ("", 1, "handmade")


def test_an_exporter_keeps_its_connection_between_exports(otlp_server):
    """A reply to a whole export leaves the connection open for the next one (a new connection per
    export costs a TCP handshake, and a TLS one behind a proxy)."""
    key = make_key()
    with httpx.Client(base_url=otlp_server.url, timeout=60) as client:
        replies = [client.post(path, content=b"", headers={**auth(key), "Content-Type": PROTOBUF})
                   for path in ("/v1/traces", "/v1/logs", "/v1/metrics")]
    assert [reply.status_code for reply in replies] == [200, 200, 200]
    assert [reply.headers.get("connection") for reply in replies] == [None, None, None]
