"""The call-to-call diff in a real Chromium against a real uvicorn: the LLM call page's side by
side inputs, and the timeline's line per call, arriving live. Conversations are posted to the
live server's REST ingest API (tests/call_diff_cases.py)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests import call_diff_cases as cases
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
from tests.call_diff_cases import Events, s

pytestmark = pytest.mark.browser


class LiveIngest:
    """Posts ingest requests to the live server over HTTP, as an agent would."""

    def __init__(self, server) -> None:
        self.client = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ingest_key()}"})

    def post(self, url: str, data: dict[str, Any], format: str = "json") -> httpx.Response:
        return self.client.post(url, json=data)


def test_the_llm_call_page_shows_the_diff_and_the_timeline_its_line_live(live_uvicorn, page, alice):
    ingest = LiveIngest(live_uvicorn)
    case = cases.edit_in_the_middle(ingest)
    first, second = case.calls
    log_in(page, live_uvicorn)

    page.goto(f"{live_uvicorn.url}/llm-calls/{second.pk}/")
    expect(page.locator("#call-diff .diff-line")).to_have_text(
        "+1 message, 1 changed, −180 tokens; prefix kept 3 messages / 128 tokens · provider cache read 100 "
        "cache break · edit 108 tokens no longer cacheable", use_inner_text=True)
    current, previous = page.locator("#diff-current"), page.locator("#diff-previous")
    expect(current.locator(".kept-prefix > summary")).to_have_text(
        "Kept prefix: 3 messages · 128 tokens · provider cache read 100")
    expect(current.locator(".kept-prefix .msg").first).not_to_be_visible()  # folded until opened
    expect(current.locator("> .msg .badge")).to_have_text(["changed", "uncached", "uncached", "added"])
    expect(previous.locator("> .msg .badge")).to_have_text(["changed"])
    expect(previous.locator("> .msg.fate-changed .text")).to_contain_text("Tromsoe: 4 C, snow.")
    expect(current.locator("> .msg.fate-changed .text")).to_contain_text("[elided: 800 bytes]")
    current.locator(".kept-prefix > summary").click()
    expect(current.locator(".kept-prefix .msg")).to_have_count(3)
    screenshot(page, "llm-call-diff")

    page.click("[data-previous-call]")
    page.wait_for_url(f"{live_uvicorn.url}/llm-calls/{first.pk}/")
    expect(page.locator("#call-diff .diff-line")).to_have_text(
        "First LLM call of the conversation: 6 messages, 436 tokens")

    page.goto(f"{live_uvicorn.url}/conversations/{case.conversation.pk}/")
    wait_live(page)
    lines = page.locator(".timeline .diff-line")
    expect(lines).to_have_count(2)
    expect(lines.nth(1).locator(".badge.cache-break")).to_have_text("cache break · edit")

    # The next turn arrives while the page is open: its call's line appears without a reload.
    more = Events(case.conversation.external_id)
    more.turn("r2", s(20), "And tomorrow?", s(30))
    more.llm("r2", s(21), [cases.SYSTEM, cases.ASK, cases.CALL_OSLO, cases.ELIDED, cases.CALL_BERLIN,
                           cases.RESULT_BERLIN, cases.ANSWER, cases.FOLLOW_UP], cache_read_tokens=250)
    assert ingest.post("/api/ingest/", more.payload()).status_code == 200
    expect(lines).to_have_count(3, timeout=LIVE_WITHIN_MS + 3000)
    expect(lines.nth(2)).to_have_text(
        "+1 message, +20 tokens; prefix kept 7 messages / 256 tokens · provider cache read 250",
        use_inner_text=True)
    expect(page.locator(".timeline .badge.cache-break")).to_have_count(1)
    screenshot(page, "conversation-diff-lines")
    assert page.errors == []
