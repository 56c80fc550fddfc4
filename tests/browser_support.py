"""What the browser tests share: Playwright's Chromium, logging in, waiting for the live socket,
screenshots at both widths, and agent turns sent over OTLP/HTTP by the real OpenTelemetry SDK.

Test modules import the fixtures by name (`from tests.browser_support import browser, page`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Status, StatusCode
from playwright.sync_api import Browser, Page, expect, sync_playwright

from pipeline import semconv as sc
from pipeline.models import ApiKey

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
WIDTHS = (1280, 390)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
LIVE_WITHIN_MS = 2000


def wait_until_true(page: Page, expression: str, timeout_ms: int) -> None:
    """Wait until a JavaScript expression is truthy in the page.

    Playwright's wait_for_function polls inside the page with eval, which the dashboard's
    Content-Security-Policy (no 'unsafe-eval') refuses; page.evaluate runs over the DevTools
    protocol and is not subject to the page's CSP, so poll with it from here instead.
    """
    deadline = time.monotonic() + timeout_ms / 1000
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout_ms} ms: {expression}")
        page.wait_for_timeout(25)


@pytest.fixture(autouse=True)
def _orm_beside_playwright(monkeypatch):
    # Playwright's sync API runs an event loop in this thread; the ORM calls the test makes
    # between browser steps are ordinary blocking calls, which Django would otherwise refuse.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.errors = []  # uncaught page errors, checked by the tests that care
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    yield page
    context.close()


def log_in(page: Page, server, username: str = "alice", password: str = "alice-pass-123") -> None:
    page.goto(f"{server.url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{server.url}/")


def wait_live(page: Page, timeout: int = 10_000) -> None:
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live", timeout=timeout)


def screenshot(page: Page, name: str) -> None:
    """The page as it is now, at each width (full page), under test-artifacts/screenshots/."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(150)  # charts resize on the next frame
        page.screenshot(path=str(SCREENSHOTS / f"{name}-{width}.png"), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})


def ingest_key() -> str:
    return ApiKey.generate("browser tests")[1]


def send_turn(server, key: str, conversation_id: str, *, tool: str, observation: str,
              user_message: str = "What is the weather in Oslo?") -> None:
    """One agent turn (invoke_agent → chat, execute_tool) exported over OTLP/HTTP by the real SDK."""
    provider = TracerProvider(resource=Resource.create({"service.name": "browser-test-agent"}))
    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers={"Authorization": f"Bearer {key}"})
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("tests.browser")
    with tracer.start_as_current_span("invoke_agent weather-bot", attributes={
        "gen_ai.operation.name": "invoke_agent", sc.CONVERSATION_ID: conversation_id,
        "gen_ai.agent.name": "weather-bot", sc.ROUND_USER_MESSAGE: user_message,
    }) as root:
        with tracer.start_as_current_span("chat gpt-4o", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
            "gen_ai.usage.input_tokens": 5200, "gen_ai.usage.output_tokens": 60,
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                {"type": "text", "content": "Let me check."},
                {"type": "tool_call", "id": "call_live_1", "name": tool, "arguments": {"city": "Oslo"}}]}]),
            sc.CONTEXT_WINDOW: 128_000, sc.CONTEXT_TOKENS: 5200,
            sc.CONTEXT_COMPOSITION: json.dumps({"system": 1200, "user": 400, "tool_observations": 3600}),
        }):
            pass
        with tracer.start_as_current_span(f"execute_tool {tool}", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool, "gen_ai.tool.call.id": "call_live_1",
            "gen_ai.tool.call.arguments": json.dumps({"city": "Oslo"}), "gen_ai.tool.call.result": observation,
            sc.TOOL_OUTPUT_LEVEL: "standard",
        }):
            pass
        root.set_attribute(sc.ROUND_FINAL_ANSWER, "Cloudy, 12 °C.")
        root.set_status(Status(StatusCode.OK))
    assert provider.force_flush(10_000)
    provider.shutdown()
