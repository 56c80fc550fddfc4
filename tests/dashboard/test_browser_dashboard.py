"""The dashboard in a real Chromium (Playwright) against a real uvicorn on the test database.

Spans arrive the way an agent sends them: the OpenTelemetry SDK's OTLP/HTTP exporter posting
to the live server's /v1/traces. Every page is photographed at 1280 px and 390 px wide under
test-artifacts/screenshots/ for a person to look at.
"""

from __future__ import annotations

import time
from urllib.parse import quote

import pytest
from django.core.management import call_command
from playwright.sync_api import expect

from pipeline.models import Artifact, CompressionEvent, Conversation, LLMCall, ToolCall
from tests.browser_support import (  # noqa: F401 (browser, page: fixtures)
    LIVE_WITHIN_MS,
    _orm_beside_playwright,
    browser,
    ingest_key,
    log_in,
    page,
    screenshot,
    send_turn,
    wait_live,
    wait_until_true,
)
from tests.dashboard_fixtures import (
    XSS_IMG,
    XSS_PAYLOAD,
    XSS_SCRIPT,
    bidi,
    hostile,
    make_conversation,
    make_hostile_conversation,
)

pytestmark = pytest.mark.browser


def test_log_in_and_see_the_demo_data_on_every_page(live_uvicorn, page, alice):
    call_command("demo_agent", stdout=open("/dev/null", "w"))
    page.goto(f"{live_uvicorn.url}/login/")
    screenshot(page, "login")
    log_in(page, live_uvicorn)
    wait_live(page)
    conversations = Conversation.objects.count()
    assert conversations >= 3
    expect(page.locator('#overview-totals [data-stat="conversations"]')).to_have_text(str(conversations))
    expect(page.locator('#overview-tools tr[data-tool="query_sales"]')).to_be_visible()
    expect(page.locator("#overview-active li")).to_have_count(min(conversations, 8))
    expect(page.locator("#overview-compressions tbody tr").first).to_be_visible()
    assert page.evaluate("Chart.getChart('tokens-chart').data.datasets[0].data.reduce((a, b) => a + b, 0)") > 0
    screenshot(page, "overview")

    page.click("nav >> text=Conversations")
    expect(page.locator("#conversation-results tbody tr")).to_have_count(conversations)
    screenshot(page, "conversations")

    compressed = CompressionEvent.objects.order_by("pk").first()
    page.goto(f"{live_uvicorn.url}/conversations/{compressed.conversation_id}/")
    wait_live(page)
    calls = LLMCall.objects.filter(conversation_id=compressed.conversation_id).count()
    expect(page.locator(".turn")).to_have_count(compressed.conversation.round_count)
    expect(page.locator(".turn .ctx-bar")).to_have_count(calls)
    assert page.evaluate("Chart.getChart('context-chart').data.labels.length") == calls
    screenshot(page, "conversation")
    page.goto(f"{live_uvicorn.url}/compressions/{compressed.pk}/")
    expect(page.locator("#compression-before .msg")).to_have_count(compressed.messages_before)
    expect(page.locator("#compression-after .msg")).to_have_count(compressed.messages_after)
    screenshot(page, "compression")
    page.goto(f"{live_uvicorn.url}/compressions/")
    expect(page.locator("main tbody tr")).to_have_count(CompressionEvent.objects.count())
    screenshot(page, "compressions")
    call = LLMCall.objects.exclude(input_messages=[]).order_by("pk").first()
    page.goto(f"{live_uvicorn.url}/llm-calls/{call.pk}/")
    expect(page.locator("h1")).to_have_text(call.model)
    expect(page.locator(".grid-2 section").first.locator(".msg")).to_have_count(len(call.input_messages))
    expect(page.locator(".ctx-bar")).to_have_count(1)
    screenshot(page, "llm-call")
    page.goto(f"{live_uvicorn.url}/tools/")
    wait_live(page)
    assert page.evaluate("Chart.getChart('latency-chart').data.datasets[0].data.reduce((a, b) => a + b, 0)") > 0
    screenshot(page, "tools")
    page.click("#tools-stats >> text=web_search")
    expect(page.locator("h1")).to_contain_text("web_search")
    screenshot(page, "tool-calls")
    page.goto(f"{live_uvicorn.url}/artifacts/")
    rows = page.locator("#artifact-results tbody tr")
    expect(rows.first).to_be_visible()
    screenshot(page, "artifacts")
    rows.first.locator("a").first.click()
    expect(page.locator("#artifact-preview")).not_to_be_empty()
    screenshot(page, "artifact")
    assert page.errors == []


