"""A real LangGraph ReAct agent → instrumentation → OTLP exporter → live daphne → the stored turns.

LangGraph's `create_react_agent` puts the graph state on the root span: `{"messages": [...]}` in,
the whole final state out. The turn must read as the user's question and the agent's answer,
not as that JSON, under OpenInference and OpenLLMetry alike. Two turns on one thread (a
checkpointer keeps the history): a tool call then an answer, then an answer in content blocks.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import ToolException, tool
from langgraph.checkpoint.memory import InMemorySaver

from pipeline.models import Conversation, LLMCall, Round, ToolCall
from tests.langchain_support import instrumented, react_agent
from tests.otlp_support import make_key

pytestmark = pytest.mark.django_db(transaction=True)

QUESTION, FOLLOW_UP = "What's the weather in Paris?", "And should I take an umbrella?"
ANSWER, SECOND_ANSWER = "It is sunny and 21C in Paris.", "No umbrella needed today."


def _run_turns() -> list[str]:
    agent = react_agent([
        AIMessage(content="", tool_calls=[{"id": "call_abc123", "name": "get_weather", "args": {"city": "Paris"}}],
                  usage_metadata={"input_tokens": 42, "output_tokens": 7, "total_tokens": 49}),
        AIMessage(content=ANSWER, usage_metadata={"input_tokens": 60, "output_tokens": 12, "total_tokens": 72}),
        AIMessage(content=[{"type": "text", "text": SECOND_ANSWER}],
                  usage_metadata={"input_tokens": 80, "output_tokens": 6, "total_tokens": 86}),
    ], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "thread-7"}}
    first = agent.invoke({"messages": [HumanMessage(QUESTION)]}, config=config)
    second = agent.invoke({"messages": [{"role": "user", "content": FOLLOW_UP}]}, config=config)
    return [first["messages"][-1].text, second["messages"][-1].text]


def _assert_agent_turns() -> None:
    # OpenLLMetry also records building the agent (`create_agent react_agent`), a trace of its own.
    conversation = Conversation.objects.get(external_id="thread-7")
    assert conversation.title == QUESTION
    assert (conversation.round_count, conversation.llm_call_count, conversation.tool_call_count) == (2, 3, 1)
    assert (conversation.input_tokens, conversation.output_tokens, conversation.error_count) == (182, 25, 0)
    first, second = Round.objects.filter(conversation=conversation).order_by("started_at")
    assert (first.user_message, first.final_answer, first.status) == (QUESTION, ANSWER, "ok")
    assert (second.user_message, second.final_answer, second.status) == (FOLLOW_UP, SECOND_ANSWER, "ok")
    asked, answered = LLMCall.objects.filter(round=first).order_by("step")
    assert asked.output_messages[0]["parts"][0]["id"] == "call_abc123"
    assert LLMCall.objects.filter(round=second).count() == 1
    tool_call = ToolCall.objects.get(conversation=conversation)
    assert (tool_call.round, tool_call.llm_call) == (first, asked)
    assert (tool_call.tool_name, tool_call.tool_call_id) == ("get_weather", "call_abc123")
    assert tool_call.arguments == {"city": "Paris"}
    assert (tool_call.observation, tool_call.success) == ("Sunny, 21C in Paris", True)


def test_openinference_langgraph_agent_shows_question_and_answer(otlp_server):
    from openinference.instrumentation.langchain import LangChainInstrumentor

    with instrumented(LangChainInstrumentor(), otlp_server, make_key()):
        assert _run_turns() == [ANSWER, SECOND_ANSWER]
    _assert_agent_turns()


def test_openllmetry_langgraph_agent_shows_question_and_answer(otlp_server):
    from opentelemetry.instrumentation.langchain import LangchainInstrumentor

    with instrumented(LangchainInstrumentor(), otlp_server, make_key()):
        assert _run_turns() == [ANSWER, SECOND_ANSWER]
    _assert_agent_turns()



@tool
def book_table(city: str) -> str:
    """Book a table for tonight."""
    raise ToolException(f"no restaurant in {city} takes bookings tonight")


book_table.handle_tool_error = True  # the tool answers with its error instead of raising


@pytest.mark.parametrize("instrumentation", ["openinference", "openllmetry"])
def test_a_tool_error_the_agent_handled_is_a_failed_tool_call(otlp_server, instrumentation):
    """The tool handles its own error (`handle_tool_error`): LangChain answers the model with a
    ToolMessage whose status is "error"; neither instrumentation marks the tool's span as failed, so the
    ToolMessage in its output is the only sign."""
    if instrumentation == "openinference":
        from openinference.instrumentation.langchain import LangChainInstrumentor as Instrumentor
    else:
        from opentelemetry.instrumentation.langchain import LangchainInstrumentor as Instrumentor
    agent = react_agent([
        AIMessage(content="", tool_calls=[{"id": "call_book1", "name": "book_table", "args": {"city": "Paris"}}]),
        AIMessage(content="Sorry, nothing is free tonight."),
    ], tools=[book_table])

    with instrumented(Instrumentor(), otlp_server, make_key()):
        agent.invoke({"messages": [HumanMessage("Book me a table in Paris")]},
                     config={"configurable": {"thread_id": "thread-9"}})

    failed = ToolCall.objects.get(tool_name="book_table")
    assert (failed.tool_call_id, failed.success, failed.status) == ("call_book1", False, "error")
    assert "no restaurant in Paris takes bookings tonight" in failed.observation
    assert failed.error_message == failed.observation
    conversation = Conversation.objects.get(external_id="thread-9")
    assert conversation.error_count == 1
