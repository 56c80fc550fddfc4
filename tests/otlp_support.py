"""Helpers for the OTLP tests (their uvicorn is conftest's otlp_server): keys, row counts, waits."""

from __future__ import annotations

import json
import time

from django.db.models import Q
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import LogExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter

from pipeline.models import ApiKey, Conversation, LLMCall, Round, Span, ToolCall
from pipeline.models.apikeys import Scope

PROTOBUF, JSON = "application/x-protobuf", "application/json"


def wait_for_deferred_tokens(seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while LLMCall.objects.filter(tokens_pending=True).exists() or ToolCall.objects.filter(
            Q(tokens_pending=True) | Q(levels_pending=True)).exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"the server left token counts pending for {seconds} s")
        time.sleep(0.1)


def make_key(scope: str = Scope.INGEST) -> str:
    return ApiKey.generate("test", scope=scope)[1]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def row_counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in (Span, Conversation, Round, LLMCall, ToolCall)}


def send_chat_with_its_details_event(spans: SpanExporter, logs: LogExporter) -> None:
    """With the OTel SDK, through these exporters: one chat span (user "Hi?", answer "Hello.",
    finish reason "stop") whose messages come only on the current GenAI event, one log record
    tied to the span."""
    resource = Resource.create({"service.name": "events-agent"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    tracer, logger = tracer_provider.get_tracer("t"), logger_provider.get_logger("t")
    with tracer.start_as_current_span("chat gpt-4o", attributes={
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
        "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 3,
    }):
        logger.emit(event_name="gen_ai.client.inference.operation.details", attributes={
            "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "Hi?"}]}]),
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "Hello."}],
                                                   "finish_reason": "stop"}]),
        })
    logger_provider.shutdown()
    tracer_provider.shutdown()