def test_a_new_conversation_and_its_tool_calls_arrive_live_without_a_reload(live_uvicorn, browser, page, alice):
    make_conversation("conv-existing", rounds=1)  # get_weather: 1 call so far
    log_in(page, live_uvicorn)
    wait_live(page)
    stats_row = page.locator('#overview-tools tr[data-tool="get_weather"] [data-stat="calls"]')
    expect(stats_row).to_have_text("1")
    list_page = browser.new_page(storage_state=page.context.storage_state())
    list_page.goto(f"{live_uvicorn.url}/conversations/")
    wait_live(list_page)
    tools_page = browser.new_page(storage_state=page.context.storage_state())
    tools_page.goto(f"{live_uvicorn.url}/tools/")
    wait_live(tools_page)
    histogram_total = "Chart.getChart('latency-chart').data.datasets[0].data.reduce((a, b) => a + b, 0)"
    before = tools_page.evaluate(histogram_total)
    pages = (page, list_page, tools_page)
    for p in pages:
        p.evaluate("window.__not_reloaded = true")

    send_turn(live_uvicorn, ingest_key(), "conv-live-new", tool="get_weather", observation="Cloudy, 12 °C")
    sent = time.monotonic()

    def left() -> int:
        return max(1, LIVE_WITHIN_MS - int(1000 * (time.monotonic() - sent)))

    expect(list_page.locator("#conversation-results tbody tr").filter(has_text="What is the weather in Oslo?")
           ).to_be_visible(timeout=LIVE_WITHIN_MS)
    expect(stats_row).to_have_text("2", timeout=left())
    expect(tools_page.locator('#tools-stats tr[data-tool="get_weather"] [data-stat="calls"]')).to_have_text(
        "2", timeout=left())
    assert tools_page.evaluate(histogram_total) == before + 1
    assert all(p.evaluate("window.__not_reloaded") for p in pages)
    expect(list_page.locator("#conversation-results tbody tr")).to_have_count(2)
    screenshot(list_page, "conversations-live")
    list_page.close()
    tools_page.close()


def test_a_conversation_shows_context_bars_and_a_compression_before_and_after(live_uvicorn, page, alice):
    demo = make_conversation("conv-bars", rounds=3)
    log_in(page, live_uvicorn)
    page.goto(f"{live_uvicorn.url}/conversations/{demo.conversation.pk}/")
    wait_live(page)
    bars = page.locator(".ctx-bar")
    expect(bars).to_have_count(len(demo.llm_calls))
    first = bars.first.locator(".seg")
    expect(first).to_have_count(6)  # system, skills, user, assistant, tool observations, free
    widths = first.evaluate_all("els => els.map(e => e.getBoundingClientRect().width)")
    bar_width = bars.first.evaluate("e => e.getBoundingClientRect().width")
    assert widths[-1] > 0.7 * bar_width  # 23.8k of 128k used: most of the bar is free
    assert abs(sum(widths) - bar_width) < 3
    markers = page.evaluate("Chart.getChart('context-chart').data.datasets.find(d => d.label === 'Compression')"
                            ".data.filter(v => v !== null).length")
    assert markers == 1
    screenshot(page, "conversation-bars")

    page.click(f"#compression-{demo.compression.pk} a")
    expect(page.locator("#compression-before .msg")).to_have_count(5)
    expect(page.locator("#compression-after .msg")).to_have_count(3)
    expect(page.locator("#compression-before .msg.fate-dropped")).to_contain_text("OLD OBSERVATION")
    expect(page.locator("#compression-before .msg.fate-summarised")).to_have_count(2)
    expect(page.locator('#compression-totals [data-stat="tokens-saved"]')).to_have_text("63k")
    screenshot(page, "compression-detail")


