"""An agent's compression, sent over OTLP as the pipeline sends it: the strategy it chose by itself, the
estimated cost of every strategy, and why, on the compression page and in the read API."""

from __future__ import annotations

import html
import re

import pytest
from django.urls import reverse
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

from pipeline.models import CompressionEvent
from pipeline.runtime.agent import Agent
from pipeline.runtime.demo.fake_model import ScriptedChatModel
from pipeline.runtime.summariser import Summariser
from pipeline.runtime.telemetry.config import ObservabilityConfig
from pipeline.runtime.telemetry.spans import Telemetry
from pipeline.tokens.counting import count_conversation_tokens
from tests.otlp_support import make_key

MODEL = "gpt-4o"


@tool
def query_sales(period: int) -> str:
    """Sales of one period."""
    return f"revenue={period}00"


def history(rounds: int) -> list[BaseMessage]:
    messages: list[BaseMessage] = [SystemMessage("You are a sales analyst.")]
    for r in range(rounds):
        messages += [
            HumanMessage(f"Sales in period {r}?"),
            AIMessage("Let me look that up in the sales table. " * 8,
                      tool_calls=[{"id": f"call_{r}", "name": "query_sales", "args": {"period": r}}]),
            ToolMessage(f"region=EMEA revenue={r}00 " * 40, tool_call_id=f"call_{r}", name="query_sales"),
            AIMessage(f"Period {r}: {r}00 in EMEA, mostly from the direct channel. " * 6),
        ]
    return messages


@pytest.mark.django_db(transaction=True)
def test_the_compression_page_shows_the_automatic_choice_and_every_strategys_estimated_cost(otlp_server, client, alice):
    past = history(13)  # 53 messages: past the LLM threshold of 50
    window = int(count_conversation_tokens(past, MODEL) / 0.9)  # over the 80 % threshold, inside the window
    telemetry = Telemetry.from_config(ObservabilityConfig(
        otlp_endpoint=otlp_server.url, otlp_headers={"Authorization": f"Bearer {make_key()}"},
        otlp_compression="none"), batch=False)
    summariser = Summariser(ScriptedChatModel.from_script(["Periods 0-12 were looked up."], model_name=MODEL),
                            model=MODEL, max_cost_per_hour=1.0)
    agent = Agent(ScriptedChatModel.from_script(["Period 13 is not booked yet."], model_name=MODEL), [query_sales],
                  messages=past, model=MODEL, context_window=window, summariser=summariser, telemetry=telemetry,
                  conversation_id="costs-1")
    round_ = agent.turn("And period 13?")
    summariser.wait(10)
    summariser.close()
    telemetry.shutdown()
    [result] = round_.compressions

    event = CompressionEvent.objects.get(conversation__external_id="costs-1")
    assert event.strategy == "summarize" == result.strategy.value
    assert event.estimated_costs == result.estimated_costs and set(event.estimated_costs) == {
        "truncate", "extract", "summarize"}
    assert event.estimated_costs["truncate"] == 0 < event.estimated_costs["extract"] < event.estimated_costs["summarize"]
    assert event.selection.startswith("auto: 54 messages ≥ 50; summary ≈ $")

    client.force_login(alice)
    page = client.get(reverse("compression", args=[event.pk])).content.decode()
    table = page[page.index('id="compression-costs"'):page.index("</table>", page.index('id="compression-costs"'))]
    rows = dict(re.findall(r'data-strategy="(\w+)"><td>.*?</td><td class="num">\$([\d.]+)</td>', table))
    assert rows == {name: f"{cost:.4f}" for name, cost in event.estimated_costs.items()}
    assert re.search(r'class="chosen" data-strategy="summarize"><td>Summarize <span class="badge">used</span>', table)
    assert html.escape(f"Chosen: {event.selection}") in table

    api = client.get(f"/api/compressions/{event.pk}/").json()
    assert (api["estimated_costs"], api["selection"]) == (event.estimated_costs, event.selection)
