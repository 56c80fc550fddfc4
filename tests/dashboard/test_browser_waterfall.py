"""The span waterfall on the conversation page, in a real Chromium against a real uvicorn.

A turn's "Spans" toggle fetches /api/rounds/<id>/spans/ and draws the tree on a time axis; an
LLM row leads to the call's entry in the timeline. Turns arrive as an agent sends them: a
LangGraph agent traced by OpenInference over OTLP/HTTP, spans from the OpenTelemetry SDK, REST
events posted to /api/ingest/.
"""

from __future__ import annotations

import httpx
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode
from playwright.sync_api import expect

from pipeline import semconv as sc
from pipeline.models import LLMCall, Round, ToolCall
from tests.browser_support import (  # noqa: F401 (browser, page: fixtures)
    _orm_beside_playwright,
    browser,
    ingest_key,
    log_in,
    page,
    screenshot,
    wait_live,
)
from tests.dashboard.test_browser_dashboard import OVERFLOWING, UNISOLATED_BIDI
from tests.dashboard_fixtures import bidi, hostile
from tests.langchain_support import instrumented, react_agent
from tests.otlp_support import auth

pytestmark = pytest.mark.browser

ANSWER = "It is sunny and 21C in Paris."


def open_conversation(page, server, round_: Round) -> None:
    log_in(page, server)
    page.goto(f"{server.url}/conversations/{round_.conversation_id}/")
    wait_live(page)


def open_spans(page, round_: Round):
    turn = page.locator(f"#round-{round_.pk}")
    turn.locator(".spans-toggle").click()
    waterfall = turn.locator(f"#spans-{round_.pk}")
    expect(waterfall.locator(".wf-rows")).to_be_visible()
    return waterfall


def test_a_turn_opens_its_spans_and_an_llm_row_leads_to_the_call_in_the_timeline(live_uvicorn, page, alice):
    from openinference.instrumentation.langchain import LangChainInstrumentor

    with instrumented(LangChainInstrumentor(), live_uvicorn, ingest_key()):
        react_agent([
            AIMessage(content="", tool_calls=[{"id": "call_w1", "name": "get_weather", "args": {"city": "Paris"}}],
                      usage_metadata={"input_tokens": 42, "output_tokens": 7, "total_tokens": 49}),
            AIMessage(content=ANSWER, usage_metadata={"input_tokens": 60, "output_tokens": 12, "total_tokens": 72}),
        ]).invoke({"messages": [HumanMessage("What's the weather in Paris?")]},
                  config={"configurable": {"thread_id": "browser-waterfall"}})
    turn = Round.objects.get(conversation__external_id="browser-waterfall")
    asked, answered = LLMCall.objects.filter(round=turn).order_by("step")
    weather = ToolCall.objects.get(round=turn)
    open_conversation(page, live_uvicorn, turn)
    toggle = page.locator(f"#round-{turn.pk} .spans-toggle")
    expect(toggle).to_have_attribute("aria-expanded", "false")

    waterfall = open_spans(page, turn)

    expect(toggle).to_have_attribute("aria-expanded", "true")
    rows = waterfall.locator(".wf-row")
    expect(rows).to_have_count(15)
    expect(waterfall.locator(".wf-summary")).to_contain_text("15 spans")
    assert rows.evaluate_all("rows => rows.map(r => [Number(r.dataset.depth), r.querySelector('.wf-name').textContent])") == [
        [0, "LangGraph"], [1, "agent"], [2, "call_model"], [2, "RunnableSequence"], [3, "Prompt"], [3, "FakeToolChat"],
        [2, "should_continue"], [1, "tools"], [2, "get_weather"], [1, "agent"], [2, "call_model"],
        [2, "RunnableSequence"], [3, "Prompt"], [3, "FakeToolChat"], [2, "should_continue"],
    ]
    # Indented by depth; the root's bar spans the whole axis.
    assert rows.evaluate_all("rows => rows.slice(0, 5).map(r => r.querySelector('.wf-label').style.paddingLeft)") == [
        "0px", "14px", "28px", "28px", "42px"]
    root_bar = rows.first.locator(".wf-bar")
    assert root_bar.evaluate("bar => [bar.style.left, bar.style.width]") == ["0%", "100%"]
    # Node and chain rows link nowhere; LLM and tool rows to their timeline entries.
    assert waterfall.locator(".wf-row a.wf-name").evaluate_all("links => links.map(a => a.getAttribute('href'))") == [
        f"#llm-{asked.pk}", f"#tool-{weather.pk}", f"#llm-{answered.pk}"]
    expect(rows.nth(2).locator(".badge")).to_have_text("Chain")
    expect(rows.nth(2).locator(".wf-node")).to_have_text("agent")
    rows.nth(2).locator("summary").click()
    expect(rows.nth(2).locator(".wf-facts")).to_contain_text("openinference.span.kind")
    expect(rows.nth(2).locator(".wf-facts")).to_contain_text("CHAIN")
    screenshot(page, "conversation-waterfall")

    rows.nth(13).locator("a.wf-name").click()

    expect(page).to_have_url(f"{live_uvicorn.url}/conversations/{turn.conversation_id}/#llm-{answered.pk}")
    expect(page.locator(f"#llm-{answered.pk}")).to_be_in_viewport()
    assert page.errors == []