def test_html_in_trace_content_renders_as_text_and_runs_nothing(live_uvicorn, page, alice):
    demo = make_conversation("conv-xss", rounds=1)  # the stored observation carries both payloads
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    log_in(page, live_uvicorn)
    page.goto(f"{live_uvicorn.url}/conversations/{demo.conversation.pk}/")
    wait_live(page)
    observation = page.locator(f"#tool-{demo.tool_calls[0].pk} pre.obs")
    expect(observation).to_have_text(XSS_PAYLOAD)

    # The same payloads arriving live, inside a new turn swapped into the open page.
    send_turn(live_uvicorn, ingest_key(), "conv-xss", tool="get_weather", observation=XSS_PAYLOAD,
              user_message=f"live {XSS_IMG}")
    live_turn = page.locator(".turn").nth(1)
    expect(live_turn).to_contain_text(XSS_SCRIPT, timeout=LIVE_WITHIN_MS)
    expect(live_turn.locator(".msg-user")).to_contain_text(XSS_IMG)
    chart_calls = "Chart.getChart('context-chart').data.labels.length"
    wait_until_true(page, f"{chart_calls} === {len(demo.llm_calls) + 1}", timeout_ms=LIVE_WITHIN_MS)
    page.wait_for_timeout(300)  # let an image error handler fire, were there one
    assert page.evaluate("window.__xss") is None
    assert page.locator('img[src="x"], main script:not([type="application/json"])').count() == 0
    assert dialogs == [] and page.errors == []
    screenshot(page, "conversation-xss")


def test_an_anonymous_browser_goes_to_the_login_page_and_its_websocket_is_refused(live_uvicorn, page):
    for path in ("/", "/conversations/", "/tools/", "/artifacts/"):
        page.goto(f"{live_uvicorn.url}{path}")
        expect(page).to_have_url(f"{live_uvicorn.url}/login/?next={path}")
    code = page.evaluate("""url => new Promise(resolve => {
        const socket = new WebSocket(url);
        socket.onclose = event => resolve(event.code);
    })""", f"{live_uvicorn.ws_url}/ws/live/")
    assert code == 4401


def test_no_page_inserts_markup_from_any_trace_field(live_uvicorn, page, alice, artifact_dir):
    """Every text field of a conversation carries markup (dashboard_fixtures.hostile): on no page,
    first rendered or swapped in live by the page's script, does it become an element."""
    demo = make_hostile_conversation(artifact_dir)
    tags = ["conv-title", "conv-model", "agent", "user-message", "final-answer", "llm-model", "llm-error",
            "input-message", "thought", "requested-tool", "observation", "tool-name", "tool-error", "lvl", "code",
            "summary", "before-message", "category", "skill", "chain", "mime", "artifact-summary",
            "artifact-content"]
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    log_in(page, live_uvicorn)
    tool = quote(demo.tool_calls[1].tool_name)
    paths = ["/?window=all", "/conversations/", f"/conversations/{demo.conversation.pk}/",
             f"/llm-calls/{demo.llm_calls[0].pk}/", "/compressions/", f"/compressions/{demo.compression.pk}/",
             f"/tools/?window=all&tool={tool}", f"/tools/calls/?window=all&tool={tool}", "/artifacts/",
             f"/artifacts/{demo.artifact.artifact_id}/"]
    for path in paths:
        page.goto(f"{live_uvicorn.url}{path}")
        if page.locator("#live-status").count():
            wait_live(page)  # the page has swapped in the fragments it fetched on connecting
            page.wait_for_load_state("networkidle")
        leaked = page.evaluate("""tags => ({
            ran: window.__xss ?? null,
            images: document.querySelectorAll('img[src="x"]').length,
            elements: tags.filter(tag => document.getElementById(tag) !== null),
        })""", tags)
        assert leaked == {"ran": None, "images": 0, "elements": []}, path
    expect(page.locator("#artifact-preview")).to_have_text(hostile("artifact-content"))
    page.goto(f"{live_uvicorn.url}/conversations/{demo.conversation.pk}/")
    expect(page.locator("h1")).to_have_text(hostile("conv-title"))
    expect(page.locator(f"#tool-{demo.tool_calls[0].pk} pre.obs")).to_have_text(hostile("observation"))
    screenshot(page, "conversation-hostile")
    assert dialogs == [] and page.errors == []


# Elements inside a card (or a turn, step or message) that stick out of it on the right.
OVERFLOWING = """() => ({
  page: document.documentElement.scrollWidth - window.innerWidth,
  boxes: [...document.querySelectorAll('.card, .turn, .step, .msg')]
    .filter((box) => box.scrollWidth > box.clientWidth + 1)
    .map((box) => `${box.id || box.className}: ${box.scrollWidth - box.clientWidth}px`),
})"""


