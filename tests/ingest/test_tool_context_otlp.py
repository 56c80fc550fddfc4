"""A tool result's context cost over OTLP, exported by the real SDK: when a later turn's spans
arrive before the span that names their conversation (they wait in a placeholder, then merge),
and when a call's messages arrive as log events after its span."""

from __future__ import annotations

import json

import pytest
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from pipeline.models import Conversation, LLMCall, ToolCall
from tests.ingest.test_tool_context import expected, share
from tests.otlp_support import auth, make_key

pytestmark = pytest.mark.django_db(transaction=True)

RESULT = "Oslo: cloudy, 12 °C, wind 5 m/s from the west; tomorrow rain. " * 3
ASK = {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_oslo", "name": "get_weather",
                                       "arguments": {"city": "Oslo"}}]}
HISTORY = [{"role": "user", "parts": [{"type": "text", "content": "Weather in Oslo?"}]}, ASK,
           {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_oslo", "response": RESULT}]}]


def provider(server, key: str, *, one_by_one: bool) -> TracerProvider:
    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers=auth(key), timeout=10)
    provider = TracerProvider(resource=Resource.create({"service.name": "weather-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter) if one_by_one else BatchSpanProcessor(exporter))
    return provider


def chat(tracer, messages: list[dict], input_tokens: int, output: list[dict]) -> None:
    with tracer.start_as_current_span("chat gpt-4o", kind=SpanKind.CLIENT, attributes={
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o", "gen_ai.provider.name": "openai",
        "gen_ai.usage.input_tokens": input_tokens, "gen_ai.usage.output_tokens": 12,
        "gen_ai.input.messages": json.dumps(messages), "gen_ai.output.messages": json.dumps(output),
    }):
        pass


def turn(tracer, question: str, body) -> None:
    with tracer.start_as_current_span("invoke_agent weather", attributes={
        "gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "otlp-weather",
        "ctxlens.round.user_message": question,
    }):
        body()


def test_a_later_turn_that_waited_in_a_placeholder_adds_its_carries_when_it_merges(otlp_server):
    key = make_key()
    first = provider(otlp_server, key, one_by_one=False)
    tracer = first.get_tracer("weather-agent")

    def ask_and_read() -> None:
        chat(tracer, HISTORY[:1], 40, [ASK])
        with tracer.start_as_current_span("execute_tool get_weather", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather",
            "gen_ai.tool.call.id": "call_oslo", "gen_ai.tool.call.result": RESULT,
        }):
            pass
        chat(tracer, HISTORY, 900, [{"role": "assistant", "parts": [{"type": "text", "content": "Cloudy."}]}])

    turn(tracer, "Weather in Oslo?", ask_and_read)
    assert first.force_flush(10_000)
    first.shutdown()
    assert ToolCall.objects.get().context_carries == 1

    # The next turn, one request per span, children first: its chat call lands in a placeholder
    # conversation (named after its trace) until the turn's root names the conversation.
    second = provider(otlp_server, key, one_by_one=True)
    tracer = second.get_tracer("weather-agent")
    later = [*HISTORY, {"role": "assistant", "parts": [{"type": "text", "content": "Cloudy."}]},
             {"role": "user", "parts": [{"type": "text", "content": "And tomorrow?"}]}]
    turn(tracer, "And tomorrow?", lambda: chat(tracer, later, 1300, [
        {"role": "assistant", "parts": [{"type": "text", "content": "Rain."}]}]))
    second.shutdown()

    assert Conversation.objects.count() == 1
    calls = [c for c in LLMCall.objects.order_by("started_at") if share(c, "call_oslo")]
    assert [c.input_tokens for c in calls] == [900, 1300]
    tool = ToolCall.objects.get()
    assert (tool.context_tokens, tool.context_carries, tool.context_cost_usd) == expected(calls, "call_oslo")


def test_a_call_whose_messages_arrive_as_log_events_counts_once_they_do(otlp_server):
    key = make_key()
    resource = Resource.create({"service.name": "events-agent"})
    tracer_provider = provider(otlp_server, key, one_by_one=True)
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(
        OTLPLogExporter(endpoint=f"{otlp_server.url}/v1/logs", headers=auth(key))))
    tracer, logger = tracer_provider.get_tracer("t"), logger_provider.get_logger("t")

    def ask_and_read() -> None:
        chat(tracer, HISTORY[:1], 40, [ASK])
        with tracer.start_as_current_span("execute_tool get_weather", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather",
            "gen_ai.tool.call.id": "call_oslo", "gen_ai.tool.call.result": RESULT,
        }):
            pass
        with tracer.start_as_current_span("chat gpt-4o", kind=SpanKind.CLIENT, attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o", "gen_ai.provider.name": "openai",
            "gen_ai.usage.input_tokens": 900, "gen_ai.usage.output_tokens": 12,
        }):
            logger.emit(event_name="gen_ai.client.inference.operation.details", attributes={
                "gen_ai.input.messages": json.dumps(HISTORY),
                "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                    {"type": "text", "content": "Cloudy."}], "finish_reason": "stop"}]),
            })

    turn(tracer, "Weather in Oslo?", ask_and_read)  # the log record goes out before its span ends
    logger_provider.shutdown()
    tracer_provider.shutdown()

    [carrier] = [c for c in LLMCall.objects.all() if share(c, "call_oslo")]
    assert carrier.input_tokens == 900
    tool = ToolCall.objects.get()
    assert (tool.context_tokens, tool.context_carries, tool.context_cost_usd) == expected([carrier], "call_oslo")
