"""Cost figures in a real Chromium against a real uvicorn: the overview, the conversations list
and a conversation page show them, and update them live as turns arrive over OTLP."""

from __future__ import annotations

import json

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from playwright.sync_api import expect

from pipeline import semconv as sc
from pipeline.models import Conversation
from tests.browser_support import (  # noqa: F401 (browser, page: fixtures)
    _orm_beside_playwright,
    browser,
    ingest_key,
    log_in,
    page,
    screenshot,
    wait_live,
)

pytestmark = pytest.mark.browser
LIVE_MS = 5000


def send_chat(server, key: str, conversation_id: str, model: str, input_tokens: int, output_tokens: int) -> None:
    """One agent turn with one chat call, exported over OTLP/HTTP by the real SDK."""
    provider = TracerProvider(resource=Resource.create({"service.name": "browser-cost-agent"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(
        endpoint=f"{server.url}/v1/traces", headers={"Authorization": f"Bearer {key}"})))
    tracer = provider.get_tracer("tests.browser.costs")
    with tracer.start_as_current_span("invoke_agent billing-bot", attributes={
        "gen_ai.operation.name": "invoke_agent", sc.CONVERSATION_ID: conversation_id,
        sc.ROUND_USER_MESSAGE: "Which invoices are unpaid?",
    }):
        with tracer.start_as_current_span(f"chat {model}", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": model, "gen_ai.provider.name": "openai",
            "gen_ai.usage.input_tokens": input_tokens, "gen_ai.usage.output_tokens": output_tokens,
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                {"type": "text", "content": "Three of them."}]}]),
        }):
            pass
    assert provider.force_flush(10_000)
    provider.shutdown()


def test_cost_figures_on_the_overview_list_and_conversation_page_live(live_uvicorn, page, alice):
    key = ingest_key()
    log_in(page, live_uvicorn)
    wait_live(page)
    expect(page.locator('#overview-totals [data-stat="cost"]')).to_have_text("–")  # no LLM calls yet

    send_chat(live_uvicorn, key, "billing-1", "gpt-4o", 5_200, 60)  # 5,200 × $2.50 + 60 × $10 per million
    expect(page.locator('#overview-totals [data-stat="cost"]')).to_have_text("$0.0136", timeout=LIVE_MS)
    expect(page.locator('#overview-models tr[data-model="gpt-4o"] [data-stat="cost"]')).to_have_text("$0.0136")
    send_chat(live_uvicorn, key, "billing-2", "acme-large-1", 900, 40)  # no known price
    expect(page.locator('#overview-totals [data-stat="cost"]')).to_have_text("$0.0136 partly priced", timeout=LIVE_MS)
    expect(page.locator('#overview-models tr[data-model="acme-large-1"] [data-stat="cost"]')).to_have_text("no price")
    assert page.evaluate("Chart.getChart('cost-chart').data.datasets[0].data.reduce((a, b) => a + (b || 0), 0)") \
        == pytest.approx(0.0136, abs=1e-12)
    screenshot(page, "overview-costs")

    page.click("nav >> text=Conversations")
    wait_live(page)
    priced, unpriced = (Conversation.objects.get(external_id=e).pk for e in ("billing-1", "billing-2"))
    expect(page.locator(f'tr[data-conversation="{priced}"] [data-stat="cost"]')).to_have_text("$0.0136")
    expect(page.locator(f'tr[data-conversation="{unpriced}"] [data-stat="cost"]')).to_have_text("no price")
    send_chat(live_uvicorn, key, "billing-2", "gpt-4o-mini", 10_000, 1_000)  # $0.0015 + $0.0006
    expect(page.locator(f'tr[data-conversation="{unpriced}"] [data-stat="cost"]')).to_have_text(
        "$0.0021 partly priced", timeout=LIVE_MS)
    screenshot(page, "conversations-costs")

    page.goto(f"{live_uvicorn.url}/conversations/{priced}/")
    wait_live(page)
    expect(page.locator('#conversation-header [data-stat="cost"]')).to_have_text("$0.0136")
    expect(page.locator('.turn [data-stat="round-cost"]')).to_have_text(["$0.0136"])
    expect(page.locator('.turn [data-stat="call-cost"]')).to_have_text(["$0.0136"])
    send_chat(live_uvicorn, key, "billing-1", "gpt-4o", 10_000, 200)  # $0.025 + $0.002
    expect(page.locator('#conversation-header [data-stat="cost"]')).to_have_text("$0.0406", timeout=LIVE_MS)
    expect(page.locator('.turn [data-stat="round-cost"]')).to_have_text(["$0.0136", "$0.027"])
    screenshot(page, "conversation-costs")
    assert page.errors == []