def test_long_unbroken_trace_text_never_makes_a_page_wider_than_the_screen(live_uvicorn, page, alice, artifact_dir):
    long = "x" * 40 + "_" + "y" * 60 + "-" + "z" * 50  # a break opportunity or two, far apart
    demo = make_conversation("conv-" + long, title="T" + long, model="m" + long, rounds=2, artifact_dir=artifact_dir)
    make_conversation("conv-short", rounds=1)
    Conversation.objects.filter(pk=demo.conversation.pk).update(agent_name="a" + long, user_id="u" + long)
    ToolCall.objects.filter(pk=demo.tool_calls[1].pk).update(
        tool_name="t" + long, error_type="E" + long, error_code="C" + long[:60], error_message="M" + long,
        tool_call_id="call_" + long)
    Artifact.objects.filter(pk=demo.artifact.pk).update(mime="text/" + long, summary="S" + long)
    log_in(page, live_uvicorn)
    paths = ["/?window=all", "/conversations/", f"/conversations/{demo.conversation.pk}/", "/tools/?window=all",
             "/tools/calls/?window=all", "/artifacts/", f"/artifacts/{demo.artifact.artifact_id}/", "/compressions/",
             f"/compressions/{demo.compression.pk}/", f"/llm-calls/{demo.llm_calls[0].pk}/"]
    for path in paths:
        page.goto(f"{live_uvicorn.url}{path}")
        page.wait_for_load_state("networkidle")
        for width in (1280, 390):
            page.set_viewport_size({"width": width, "height": 900})
            page.wait_for_timeout(50)
            assert page.evaluate(OVERFLOWING) == {"page": 0, "boxes": []}, (path, width)
    page.goto(f"{live_uvicorn.url}/tools/calls/?window=all")
    screenshot(page, "tool-calls-long-text")


# For every text node with a right-to-left override: the nearest ancestors that hold nothing but
# that text (the untrusted value alone) must include a bidi isolate: an inline element with
# unicode-bidi isolate (<bdi>, or the stylesheet's rule) or a block of its own (a paragraph).
UNISOLATED_BIDI = """() => {
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const bad = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!node.data.includes("\\u202e")) continue;
    const own = node.data.trim();
    let el = node.parentElement, isolated = false;
    while (el && el.textContent.trim() === own) {
      const style = getComputedStyle(el);
      if (!style.display.startsWith("inline") || ["isolate", "isolate-override", "plaintext"].includes(style.unicodeBidi)) {
        isolated = true;
        break;
      }
      el = el.parentElement;
    }
    if (!isolated) bad.push(`${node.parentElement.tagName}.${node.parentElement.className} in ${el ? el.tagName : "?"}: ${own.slice(0, 30)}`);
  }
  return bad;
}"""


def test_bidi_controls_in_trace_text_never_reorder_the_text_around_them(live_uvicorn, page, alice, artifact_dir):
    """A right-to-left override in any trace field (tool names, titles, messages, artifact names …)
    stays inside that field's text on every page, first rendered or swapped in live."""
    demo = make_hostile_conversation(artifact_dir, text=bidi)
    log_in(page, live_uvicorn)
    tool = quote(demo.tool_calls[1].tool_name)
    paths = ["/?window=all", "/conversations/", f"/conversations/{demo.conversation.pk}/",
             f"/llm-calls/{demo.llm_calls[0].pk}/", "/compressions/", f"/compressions/{demo.compression.pk}/",
             f"/tools/?window=all&tool={tool}", f"/tools/calls/?window=all&tool={tool}", "/artifacts/",
             f"/artifacts/{demo.artifact.artifact_id}/"]
    found = 0
    for path in paths:
        page.goto(f"{live_uvicorn.url}{path}")
        if page.locator("#live-status").count():
            wait_live(page)
            page.wait_for_load_state("networkidle")
        found += page.evaluate("() => document.body.innerText.split('\\u202e').length - 1")
        assert page.evaluate(UNISOLATED_BIDI) == [], path
    assert found > 20  # the fields are on the pages
    page.goto(f"{live_uvicorn.url}/conversations/{demo.conversation.pk}/")
    screenshot(page, "conversation-bidi")
