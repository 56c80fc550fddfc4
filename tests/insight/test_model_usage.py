"""GET /api/models/stats/: LLM calls, tokens and cost per model in a window, and the overview's
per-model table, cost total and cost per minute, from calls sent through the REST ingest API."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from pipeline.models import Conversation
from tests.insight.cost_support import genai_price, ingest_client, llm_call, read_client, round_start, send, stat_texts

pytestmark = pytest.mark.django_db


@pytest.fixture
def now():
    return timezone.now().replace(second=30, microsecond=0) - timedelta(minutes=2)


@pytest.fixture
def calls(now) -> dict[str, Decimal]:
    """Two conversations over three models, one without a price, and a call a week old."""
    api = ingest_client()
    send(api, round_start("a", "r1", now),
         llm_call("a", "r1", "c1", now, "gpt-4o", provider="openai", input_tokens=3_000, output_tokens=200,
                  cache_read_tokens=1_000),
         llm_call("a", "r1", "c2", now + timedelta(seconds=3), "gpt-4o-mini", provider="openai",
                  input_tokens=10_000, output_tokens=1_000),
         llm_call("a", "r1", "c3", now + timedelta(seconds=6), "in-house-7b", input_tokens=500, output_tokens=50))
    send(api, round_start("b", "r1", now - timedelta(minutes=1)),
         llm_call("b", "r1", "c1", now - timedelta(minutes=1), "gpt-4o", provider="openai", input_tokens=1_000,
                  output_tokens=100, reasoning_tokens=40),
         llm_call("b", "old", "c0", now - timedelta(days=7), "gpt-4o", provider="openai", input_tokens=99_000))
    return {
        "gpt-4o": genai_price("gpt-4o", now, input=3_000, output=200, cache_read=1_000)
        + genai_price("gpt-4o", now, input=1_000, output=100),
        "gpt-4o-mini": genai_price("gpt-4o-mini", now, input=10_000, output=1_000),
    }


def test_model_stats_sum_the_calls_of_the_window_costliest_first(calls):
    assert calls == {"gpt-4o": Decimal("0.01175"), "gpt-4o-mini": Decimal("0.0021")}
    reply = read_client().get("/api/models/stats/?window=1d")

    assert reply.status_code == 200
    assert reply.json() == [
        {"model": "gpt-4o", "calls": 2, "input_tokens": 4_000, "output_tokens": 300, "cache_read_tokens": 1_000,
         "cache_write_tokens": 0, "reasoning_tokens": 40, "cost_usd": 0.01175, "unpriced_calls": 0},
        {"model": "gpt-4o-mini", "calls": 1, "input_tokens": 10_000, "output_tokens": 1_000, "cache_read_tokens": 0,
         "cache_write_tokens": 0, "reasoning_tokens": 0, "cost_usd": 0.0021, "unpriced_calls": 0},
        {"model": "in-house-7b", "calls": 1, "input_tokens": 500, "output_tokens": 50, "cache_read_tokens": 0,
         "cache_write_tokens": 0, "reasoning_tokens": 0, "cost_usd": None, "unpriced_calls": 1},
    ]


def test_model_stats_filter_by_conversation_model_and_time(calls, now):
    api = read_client()
    b = Conversation.objects.get(external_id="b").pk

    def figures(query: str) -> list[tuple]:
        reply = api.get(f"/api/models/stats/?{query}")
        assert reply.status_code == 200, reply.json()
        return [(m["model"], m["calls"], m["cost_usd"]) for m in reply.json()]

    assert figures(f"conversation={b}") == [("gpt-4o", 2, 0.251)]  # all time: the week-old call's $0.2475 too
    assert figures("model=gpt-4o") == [("gpt-4o", 3, 0.25925)]
    until = (now - timedelta(minutes=1)).isoformat().replace("+00:00", "Z")
    assert figures(f"since=2026-01-01T00:00:00Z&until={until}") == [("gpt-4o", 1, 0.2475)]


@pytest.mark.parametrize(("query", "field"), [
    ("window=fortnight", "window"), ("window=1h&since=2026-01-01T00:00:00Z", "window"), ("conversation=0", "conversation"),
])
def test_bad_model_stats_filters_are_field_errors(db, query, field):
    reply = read_client().get(f"/api/models/stats/?{query}")

    assert reply.status_code == 400
    assert field in reply.json()


def test_the_schema_documents_costs_as_nullable_numbers(db):
    schema = read_client().get("/api/schema/?format=json").json()
    components = schema["components"]["schemas"]

    assert "get" in schema["paths"]["/api/models/stats/"]
    assert {p["name"] for p in schema["paths"]["/api/models/stats/"]["get"]["parameters"]} == {
        "since", "until", "window", "conversation", "model"}
    for component, field in (("Conversation", "cost_usd"), ("ConversationDetail", "cost_usd"), ("Round", "cost_usd"),
                             ("LLMCall", "cost_usd"), ("ConversationTotals", "cost_usd"), ("ModelStats", "cost_usd")):
        prop = components[component]["properties"][field]
        assert prop["type"] == "number" and prop["nullable"] is True, component
    assert components["Conversation"]["properties"]["unpriced_call_count"]["type"] == "integer"


def test_the_overview_shows_total_cost_cost_per_minute_and_models(calls, now, client, alice):
    client.force_login(alice)
    html = client.get("/").content.decode()

    assert stat_texts(html, "cost") == [
        "$0.0139 partly priced",  # the totals: 0.01175 + 0.0021 over the last 24 hours; in-house-7b unpriced
        "$0.0118", "$0.0021", "no price",  # the models table
    ]
    assert re.findall(r'<tr data-model="([^"]+)"', html) == ["gpt-4o", "gpt-4o-mini", "in-house-7b"]
    chart = json.loads(re.search(r'<script id="tokens-chart-data" type="application/json">(.*?)</script>',
                                 html, re.S).group(1))
    by_minute = dict(zip(chart["labels"], chart["cost"], strict=True))
    here, before = now.strftime("%H:%M"), (now - timedelta(minutes=1)).strftime("%H:%M")
    assert by_minute[here] == pytest.approx(0.01175 - 0.0035 + 0.0021, abs=1e-12)  # c1 and c2; c3 has no price
    assert by_minute[before] == pytest.approx(0.0035, abs=1e-12)
    assert sum(v for v in chart["cost"] if v) == pytest.approx(0.01385, abs=1e-12)

    fragments = client.get("/fragments/overview/").json()
    assert stat_texts(fragments["fragments"]["overview-models"], "cost") == ["$0.0118", "$0.0021", "no price"]
    assert fragments["data"]["tokens_chart"]["cost"] == chart["cost"]