def _send_hostile_turn(server, key: str, name: str, conversation: str) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "waterfall-hostile"}))
    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers=auth(key))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests.waterfall")
    with tracer.start_as_current_span("invoke_agent", attributes={
        "gen_ai.operation.name": "invoke_agent", sc.CONVERSATION_ID: conversation,
    }):
        with tracer.start_as_current_span(name(name.__name__ + "-span"), attributes={
            "openinference.span.kind": "RETRIEVER", "gen_ai.agent.name": name("agent-attr"),
            "langgraph.node": name("node-attr"),
        }) as span:
            span.set_status(Status(StatusCode.ERROR, name("status-message")))
    provider.shutdown()


@pytest.mark.parametrize("text", [hostile, bidi], ids=["markup", "bidi"])
def test_span_names_and_attributes_stay_text(live_uvicorn, page, alice, text):
    _send_hostile_turn(live_uvicorn, ingest_key(), text, "hostile-spans")
    turn = Round.objects.get(conversation__external_id="hostile-spans")
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    open_conversation(page, live_uvicorn, turn)

    waterfall = open_spans(page, turn)
    row = waterfall.locator(".wf-row").nth(1)
    row.locator("summary").click()

    expect(row.locator(".wf-name")).to_have_text(text(f"{text.__name__}-span"))
    expect(row.locator(".wf-node")).to_have_text(text("node-attr"))
    expect(row.locator(".badge").first).to_have_text("retriever")
    expect(row.locator(".badge.status-error")).to_have_text("Error")
    expect(row.locator(".wf-facts")).to_contain_text(f"error: {text('status-message')}")
    expect(row.locator(".wf-facts")).to_contain_text(text("agent-attr"))
    assert "failed" in row.get_attribute("class")
    page.wait_for_timeout(300)  # let an image error handler fire, were there one
    leaked = page.evaluate("""() => ({
        ran: window.__xss ?? null,
        images: document.querySelectorAll('img[src="x"]').length,
        elements: ["hostile-span", "agent-attr", "node-attr", "status-message"].filter(id => document.getElementById(id)),
    })""")
    assert leaked == {"ran": None, "images": 0, "elements": []}
    assert page.evaluate(UNISOLATED_BIDI) == []
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(50)
        assert page.evaluate(OVERFLOWING) == {"page": 0, "boxes": []}, width
    assert dialogs == [] and page.errors == []


TURN = {"conversation_id": "live-waterfall", "round_id": "r1"}


def _post(server, key: str, *events: dict) -> None:
    reply = httpx.post(f"{server.url}/api/ingest/", json={"schema_version": "1.0", "events": list(events)},
                       headers=auth(key), timeout=30)
    assert reply.status_code == 200, reply.text


def test_an_open_waterfall_follows_its_turn_live(live_uvicorn, page, alice):
    key = ingest_key()
    _post(live_uvicorn, key,
          {**TURN, "type": "round_start", "timestamp": "2026-05-01T12:00:00Z", "user_message": "6 x 7?"},
          {**TURN, "type": "llm_call", "call_id": "llm-1", "model": "gpt-4o", "started_at": "2026-05-01T12:00:00.100Z",
           "duration_ms": 800, "input_tokens": 120, "output_tokens": 15})
    turn = Round.objects.get(key="r1")
    open_conversation(page, live_uvicorn, turn)
    page.evaluate("window.__not_reloaded = true")
    waterfall = open_spans(page, turn)
    rows = waterfall.locator(".wf-row")
    expect(rows).to_have_count(2)
    assert rows.evaluate_all("rows => rows.map(r => r.dataset.kind)") == ["agent", "llm"]
    expect(rows.first).to_have_class("wf-row running")
    expect(rows.first.locator(".wf-duration")).to_have_text("running")

    _post(live_uvicorn, key,
          {**TURN, "type": "tool_call", "tool_name": "calculator", "tool_call_id": "call_1", "observation": "boom",
           "started_at": "2026-05-01T12:00:01Z", "duration_ms": 12.5, "status": "error",
           "error_message": "division by zero"},
          {**TURN, "type": "round_end", "timestamp": "2026-05-01T12:00:02Z", "final_answer": "42"})

    expect(rows).to_have_count(3, timeout=10_000)
    expect(rows.first).to_have_class("wf-row")
    expect(rows.first.locator(".wf-duration")).to_have_text("2.00 s")
    expect(rows.nth(2).locator(".wf-name")).to_have_text("execute_tool calculator")
    expect(rows.nth(2).locator(".badge.status-error")).to_be_visible()
    assert rows.nth(2).locator(".wf-bar").evaluate("bar => [bar.style.left, bar.style.width]") == ["50%", "0.625%"]
    expect(page.locator(f"#round-{turn.pk} .spans-toggle")).to_have_attribute("aria-expanded", "true")
    assert page.evaluate("window.__not_reloaded") is True
    assert page.errors == []
