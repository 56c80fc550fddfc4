"""Tool spans exactly as the design documents' observability wrapper emits them, through the OTel
SDK and the OTLP/HTTP exporter to a live uvicorn: the tools are stored and shown as tools.

`execute_with_observability` below is the documents' wrapper (seed 000, "集成到工具执行") with
one change: the tracer comes from this test's provider instead of the global one, and every
call is sampled. On success it sets tool.name, tool.success and tool.duration_ms; on failure
only tool.success=false, tool.error and a recorded exception, so the name is the span name's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

from pipeline.models import Span, ToolCall
from pipeline.models.apikeys import Scope
from tests.api_client import client_with
from tests.otlp_support import auth, make_key

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def seed_tracer(server) -> Iterator[tuple[Tracer, InMemorySpanExporter]]:
    """A tracer exporting over OTLP/HTTP to `server`, and a copy of every span it ended."""
    copy = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "ba-agent"}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers=auth(make_key())))
    )
    provider.add_span_processor(SimpleSpanProcessor(copy))
    try:
        yield provider.get_tracer("ba_agent.observability"), copy
    finally:
        assert provider.force_flush(10_000)
        provider.shutdown()


def execute_with_observability(tool_func: Callable, tool_name: str, tracer: Tracer) -> Callable:
    def wrapper(*args, **kwargs):
        with tracer.start_as_current_span(f"tool.{tool_name}") as span:
            start_time = time.time()

            try:
                result = tool_func(*args, **kwargs)

                span.set_attribute("tool.name", tool_name)
                span.set_attribute("tool.success", True)
                span.set_attribute("tool.duration_ms", (time.time() - start_time) * 1000)

                return result

            except Exception as e:
                span.set_attribute("tool.success", False)
                span.set_attribute("tool.error", str(e))
                span.record_exception(e)
                raise

    return wrapper


def query_sales(quarter: str) -> str:
    if quarter not in ("Q1", "Q2", "Q3", "Q4"):
        raise ValueError(f"unknown quarter {quarter!r}")
    return f"{quarter} revenue: 1.2M"


def read_api():
    return client_with(make_key(Scope.READ))


def test_a_successful_seed_tool_span_is_a_tool_call_with_its_measured_duration(otlp_server):
    with seed_tracer(otlp_server) as (tracer, copy):
        assert execute_with_observability(query_sales, "query_sales", tracer)("Q3") == "Q3 revenue: 1.2M"

    (sent,) = copy.get_finished_spans()
    call = ToolCall.objects.get()
    assert (call.tool_name, call.success, call.status) == ("query_sales", True, "ok")
    assert call.duration_ms == pytest.approx(sent.attributes["tool.duration_ms"])
    assert Span.objects.get().kind == "tool"
    (stats,) = read_api().get("/api/tools/stats/").json()
    assert (stats["tool_name"], stats["calls"], stats["successes"]) == ("query_sales", 1, 1)


def test_a_failed_seed_tool_span_takes_its_name_from_the_span_name(otlp_server):
    with seed_tracer(otlp_server) as (tracer, _):
        wrapped = execute_with_observability(query_sales, "query_sales", tracer)
        with pytest.raises(ValueError):
            wrapped("Q5")
        wrapped("Q1")

    failed = ToolCall.objects.get(success=False)
    assert (failed.tool_name, failed.status) == ("query_sales", "error")
    assert failed.error_message == "unknown quarter 'Q5'"  # tool.error, not the status's "ValueError: ..."
    assert failed.error_type == "ValueError"  # the recorded exception's type
    (stats,) = read_api().get("/api/tools/stats/").json()
    assert (stats["tool_name"], stats["calls"], stats["successes"], stats["failures"]) == ("query_sales", 2, 1, 1)


def test_tool_metrics_fields_on_a_seed_span_are_stored_and_served(otlp_server):
    """An agent that records the documents' ToolMetrics on the span as tool.* attributes."""
    with seed_tracer(otlp_server) as (tracer, _):
        with tracer.start_as_current_span("tool.web_search") as span:
            span.set_attribute("tool.success", False)
            span.set_attribute("tool.error", "search provider answered 429")
            span.set_attribute("tool.error_code", "HTTP_429")
            span.set_attribute("tool.retry_count", 2)
            span.set_attribute("tool.output_level", "BRIEF")
            span.set_attribute("tool.input_tokens", 17)
            span.set_attribute("tool.output_tokens", 230)
            span.set_attribute("tool.duration_ms", 812.5)

    call = ToolCall.objects.get()
    detail = read_api().get(f"/api/conversations/{call.conversation_id}/").json()
    (served,) = detail["rounds"][0]["tool_calls"]
    assert served["tool_name"] == "web_search"
    assert (served["success"], served["error_code"], served["error_message"]) == (
        False, "HTTP_429", "search provider answered 429")
    assert (served["retry_count"], served["output_level"]) == (2, "brief")
    assert (served["input_tokens"], served["observation_tokens"], served["duration_ms"]) == (17, 230, 812.5)
