"""Agent turns recorded with the real OpenTelemetry SDK, in the GenAI conventions plus ctxlens's own.

`record_turns()` returns finished ReadableSpans (invoke_agent → chat, execute_tool, compress_context,
activate_skill) that any real OTLP exporter can send.
"""

from __future__ import annotations

import json

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from pipeline import semconv as sc


def record_turns(conversation_id: str, turns: int = 1, tools_per_turn: int = 2, *,
                 service: str = "test-agent", payload: str = "") -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service, "deployment.environment": "test"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("tests.agent", "1.2.3")
    for turn in range(turns):
        with tracer.start_as_current_span(
            "invoke_agent research-bot", kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "invoke_agent", sc.CONVERSATION_ID: conversation_id,
                "gen_ai.agent.name": "research-bot", sc.ROUND_USER_MESSAGE: f"question {turn} {payload}",
            },
        ) as root:
            with tracer.start_as_current_span(
                "chat gpt-4o", kind=SpanKind.CLIENT,
                attributes={
                    "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
                    "gen_ai.response.model": "gpt-4o-2024-08-06", "gen_ai.provider.name": "openai",
                    "gen_ai.usage.input_tokens": 1200 + turn, "gen_ai.usage.output_tokens": 80,
                    "gen_ai.response.finish_reasons": ["tool_call"],
                    "gen_ai.input.messages": json.dumps(
                        [{"role": "user", "parts": [{"type": "text", "content": f"question {turn}"}]}]),
                    "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                        {"type": "tool_call", "id": f"call_{turn}_{i}", "name": "search",
                         "arguments": {"q": f"q{i}"}} for i in range(tools_per_turn)], "finish_reason": "tool_call"}]),
                    sc.CONTEXT_WINDOW: 128000, sc.CONTEXT_TOKENS: 1200 + turn,
                    sc.CONTEXT_COMPOSITION: json.dumps({"system": 200, "user": 1000 + turn, "free": 126800}),
                },
            ) as chat:
                chat.add_event("gen_ai.content.note", {"note": "streamed", "chunks": 3})
            for i in range(tools_per_turn):
                with tracer.start_as_current_span(
                    "execute_tool search", kind=SpanKind.INTERNAL,
                    links=[Link(chat.get_span_context(), {"link.reason": "called by"})],
                    attributes={
                        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search",
                        "gen_ai.tool.call.id": f"call_{turn}_{i}",
                        "gen_ai.tool.call.arguments": json.dumps({"q": f"q{i}"}),
                        "gen_ai.tool.call.result": f"result {i} " + "ü" * 20,
                        sc.TOOL_OUTPUT_LEVEL: "standard", sc.TOOL_RETRY_COUNT: i,
                    },
                ) as tool:
                    if i == 1:
                        tool.set_status(Status(StatusCode.ERROR, "search backend timed out"))
                        tool.set_attribute("error.type", "timeout")
                        tool.set_attribute(sc.TOOL_ERROR_TYPE, "timeout")
            with tracer.start_as_current_span(
                "compress_context", attributes={
                    sc.SPAN_KIND: sc.SPAN_KIND_COMPRESSION, sc.COMPRESSION_STRATEGY: "truncate",
                    sc.COMPRESSION_TOKENS_BEFORE: 110000, sc.COMPRESSION_TOKENS_AFTER: 60000,
                    sc.COMPRESSION_MESSAGES_BEFORE: 40, sc.COMPRESSION_MESSAGES_AFTER: 12,
                    sc.COMPRESSION_DROPPED: json.dumps([1, 2, 3]),
                },
            ):
                pass
            with tracer.start_as_current_span(
                "activate_skill pdf", attributes={
                    sc.SPAN_KIND: sc.SPAN_KIND_SKILL, sc.SKILL_NAME: "pdf", sc.SKILL_LEVEL: 2,
                    sc.SKILL_CHAIN: json.dumps(["pdf"]), sc.SKILL_DEPTH: 1, sc.SKILL_TOKENS: 900,
                },
            ):
                pass
            root.set_attribute(sc.ROUND_FINAL_ANSWER, f"answer {turn}")
            root.set_status(Status(StatusCode.OK))
    provider.shutdown()
    return list(memory.get_finished_spans())


def span_count(turns: int = 1, tools_per_turn: int = 2) -> int:
    return turns * (4 + tools_per_turn)
