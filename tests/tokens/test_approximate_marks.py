"""The runtime's own spans say whether its counts are approximate, and the read API passes it on:
an agent on a Claude model (no public tokenizer) gets "approximate": true on its LLM and tool
calls, one on gpt-4o (o200k_base, exact) false."""

from __future__ import annotations

import pytest
from langchain_core.tools import tool

from pipeline.adapters import in_process_telemetry
from pipeline.runtime.agent import Agent
from pipeline.runtime.demo.fake_model import ScriptedChatModel, calls, tool_call
from pipeline.runtime.telemetry.config import ObservabilityConfig
from pipeline.models import Conversation

pytestmark = pytest.mark.django_db


@tool
def query_sales(quarter: str) -> str:
    """Revenue of a quarter."""
    return f"{quarter}: EUR 1.2M north, EUR 0.9M south, 东部 EUR 1.5M"


@pytest.mark.parametrize("model,approximate", [("claude-sonnet-4-5", True), ("gpt-4o", False)])
def test_runtime_spans_carry_the_approximate_mark_to_the_api(client, alice, model, approximate):
    telemetry = in_process_telemetry(ObservabilityConfig(), batch=False)
    chat = ScriptedChatModel.from_script([calls(tool_call("query_sales", {"quarter": "Q3"}, "call_q3")), "EUR 3.6M."],
                                         model_name=model)
    Agent(chat, [query_sales], telemetry=telemetry, conversation_id=f"conv-{model}").turn("Q3 revenue?")
    telemetry.shutdown()

    client.force_login(alice)
    conversation = Conversation.objects.get(external_id=f"conv-{model}")
    detail = client.get(f"/api/conversations/{conversation.pk}/").json()
    llm_calls = detail["rounds"][0]["llm_calls"]
    tool_calls = detail["rounds"][0]["tool_calls"]
    assert len(llm_calls) == 2 and len(tool_calls) == 1
    assert [c["approximate"] for c in llm_calls] == [approximate, approximate]
    assert tool_calls[0]["approximate"] is approximate and tool_calls[0]["observation_tokens"] > 0
