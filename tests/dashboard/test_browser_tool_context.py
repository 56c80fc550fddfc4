"""The tools page ranks tools by what their results cost the context and says what another output
level would have saved, live, in a real Chromium against a real uvicorn fed over REST ingest."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import expect

from dashboard.templatetags.ctxlens import tokens
from dashboard.views.tools import usd
from pipeline.models import ToolCall
from tests.browser_support import (  # noqa: F401 (browser, page: fixtures)
    _orm_beside_playwright,
    browser,
    ingest_key,
    log_in,
    page,
    screenshot,
    wait_live,
)
from tests.ingest.test_tool_levels import ROWS, run, runtime_levels, turn
from tests.otlp_support import auth, wait_for_deferred_tokens

pytestmark = pytest.mark.browser


def send(server, key: str, events: list[dict]) -> None:
    reply = httpx.post(f"{server.url}/api/ingest/", json={"schema_version": "1.0", "events": events},
                       headers=auth(key), timeout=10)
    assert reply.status_code == 200, reply.text


def sentence(carries: int) -> str:
    tool = ToolCall.objects.get()
    return (f"web_search: results re-sent {carries}× on average, {tokens(tool.context_tokens)} input tokens, "
            f"{usd(float(tool.context_cost_usd))}")


def test_the_tools_page_ranks_context_cost_and_shows_the_level_what_if_live(live_uvicorn, browser, page, alice):
    key = ingest_key()
    events = turn("web_search", run("web_search", store_artifacts=False), carriers=4)
    send(live_uvicorn, key, events[:-1])  # the last carrying call comes later, while the page is open
    wait_for_deferred_tokens()
    tool = ToolCall.objects.get()
    assert (tool.context_carries, tool.tokens_at_level) == (3, runtime_levels(ROWS))

    log_in(page, live_uvicorn)
    page.goto(f"{live_uvicorn.url}/tools/?window=all")
    wait_live(page)
    page.evaluate("window.__not_reloaded = true")
    ranked = page.locator('#tools-context li[data-tool="web_search"]')
    expect(ranked.locator('[data-stat="context-sentence"]')).to_have_text(sentence(3))
    saved = (tool.observation_tokens - tool.tokens_at_level["brief"]) * 3
    per_token = tool.context_cost_usd / tool.context_tokens
    expect(ranked.locator('[data-stat="what-if"]')).to_contain_text(
        f"Switching web_search to brief would have saved {tokens(saved)} input tokens ({usd(float(saved * per_token))}).")
    expect(ranked.locator('tr[data-level="standard"] [data-stat="saved-tokens"]')).to_have_text(
        tokens((tool.observation_tokens - tool.tokens_at_level["standard"]) * 3))
    screenshot(page, "tools-context")

    send(live_uvicorn, key, events[-1:])

    expect(ranked.locator('[data-stat="context-sentence"]')).to_have_text(sentence(4), timeout=5000)
    assert ToolCall.objects.get().context_carries == 4
    assert page.evaluate("window.__not_reloaded")
    assert page.errors == []
