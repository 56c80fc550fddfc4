"""Live updates in a real Chromium against real uvicorn: bursts are coalesced on the way to the
page, and pages reconnect by themselves after a server restart and catch up on what they missed."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.conf import settings
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult
from playwright.sync_api import expect

from dashboard import hub as live_hub
from pipeline.models import Conversation, Round
from tests.agent_traces import record_turns, span_count
from tests.browser_support import (  # noqa: F401 (browser, page: fixtures)
    _orm_beside_playwright,
    browser,
    ingest_key,
    log_in,
    page,
    send_turn,
    wait_live,
    wait_until_true,
)
from tests.dashboard_fixtures import make_conversation, make_llm_call

pytestmark = pytest.mark.browser
BURST = 30  # OTLP requests, each its own ingest commit and signal


# Records each websocket message, and when each fragment fetch starts, with the page's own clock.
RECORD_FRAMES = """
window.__frames = [];
window.__fetches = [];
window.WebSocket = class extends WebSocket {
  constructor(...args) {
    super(...args);
    this.addEventListener("message", (event) => window.__frames.push([performance.now(), JSON.parse(event.data)]));
  }
};
const pageFetch = window.fetch;
window.fetch = (url, ...rest) => {
  if (String(url).includes("/fragments/")) window.__fetches.push(performance.now());
  return pageFetch(url, ...rest);
};
"""


def send_burst(server, prefix: str, pause: float = 0.0) -> None:
    """BURST one-turn conversations, each its own OTLP request (one ingest commit and signal),
    as fast as the server answers, or `pause` seconds apart."""
    batches = [record_turns(f"{prefix}-{n}", turns=1) for n in range(BURST)]
    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers={"Authorization": f"Bearer {ingest_key()}"})
    for n, spans in enumerate(batches):
        if n:
            time.sleep(pause)
        assert exporter.export(spans) is SpanExportResult.SUCCESS
    exporter.shutdown()


def recorded_overview(uvicorn_factory, artifact_dir, page, env: dict[str, str]):
    """(a server started with `env`, its "hello"): the overview open on it, live, recording."""
    server = uvicorn_factory({"CTXLENS_ARTIFACT_DIR": str(artifact_dir), **env})
    page.add_init_script(RECORD_FRAMES)
    log_in(page, server)
    wait_live(page)
    return server, page.evaluate("window.__frames.find(([, m]) => m.type === 'hello')[1]")


def test_a_burst_of_ingest_reaches_the_page_as_a_few_messages_that_miss_nothing(uvicorn_factory, artifact_dir,
                                                                                  page, alice):
    # An interval far wider than the page's clock jitter, so that the spacing below is the rule's,
    # and a burst lasting several of them (30 requests at least 40 ms apart), past the frames
    # that may go back to back.
    server, hello = recorded_overview(uvicorn_factory, artifact_dir, page, {"CTXLENS_LIVE_INTERVAL_MS": "200"})
    interval_ms = hello["interval_ms"]
    assert interval_ms == 200
    started = page.evaluate("performance.now()")
    send_burst(server, "conv-burst", pause=0.04)
    sent = page.evaluate("performance.now()")

    expected = BURST * span_count(turns=1)
    expect(page.locator('#overview-totals [data-stat="conversations"]')).to_have_text(str(BURST), timeout=5000)
    wait_until_true(page, f"""window.__frames.filter(([, m]) => m.type === 'changes')
                              .reduce((sum, [, m]) => sum + m.spans, 0) >= {expected}""", timeout_ms=5000)
    changes = page.evaluate(f"window.__frames.filter(([at, m]) => m.type === 'changes' && at >= {started})")
    # Nothing lost: every span and new conversation of the burst is named by some message.
    assert sum(m["spans"] for _, m in changes) == expected
    named = {i for _, m in changes for i in m["new_conversation_ids"]}
    assert named == set(Conversation.objects.filter(external_id__startswith="conv-burst-").values_list("pk", flat=True))
    # Coalesced: FRAME_BURST messages back to back at most, then one per interval while the
    # burst lasted, plus a last one.
    assert len(changes) <= live_hub.FRAME_BURST + 1 + (sent - started) / interval_ms, (len(changes), sent - started)
    assert len(changes) < BURST
    # The page's clock sees delivery jitter, which can move one message towards the next; what
    # it cannot do is put FRAME_BURST + 2 messages inside two intervals.
    arrivals = [at for at, _ in changes]
    apart = live_hub.FRAME_BURST + 1
    assert len(arrivals) > apart, arrivals  # the burst outlasted the frames that go back to back
    assert all(c - a >= 1.6 * interval_ms for a, c in zip(arrivals, arrivals[apart:])), arrivals


def test_a_stream_of_changes_is_fetched_by_the_page_at_its_own_pace_and_in_full(uvicorn_factory, artifact_dir,
                                                                                 page, alice):
    # Messages come at most every 25 ms sustained (the default), a few back to back; the page fetches at most every 400 ms.
    server, hello = recorded_overview(uvicorn_factory, artifact_dir, page, {"CTXLENS_LIVE_REFRESH_MS": "400"})
    assert hello["interval_ms"] == settings.CTXLENS_LIVE_INTERVAL_MS and hello["refresh_ms"] == 400
    wait_until_true(page, "window.__fetches.length >= 1", timeout_ms=5000)  # the catch-up on connect
    before = page.evaluate("window.__fetches.length")

    send_burst(server, "conv-stream")

    # In full: the page shows every conversation, and once messages stop (the deferred token
    # counts and finding counts send some after the burst), a fetch started after the last one.
    expect(page.locator('#overview-totals [data-stat="conversations"]')).to_have_text(str(BURST), timeout=5000)
    wait_until_true(page, """(() => {
        const last = window.__frames.filter(([, m]) => m.type === 'changes').at(-1)[0];
        return performance.now() - last > 1000 && window.__fetches.at(-1) >= last;
    })()""", timeout_ms=20_000)
    changes = page.evaluate("window.__frames.filter(([, m]) => m.type === 'changes').map(([at]) => at)")
    fetches = page.evaluate("window.__fetches")[before:]
    # At its own pace: more messages than fetches, and no two fetches closer than the gap (the
    # page's timers never fire early; 1 ms for the clock's rounding).
    assert len(changes) > len(fetches), (changes, fetches)
    assert all(b - a >= 399 for a, b in zip(fetches, fetches[1:])), fetches


def test_the_list_reconnects_after_a_server_restart_and_catches_up(uvicorn_factory, artifact_dir, page, alice):
    env = {"CTXLENS_ARTIFACT_DIR": str(artifact_dir)}
    server = uvicorn_factory(env)
    make_conversation("conv-before-restart", rounds=1)
    log_in(page, server)
    page.goto(f"{server.url}/conversations/")
    wait_live(page)
    page.evaluate("window.__not_reloaded = true")
    server.stop()
    expect(page.locator("#live-status")).to_have_attribute("data-state", "reconnecting", timeout=5000)
    make_conversation("conv-while-down", title="Arrived while the server was down", rounds=1)
    uvicorn_factory(env, port=server.port)
    wait_live(page, timeout=15_000)
    expect(page.locator("#conversation-results tbody tr").filter(has_text="Arrived while the server was down")
           ).to_be_visible()
    assert page.evaluate("window.__not_reloaded")


def test_a_conversation_reconnects_after_a_server_restart_and_shows_the_turns_it_missed(
        uvicorn_factory, artifact_dir, page, alice):
    env = {"CTXLENS_ARTIFACT_DIR": str(artifact_dir)}
    server = uvicorn_factory(env)
    demo = make_conversation("conv-restart", rounds=1)
    log_in(page, server)
    page.goto(f"{server.url}/conversations/{demo.conversation.pk}/")
    wait_live(page)
    expect(page.locator(".turn")).to_have_count(1)
    page.evaluate("window.__not_reloaded = true")
    server.stop()
    expect(page.locator("#live-status")).to_have_attribute("data-state", "reconnecting", timeout=5000)

    at = demo.rounds[0].started_at + timedelta(minutes=1)
    missed = Round.objects.create(conversation=demo.conversation, key="conv-restart:missed", started_at=at,
                                  user_message="Asked while the server was down", status="running")
    make_llm_call(demo.conversation, missed, at + timedelta(seconds=1), output_text="Thinking it over.")
    Conversation.objects.filter(pk=demo.conversation.pk).update(round_count=2, llm_call_count=3, status="running")

    uvicorn_factory(env, port=server.port)
    wait_live(page, timeout=15_000)
    turn = page.locator(f"#round-{missed.pk}")
    expect(turn).to_contain_text("Asked while the server was down")
    expect(turn.locator(".step-running")).to_be_visible()
    expect(page.locator(".turn")).to_have_count(2)
    expect(page.locator('#conversation-header [data-stat="rounds"]')).to_have_text("2")
    assert page.evaluate("Chart.getChart('context-chart').data.labels.length") == 3
    assert page.evaluate("window.__not_reloaded")


def test_a_conversation_whose_live_fetch_fails_fetches_the_new_turn_again(live_uvicorn, page, alice):
    demo = make_conversation("conv-flaky", rounds=1)
    log_in(page, live_uvicorn)
    page.goto(f"{live_uvicorn.url}/conversations/{demo.conversation.pk}/")
    wait_live(page)
    page.wait_for_load_state("networkidle")
    page.evaluate("window.__not_reloaded = true")
    failed: list[str] = []

    def fail_twice(route) -> None:
        # As many failures as the ingest sends messages (one or two): only a retry recovers.
        if len(failed) >= 2:
            route.continue_()
        else:
            failed.append(route.request.url)
            route.fulfill(status=502, body="bad gateway")

    page.route("**/fragments/conversations/**", fail_twice)
    send_turn(live_uvicorn, ingest_key(), "conv-flaky", tool="get_weather", observation="Rain, 9 °C",
              user_message="And in Bergen?")
    expect(page.locator(".turn").filter(has_text="And in Bergen?")).to_be_visible(timeout=8000)
    assert len(failed) == 2 and "rounds=" in failed[0]
    assert page.evaluate("window.__not_reloaded")


def _one_turn_a_page(rounds: int, external_id: str):
    """A conversation whose turns are 40 steps each by their stored counts: one turn a page."""
    demo = make_conversation(external_id, rounds=rounds)
    Round.objects.filter(conversation=demo.conversation).update(llm_call_count=40, tool_call_count=0)
    Conversation.objects.filter(pk=demo.conversation.pk).update(round_count=rounds, llm_call_count=40 * rounds,
                                                                tool_call_count=0)
    return demo


def test_a_long_conversation_pages_through_its_turns(live_uvicorn, page, alice):
    demo = _one_turn_a_page(3, "conv-pages")
    log_in(page, live_uvicorn)
    page.goto(f"{live_uvicorn.url}/conversations/{demo.conversation.pk}/")
    expect(page.locator("#timeline-window")).to_have_text("Showing turns 3–3 of 3.")
    expect(page.locator(".turn h3")).to_have_text(["Turn 3"])
    page.locator(".pager").first.get_by_role("link", name="Older →").click()
    expect(page.locator(".turn h3")).to_have_text(["Turn 2"])
    assert page.url.endswith("?page=2")
    # The chart shows the calls of the turn shown: its two LLM calls.
    assert page.evaluate("Chart.getChart('context-chart').data.labels.length") == 2
    page.locator(".pager").first.get_by_role("link", name="Older →").click()
    expect(page.locator(".turn h3")).to_have_text(["Turn 1"])
    expect(page.locator(".pager").first.get_by_role("link", name="Older →")).to_have_count(0)
    page.locator(".pager").first.get_by_role("link", name="← Newer").click()
    expect(page.locator(".turn h3")).to_have_text(["Turn 2"])


def test_a_link_to_a_step_of_an_older_turn_opens_the_page_that_shows_it(live_uvicorn, page, alice):
    demo = _one_turn_a_page(3, "conv-pages-link")
    first, call = demo.rounds[0], demo.llm_calls[0]
    log_in(page, live_uvicorn)
    page.goto(f"{live_uvicorn.url}/llm-calls/{call.pk}/")
    page.locator(".crumbs").get_by_role("link", name=demo.conversation.title).click()
    expect(page.locator(".turn h3")).to_have_text(["Turn 1"])
    assert page.url.endswith(f"/conversations/{demo.conversation.pk}/?page=3#round-{first.pk}")
    expect(page.locator(f"#round-{first.pk}")).to_be_in_viewport()


def test_a_new_turn_appears_live_on_the_latest_page_only(live_uvicorn, page, alice):
    demo = _one_turn_a_page(2, "conv-pages-live")
    log_in(page, live_uvicorn)
    page.goto(f"{live_uvicorn.url}/conversations/{demo.conversation.pk}/")
    older = page.context.new_page()
    older.goto(f"{live_uvicorn.url}/conversations/{demo.conversation.pk}/?page=2")
    wait_live(page)
    wait_live(older)
    page.wait_for_load_state("networkidle")
    older.wait_for_load_state("networkidle")
    for tab in (page, older):
        tab.evaluate("window.__not_reloaded = true")

    send_turn(live_uvicorn, ingest_key(), "conv-pages-live", tool="get_weather", observation="Rain, 9 °C",
              user_message="And in Bergen?")
    expect(page.locator(".turn").filter(has_text="And in Bergen?")).to_be_visible(timeout=8000)
    # One turn a page: the new turn takes turn 2's place, as a reload would show.
    expect(page.locator(".turn h3")).to_have_text(["Turn 3"])
    expect(page.locator(".pager").first).to_contain_text("Page 1 of 3")
    # The older page refreshed its header, and kept its one turn, though page 2 is turn 2's now.
    expect(older.locator('#conversation-header [data-stat="rounds"]')).to_have_text("3", timeout=8000)
    expect(older.locator(".turn h3")).to_have_text(["Turn 1"])
    expect(older.locator("#timeline-moved")).to_be_visible()
    assert page.evaluate("window.__not_reloaded") and older.evaluate("window.__not_reloaded")
    older.close()


# The timeline and the context chart of the page: the turns listed, the LLM calls they list, and
# the LLM calls the chart has a bar for (a click on one scrolls to its step).
TIMELINE_AND_CHART = """(() => ({
  turns: [...document.querySelectorAll('#timeline > .turn h3')].map((h) => h.textContent),
  calls: [...document.querySelectorAll('#timeline .step-llm')].map((step) => Number(step.id.slice(4))),
  charted: Chart.getChart('context-chart').$ctx.ids,
}))()"""
AGREE = f"(({TIMELINE_AND_CHART})).calls.join() === (({TIMELINE_AND_CHART})).charted.join()"


def _forty_turns(server, external_id: str) -> None:
    """40 turns of 3 steps each (an LLM call and two tools) over OTLP: pages of 16, 16 and 8 turns,
    counted from the newest."""
    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers={"Authorization": f"Bearer {ingest_key()}"})
    assert exporter.export(record_turns(external_id, turns=40)) is SpanExportResult.SUCCESS
    exporter.shutdown()


def _open_then_add_a_turn(server, page, external_id: str, query: str) -> dict:
    """The conversation open at `query`, live; one more turn ingested; the page once it has it (and
    has had a few seconds to bring its timeline and chart into agreement)."""
    _forty_turns(server, external_id)
    conversation = Conversation.objects.get(external_id=external_id)
    log_in(page, server)
    page.goto(f"{server.url}/conversations/{conversation.pk}/{query}")
    wait_live(page)
    page.wait_for_load_state("networkidle")
    before = page.evaluate(TIMELINE_AND_CHART)
    assert len(before["turns"]) == 16 and before["calls"] == before["charted"]
    page.evaluate("window.__not_reloaded = true")

    send_turn(server, ingest_key(), external_id, tool="get_weather", observation="Rain, 9 °C",
              user_message="And in Bergen?")
    expect(page.locator('#conversation-header [data-stat="rounds"]')).to_have_text("41", timeout=8000)
    try:
        wait_until_true(page, AGREE, timeout_ms=3000)
    except AssertionError:
        pass  # the assertions below say how they differ
    assert page.evaluate("window.__not_reloaded")
    return page.evaluate(TIMELINE_AND_CHART)


def test_the_latest_page_follows_a_new_turn_in_its_timeline_and_its_chart_alike(live_uvicorn, page, alice):
    live = _open_then_add_a_turn(live_uvicorn, page, "conv-live-latest", "")

    # The new turn joined, the oldest left: the timeline and the chart both show turns 26–41.
    assert live["calls"] == live["charted"]
    assert live["turns"] == [f"Turn {n}" for n in range(26, 42)]
    expect(page.locator(".turn").last).to_contain_text("And in Bergen?")
    expect(page.locator("#timeline-window")).to_have_text("Showing turns 26–41 of 41.")
    # As a reload shows them.
    page.reload()
    page.wait_for_load_state("networkidle")
    assert page.evaluate(TIMELINE_AND_CHART) == live


def test_an_older_page_keeps_its_turns_in_its_timeline_and_its_chart_as_new_turns_come(live_uvicorn, page, alice):
    live = _open_then_add_a_turn(live_uvicorn, page, "conv-live-older", "?page=2")

    # Page 2 now names turns 10–25; the page keeps turns 9–24, its chart as well, and says why.
    assert live["calls"] == live["charted"]
    assert live["turns"] == [f"Turn {n}" for n in range(9, 25)]
    expect(page.locator("#timeline-window")).to_have_text("Showing turns 9–24 of 41.")
    expect(page.locator("#timeline-moved")).to_be_visible()
    expect(page.locator(".turn").filter(has_text="And in Bergen?")).to_have_count(0)
    # Every bar's step is on the page: a click on it has somewhere to scroll to.
    assert page.evaluate("Chart.getChart('context-chart').$ctx.ids.every((id) => document.getElementById(`llm-${id}`))")


def test_the_latest_page_drops_the_records_of_no_turn_that_left_with_its_oldest_turn(live_uvicorn, page, alice):
    # One turn a page; an LLM call of no turn after turn 2 started, on page 1 with it.
    demo = _one_turn_a_page(2, "conv-pages-unassigned")
    stray = make_llm_call(demo.conversation, None, demo.rounds[-1].started_at + timedelta(seconds=10))
    log_in(page, live_uvicorn)
    page.goto(f"{live_uvicorn.url}/conversations/{demo.conversation.pk}/")
    wait_live(page)
    page.wait_for_load_state("networkidle")
    expect(page.locator("#round-none")).to_have_count(1)
    assert stray.pk in page.evaluate(TIMELINE_AND_CHART)["charted"]

    send_turn(live_uvicorn, ingest_key(), "conv-pages-unassigned", tool="get_weather", observation="Rain, 9 °C",
              user_message="And in Bergen?")
    expect(page.locator(".turn h3")).to_have_text(["Turn 3"], timeout=8000)
    expect(page.locator("#round-none")).to_have_count(0)
    wait_until_true(page, AGREE, timeout_ms=3000)
    live = page.evaluate(TIMELINE_AND_CHART)
    assert stray.pk not in live["charted"]
    page.reload()
    page.wait_for_load_state("networkidle")
    assert page.evaluate(TIMELINE_AND_CHART) == live
