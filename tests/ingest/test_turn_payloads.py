"""The turn's user message and final answer read from a root span's payload (`payloads.turn_*`).

The LangGraph cases are the graph spans the real instrumentations record for a ReAct agent
(captured in process); the rest are the LangChain message shapes written out by hand.
"""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pipeline.ingest.normalise.payloads import turn_input, turn_output
from tests.langchain_support import instrumented_in_process, react_agent

QUESTION, ANSWER = "What's the weather in Paris?", "It is sunny and 21C in Paris."


def _graph_span_attributes(instrumentor, graph_span: str, question) -> dict:
    memory = InMemorySpanExporter()
    with instrumented_in_process(instrumentor, SimpleSpanProcessor(memory)):
        react_agent([
            AIMessage(content="", tool_calls=[{"id": "call_1", "name": "get_weather", "args": {"city": "Paris"}}]),
            AIMessage(content=[{"type": "text", "text": ANSWER}]),
        ]).invoke({"messages": [question]})
    return dict(next(s for s in memory.get_finished_spans() if s.name == graph_span).attributes)


@pytest.mark.parametrize("question", [HumanMessage(QUESTION), {"role": "user", "content": QUESTION}, ("user", QUESTION)],
                         ids=["message", "role-dict", "tuple"])
@pytest.mark.parametrize("instrumentation", ["openinference", "openllmetry"])
def test_it_reads_a_langgraph_agents_state(instrumentation, question):
    if instrumentation == "openinference":
        from openinference.instrumentation.langchain import LangChainInstrumentor

        attrs = _graph_span_attributes(LangChainInstrumentor(), "LangGraph", question)
    else:
        from opentelemetry.instrumentation.langchain import LangchainInstrumentor

        # The root span before OpenLLMetry wrapped Pregel.stream in an invoke_agent span.
        attrs = _graph_span_attributes(LangchainInstrumentor(), "LangGraph.workflow", question)
    assert (turn_input(attrs), turn_output(attrs)) == (QUESTION, ANSWER)


def _lc(cls: str, **kwargs) -> dict:
    return {"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", cls], "kwargs": kwargs}


HISTORY = [
    {"type": "human", "data": {"content": "Hi"}},
    {"type": "ai", "data": {"content": "Hello!"}},
    {"type": "human", "data": {"content": [{"type": "text", "text": QUESTION}]}},
]


@pytest.mark.parametrize(("attrs", "expected"), [
    ({"input.value": json.dumps({"messages": HISTORY})}, QUESTION),
    ({"input.value": json.dumps({"messages": [_lc("SystemMessage", content="Be brief."),
                                              _lc("HumanMessage", content=QUESTION)]})}, QUESTION),
    ({"traceloop.entity.input": json.dumps({"inputs": {"messages": [["system", "Be brief."], ["human", QUESTION]]},
                                            "tags": [], "metadata": {}})}, QUESTION),
    ({"input.value": json.dumps({"input": QUESTION, "chat_history": []})}, QUESTION),
    ({"input.value": QUESTION}, QUESTION),
    ({"input.value": json.dumps({"messages": [{"type": "system", "data": {"content": "Be brief."}}]})}, ""),
    ({"input.value": json.dumps({"topic": "weather", "steps": [1, 2]})}, ""),
], ids=["history", "lc-dumps", "traceloop-tuples", "input-key", "text", "no-human-message", "state-without-messages"])
def test_it_reads_the_user_message(attrs, expected):
    assert turn_input(attrs) == expected


@pytest.mark.parametrize(("attrs", "expected"), [
    ({"output.value": json.dumps({"messages": [*HISTORY, {"type": "ai", "data": {"content": ANSWER}}]})}, ANSWER),
    ({"traceloop.entity.output": json.dumps({"outputs": {"messages": [
        _lc("HumanMessage", content=QUESTION), _lc("AIMessage", content="", tool_calls=[{"name": "get_weather"}]),
        _lc("ToolMessage", content="Sunny", tool_call_id="call_1"), _lc("AIMessage", content=ANSWER),
    ]}, "kwargs": {}})}, ANSWER),
    ({"output.value": json.dumps({"messages": [
        *HISTORY, {"type": "ai", "data": {"content": "", "tool_calls": [{"name": "get_weather", "id": "c"}]}},
    ]})}, ""),
    ({"output.value": json.dumps({"type": "ai", "data": {"content": [{"type": "text", "text": ANSWER},
                                                                     {"type": "tool_use", "id": "c"}]}})}, ANSWER),
    ({"output.value": json.dumps({"messages": [{"role": "user", "content": QUESTION},
                                               {"role": "assistant", "content": ANSWER}]})}, ANSWER),
    ({"output.value": json.dumps({"output": ANSWER})}, ANSWER),
    ({"output.value": json.dumps({"report": {"score": 3}})}, ""),
], ids=["openinference-state", "traceloop-lc-dumps", "only-tool-calls", "one-message-with-blocks", "role-dicts",
        "output-key", "state-without-messages"])
def test_it_reads_the_final_answer(attrs, expected):
    assert turn_output(attrs) == expected
