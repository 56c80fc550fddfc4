"""Real LangChain instrumentation → OTLP exporter → live uvicorn → the stored conversation.

A fake chat model runs a two-round tool-calling loop (research doc §5), instrumented once by
OpenInference and once by OpenLLMetry; both must give the same conversation.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableLambda

from pipeline.models import Conversation, LLMCall, Round, ToolCall
from tests.langchain_support import FakeToolChat, get_weather, instrumented
from tests.otlp_support import make_key

pytestmark = pytest.mark.django_db(transaction=True)


def _run_agent() -> str:
    replies = iter([
        AIMessage(content="", tool_calls=[{"id": "call_abc123", "name": "get_weather", "args": {"city": "Paris"}}],
                  usage_metadata={"input_tokens": 42, "output_tokens": 7, "total_tokens": 49,
                                  "input_token_details": {"cache_read": 10}}),
        AIMessage(content="It is sunny and 21C in Paris.",
                  usage_metadata={"input_tokens": 60, "output_tokens": 12, "total_tokens": 72}),
    ])
    model = FakeToolChat(messages=replies).bind_tools([get_weather])

    def loop(question: str) -> str:
        messages = [SystemMessage("You are a weather bot."), HumanMessage(question)]
        while True:
            reply = model.invoke(messages)
            messages.append(reply)
            if not reply.tool_calls:
                return reply.content
            for call in reply.tool_calls:
                messages.append(get_weather.invoke(call))

    agent = RunnableLambda(loop).with_config(run_name="weather_agent")
    return agent.invoke("What's the weather in Paris?",
                        config={"metadata": {"session_id": "sess-42", "thread_id": "thread-7", "user_id": "u-1"}})


def _assert_weather_conversation() -> None:
    conversation = Conversation.objects.get()  # one: spans without the session id joined it too
    assert conversation.external_id == "sess-42"
    assert (conversation.service_name, conversation.model) == ("lc-agent", "fake-gpt-4o")
    assert (conversation.round_count, conversation.llm_call_count, conversation.tool_call_count) == (1, 2, 1)
    assert (conversation.input_tokens, conversation.output_tokens, conversation.error_count) == (102, 19, 0)
    round_ = Round.objects.get(conversation=conversation)
    assert round_.user_message == "What's the weather in Paris?"
    assert round_.final_answer == "It is sunny and 21C in Paris."
    assert round_.status == "ok"
    first, second = LLMCall.objects.filter(round=round_).order_by("step")
    assert (first.model, first.input_tokens, first.output_tokens, first.cache_read_tokens) == ("fake-gpt-4o", 42, 7, 10)
    assert (second.input_tokens, second.output_tokens) == (60, 12)
    assert [m["role"] for m in first.input_messages] == ["system", "user"]
    assert first.output_messages[0]["parts"][0]["id"] == "call_abc123"
    assert second.output_messages[0]["parts"] == [{"type": "text", "content": "It is sunny and 21C in Paris."}]
    tool_call = ToolCall.objects.get(conversation=conversation)
    assert (tool_call.tool_name, tool_call.tool_call_id) == ("get_weather", "call_abc123")
    assert tool_call.arguments == {"city": "Paris"}
    assert tool_call.observation == "Sunny, 21C in Paris"
    assert (tool_call.success, tool_call.llm_call) == (True, first)


def test_openinference_langchain_loop_is_stored(otlp_server):
    from openinference.instrumentation.langchain import LangChainInstrumentor

    with instrumented(LangChainInstrumentor(), otlp_server, make_key()):
        assert _run_agent() == "It is sunny and 21C in Paris."
    _assert_weather_conversation()


def test_openllmetry_langchain_loop_is_stored(otlp_server):
    from opentelemetry.instrumentation.langchain import LangchainInstrumentor

    with instrumented(LangchainInstrumentor(), otlp_server, make_key()):
        assert _run_agent() == "It is sunny and 21C in Paris."
    _assert_weather_conversation()
    assert Conversation.objects.get().agent_name == "weather_agent"
