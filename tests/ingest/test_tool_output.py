"""A tool span's result and whether it reports a failure (`payloads.tool_output`), from the shapes
the instrumentations record: plain values, OpenLLMetry's {"output": ..., "kwargs": ...} wrapper
around a value or an lc-serialised ToolMessage, OpenInference's {"type": "tool", "data": ...}."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pipeline.ingest.normalise.payloads import tool_output
from tests.langchain_support import get_weather, instrumented_in_process


def lc_message(kind: str, **kwargs) -> dict:
    return {"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", kind], "kwargs": kwargs}


ERROR = {"content": "Error: no such city", "type": "tool", "name": "get_time", "tool_call_id": "call_1",
         "status": "error"}
CASES = {
    "plain text": ("output.value", "Sunny", ("Sunny", False)),
    "a value in OpenLLMetry's wrapper": (
        "gen_ai.tool.call.result", {"output": "Sunny", "kwargs": {"name": "get_weather"}}, ("Sunny", False)),
    "a list in OpenLLMetry's wrapper": ("gen_ai.tool.call.result", {"output": [1, 2]}, ("[1, 2]", False)),
    "a tool's own dict with an output": (
        "output.value", {"output": "3 files", "exit_code": 2}, ('{"output": "3 files", "exit_code": 2}', False)),
    "a successful ToolMessage": (
        "gen_ai.tool.call.result", {"output": lc_message("ToolMessage", **{**ERROR, "status": "success"})},
        ("Error: no such city", False)),
    "a failed lc ToolMessage": (
        "gen_ai.tool.call.result", {"output": lc_message("ToolMessage", **ERROR), "kwargs": {}},
        ("Error: no such city", True)),
    "a failed OpenInference ToolMessage": (
        "output.value", {"type": "tool", "data": ERROR}, ("Error: no such city", True)),
    "a failed ToolMessage dumped bare": ("output.value", ERROR, ("Error: no such city", True)),
    "an lc AIMessage with an error status": (
        "gen_ai.tool.call.result", {"output": lc_message("AIMessage", content="hi", status="error")}, ("hi", False)),
    "tool data that says error but names no tool call": (
        "output.value", {"type": "tool", "content": "job 7 failed", "status": "error", "job": 7}, ("job 7 failed", False)),
}


@pytest.mark.parametrize(("key", "value", "expected"), CASES.values(), ids=CASES.keys())
def test_the_result_and_its_failure_are_read_from_each_shape(key, value, expected):
    assert tool_output({key: value if isinstance(value, str) else json.dumps(value)}) == expected


def test_openllmetry_keeps_a_tool_invoked_outside_langgraph_as_its_plain_result():
    """A tool called directly (an AgentExecutor, a chain): OpenLLMetry wraps its plain string."""
    from opentelemetry.instrumentation.langchain import LangchainInstrumentor

    memory = InMemorySpanExporter()
    with instrumented_in_process(LangchainInstrumentor(), SimpleSpanProcessor(memory)):
        get_weather.invoke({"city": "Paris"})
    (span,) = [s for s in memory.get_finished_spans() if "get_weather" in s.name]

    assert tool_output(dict(span.attributes)) == ("Sunny, 21C in Paris", False)
