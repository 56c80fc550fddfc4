"""Findings in a real Chromium against real uvicorn: a turn with problems, ingested over the REST
API while the pages are open, shows up without a reload in the conversation's findings panel (each
finding linked to its call), in the list's count and in the overview's most frequent codes."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from django.utils import timezone
from playwright.sync_api import expect

from pipeline.models import Conversation as ConversationRow
from pipeline.models import LLMCall, ToolCall
from tests.browser_support import (  # noqa: F401 (browser, page: fixtures)
    LIVE_WITHIN_MS,
    _orm_beside_playwright,
    browser,
    ingest_key,
    log_in,
    page,
    screenshot,
    wait_live,
)
from tests.insight.agent_events import Conversation, assistant, result, system, user

pytestmark = pytest.mark.browser
# Stored counts (list, overview) are refreshed in the background at most once a second.
COUNTS_WITHIN_MS = 5000


def post(server, key: str, conversation: Conversation) -> None:
    reply = httpx.post(f"{server.url}/api/ingest/", json=conversation.payload(),
                       headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert reply.status_code == 200, reply.text
    conversation.events = []


def open_beside(browser, page, url: str):
    """Another tab of the same logged-in browser at `url`, live, collecting its uncaught errors."""
    other = browser.new_page(storage_state=page.context.storage_state())
    other.errors = []
    other.on("pageerror", lambda error: other.errors.append(str(error)))
    other.goto(url)
    wait_live(other)
    return other


def test_findings_arrive_live_in_the_panel_the_list_and_the_overview(live_uvicorn, browser, page, alice):
    key = ingest_key()
    question = user("What is the weather in Oslo?")
    asked = assistant(None, ("call_1", "search", {"q": "oslo"}))
    conversation = (Conversation("conv-findings-live", start=timezone.now() - timedelta(minutes=2))
                    .turn("r1", "What is the weather in Oslo?")
                    .llm([system(), question], asked)
                    .tool("call_1", "search", {"q": "oslo"}, "Cloudy")
                    .llm([system(), question, asked, result("call_1", "Cloudy")], assistant("Cloudy.")))
    post(live_uvicorn, key, conversation)
    conversation_id = ConversationRow.objects.get(external_id="conv-findings-live").pk

    log_in(page, live_uvicorn)  # the overview
    wait_live(page)
    list_page = open_beside(browser, page, f"{live_uvicorn.url}/conversations/")
    count = list_page.locator(f'tr[data-conversation="{conversation_id}"] [data-stat="findings"]')
    expect(count).to_have_text("0")
    conversation_page = open_beside(browser, page, f"{live_uvicorn.url}/conversations/{conversation_id}/")
    panel = conversation_page.locator("#conversation-findings")
    expect(panel).to_contain_text("No findings")
    expect(page.locator("#overview-findings")).to_contain_text("No findings")
    pages = (page, list_page, conversation_page)
    for p in pages:
        p.evaluate("window.__not_reloaded = true")

    # A second turn: a new system prompt, a tool result nobody asked for, and a page that fills
    # almost a third of the window.
    prompt, fetch = system("You are a terse weather assistant."), assistant(None, ("call_2", "fetch_page", {}))
    (conversation.turn("r2", "And tomorrow?")
     .llm([prompt, question, result("call_9", "left behind")], fetch)
     .tool("call_2", "fetch_page", {}, "<html>forecast</html>", tokens=40_000)
     .llm([prompt, question, result("call_9", "left behind"), fetch, result("call_2", "<html>forecast</html>")],
          assistant("Rain tomorrow.")))
    post(live_uvicorn, key, conversation)

    findings = panel.locator(".finding")
    expect(findings).to_have_count(4, timeout=LIVE_WITHIN_MS)
    assert findings.evaluate_all("els => els.map(e => e.dataset.code)") == [
        "orphan_tool_result", "cache_break", "system_prompt_changed", "oversized_observation"]
    expect(panel.locator("h2")).to_contain_text("1 error · 2 warnings · 1 info")
    expect(count).to_have_text("4", timeout=COUNTS_WITHIN_MS)
    orphans = page.locator('#overview-findings tr[data-code="orphan_tool_result"] [data-stat="findings"]')
    expect(orphans).to_have_text("1", timeout=COUNTS_WITHIN_MS)
    assert all(p.evaluate("window.__not_reloaded") for p in pages)
    screenshot(conversation_page, "conversation-findings")
    screenshot(page, "overview-findings")

    # A tool's finding points at its timeline entry, the others at the LLM call's page.
    fetched = ToolCall.objects.get(conversation_id=conversation_id, tool_call_id="call_2")
    tool_link = findings.nth(3).locator("a.finding-link")
    expect(tool_link).to_have_attribute("href", f"#tool-{fetched.pk}")
    expect(conversation_page.locator(f"#tool-{fetched.pk}")).to_be_visible()
    orphan_call = LLMCall.objects.filter(conversation_id=conversation_id).order_by("started_at")[2]
    findings.nth(0).locator("a.finding-link").click()
    conversation_page.wait_for_url(f"{live_uvicorn.url}/llm-calls/{orphan_call.pk}/")
    assert page.errors == list_page.errors == conversation_page.errors == []
    list_page.close()
    conversation_page.close()
