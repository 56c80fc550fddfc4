"""The dashboard's pages and live fragments, through Django's test client on real SQLite rows."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from dashboard.context_bars import context_bar
from pipeline.ingest.normalise.values import MAX_COUNT
from pipeline.models import CompressionEvent, Conversation, LLMCall
from tests.dashboard_fixtures import XSS_IMG, XSS_SCRIPT, make_conversation, make_skill, make_tool_call

pytestmark = pytest.mark.django_db

PAGES = ["overview", "conversations", "compressions", "tools", "tool-calls", "artifacts"]


@pytest.fixture
def demo(artifact_dir):
    return make_conversation(artifact_dir=artifact_dir, rounds=3)


@pytest.fixture
def client_alice(client, alice):
    client.force_login(alice)
    return client


def detail_urls(demo) -> list[str]:
    return [
        reverse("conversation", args=[demo.conversation.pk]),
        reverse("llm-call", args=[demo.llm_calls[0].pk]),
        reverse("compression", args=[demo.compression.pk]),
        reverse("artifact", args=[demo.artifact.artifact_id]),
    ]


def test_every_page_sends_anonymous_users_to_the_login_page(client, demo):
    for url in [reverse(name) for name in PAGES] + detail_urls(demo):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("login") + "?next="), url


def test_fragment_endpoints_answer_401_json_when_logged_out(client, demo):
    for name in ["overview-fragments", "conversations-fragments", "tools-fragments", "artifacts-fragments"]:
        response = client.get(reverse(name))
        assert response.status_code == 401
        assert response.json() == {"error": "login required"}
    response = client.get(reverse("conversation-fragments", args=[demo.conversation.pk]))
    assert response.status_code == 401


def test_every_page_renders_with_a_script_blocking_content_security_policy(client_alice, demo):
    for url in [reverse(name) for name in PAGES] + detail_urls(demo):
        response = client_alice.get(url)
        assert response.status_code == 200, url
        csp = response["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]


def test_the_login_page_renders_and_logs_in(client, alice):
    response = client.get(reverse("login"))
    assert response.status_code == 200
    assert b"Log in to ctxlens" in response.content
    response = client.post(reverse("login"), {"username": "alice", "password": "alice-pass-123", "next": "/tools/"})
    assert response.status_code == 302 and response["Location"] == "/tools/"
    client.logout()
    response = client.post(reverse("login"), {"username": "alice", "password": "wrong"})
    assert response.status_code == 200 and b"did not match" in response.content


def test_overview_shows_totals_tools_compressions_errors_and_chart_data(client_alice, demo):
    response = client_alice.get(reverse("overview"))
    html = response.content.decode()
    totals = response.context["totals"]
    assert totals.llm_calls == 6 and totals.conversations == 1
    assert totals.tool_calls == 6 and totals.tool_errors == 3
    assert totals.compressions == 1 and totals.tokens_saved == 63_000
    stats = {s.tool_name: s for s in response.context["tool_stats"]}
    assert stats["web_search"].success_rate == 0 and stats["web_search"].retries == 6
    assert stats["get_weather"].calls == 3 and stats["get_weather"].p50_duration_ms == pytest.approx(200.0, rel=0.02)
    assert 'data-tool="get_weather"' in html and "search backend did not answer" in html
    assert reverse("compression", args=[demo.compression.pk]) in html
    chart = json.loads(re.search(r'<script id="tokens-chart-data" type="application/json">(.*?)</script>',
                                 html, re.S).group(1))
    assert len(chart["labels"]) == 60
    assert sum(chart["input"]) == sum(c.input_tokens for c in demo.llm_calls)


def test_overview_counts_the_conversations_last_active_in_its_window(client_alice):
    now = timezone.now()
    ages = {"ten-minutes": timedelta(minutes=10), "three-hours": timedelta(hours=3), "two-days": timedelta(days=2),
            "twenty-days": timedelta(days=20), "sixty-days": timedelta(days=60)}
    stored = {name: Conversation.objects.create(external_id=name, started_at=now - timedelta(days=90),
                                                last_activity_at=now - age) for name, age in ages.items()}
    stored["sixty-days"].last_activity_at = now - timedelta(minutes=5)  # active again: it moves into the last hour
    stored["sixty-days"].save()
    stored["three-hours"].delete()

    counted = {window: client_alice.get(reverse("overview"), {"window": window}).context["totals"].conversations
               for window in ("1h", "24h", "7d", "30d", "all")}

    assert counted == {"1h": 2, "24h": 2, "7d": 3, "30d": 4, "all": 4}


def test_overview_fragments_render_the_same_partials_as_the_page(client_alice, demo):
    page = client_alice.get(reverse("overview")).content.decode()
    data = client_alice.get(reverse("overview-fragments")).json()
    assert set(data["fragments"]) == {"overview-totals", "overview-active", "overview-tools",
                                      "overview-compressions", "overview-errors", "overview-models",
                                      "overview-findings"}
    for key, html in data["fragments"].items():
        assert f'id="{key}"' in html
        assert html.strip() in page
    assert len(data["data"]["tokens_chart"]["input"]) == 60


def test_conversations_list_filters_by_search_model_status_and_time(client_alice, demo):
    other = make_conversation("conv-other", title="Quarterly revenue", model="claude-3-5-sonnet", rounds=1,
                              running_last=True)
    url = reverse("conversations")

    def listed(**params) -> list[int]:
        return [c.pk for c in client_alice.get(url, params).context["conversations"]]

    assert listed() == [demo.conversation.pk, other.conversation.pk]
    assert listed(q="quarterly") == [other.conversation.pk]
    assert listed(q="REVENUE") == [demo.conversation.pk, other.conversation.pk]
    assert listed(q="conv-other") == [other.conversation.pk]
    assert listed(model="gpt-4o") == [demo.conversation.pk]
    assert listed(status="running") == [other.conversation.pk]
    assert listed(status="ok", q="weather") == [demo.conversation.pk]
    assert listed(window="1h", model="claude-3-5-sonnet") == [other.conversation.pk]
    assert listed(status="not-a-status") == listed()  # an invalid filter is ignored, not a 500


def test_conversations_list_orders_by_newest_activity(client_alice, demo):
    older = make_conversation("conv-old", title="Old one", rounds=1,
                              started=demo.conversation.started_at - timedelta(days=2))
    rows = list(client_alice.get(reverse("conversations")).context["conversations"])
    assert rows == [demo.conversation, older.conversation]


def test_conversation_page_shows_the_react_timeline_with_context_bars(client_alice, demo):
    make_skill(demo.conversation, demo.rounds[0], demo.rounds[0].started_at)
    response = client_alice.get(reverse("conversation", args=[demo.conversation.pk]))
    html = response.content.decode()
    turns = response.context["turns"]
    assert [t.number for t in turns] == [1, 2, 3]
    kinds = [s.kind for s in turns[0].steps]
    assert kinds == ["skill", "llm", "tool", "tool", "llm"]
    assert "Question 1: what is the weather in Paris?" in html and "Answer 3: sunny" in html
    assert "I should look up the weather (turn 1)." in html  # the thought
    assert html.count('class="ctx-bar"') == len(demo.llm_calls)
    assert 'class="seg cat-tool_observations" style="width: ' in html
    assert "search backend did not answer in 2 s" in html and "2 retries" in html
    assert reverse("artifact", args=[demo.artifact.artifact_id]) in html
    assert "pdf-report" in html
    chart = response.context["context_chart"]
    assert len(chart["labels"]) == len(demo.llm_calls)
    assert chart["compressions"][0]["tokens_before"] == 104_000


def test_a_running_turn_shows_as_running(client_alice):
    demo = make_conversation("conv-running", rounds=2, running_last=True)
    html = client_alice.get(reverse("conversation", args=[demo.conversation.pk])).content.decode()
    last = html[html.index(f'id="round-{demo.rounds[-1].pk}"'):]
    assert 'class="badge status-running">Running…' in last
    assert "step-running" in last


def test_context_bar_segments_add_up_to_the_window(client_alice, demo):
    call = demo.llm_calls[0]
    bar = context_bar(call)
    assert bar.window == 128_000
    assert sum(s.tokens for s in bar.segments) == 128_000
    assert abs(sum(s.percent for s in bar.segments) - 100.0) < 1e-6
    assert [s.category for s in bar.segments] == ["system", "skills", "user", "assistant", "tool_observations",
                                                 "free"]


def test_trace_content_is_escaped_on_every_page(client_alice, demo):
    for url in detail_urls(demo) + [reverse("overview"), reverse("tools")]:
        html = client_alice.get(url).content.decode()
        assert XSS_SCRIPT not in html and XSS_IMG not in html, url
    html = client_alice.get(reverse("conversation", args=[demo.conversation.pk])).content.decode()
    assert "&lt;script&gt;window.__xss = 1;" in html
    assert "&lt;img src=x onerror=" in html


def test_conversation_fragments_render_requested_rounds_of_that_conversation_only(client_alice, demo):
    other = make_conversation("conv-other", rounds=1)
    url = reverse("conversation-fragments", args=[demo.conversation.pk])
    ids = f"{demo.rounds[1].pk},{other.rounds[0].pk}"
    data = client_alice.get(url, {"rounds": ids}).json()
    assert set(data["fragments"]) == {"conversation-header", "conversation-compressions", "conversation-findings",
                                      f"round-{demo.rounds[1].pk}"}
    assert "Turn 2" in data["fragments"][f"round-{demo.rounds[1].pk}"]
    assert data["data"]["context_chart"]["ids"] == [c.pk for c in demo.llm_calls]
    whole = client_alice.get(url, {"timeline": "1"}).json()
    assert 'id="timeline"' in whole["fragments"]["timeline"]
    assert client_alice.get(url, {"rounds": "1,x"}).status_code == 400
    # Ids no row can have name nothing (SQLite cannot even compare them): no 500.
    huge = client_alice.get(url, {"rounds": f"{2**64},-1,0"})
    assert huge.status_code == 200 and set(huge.json()["fragments"]) == {
        "conversation-header", "conversation-compressions", "conversation-findings"}
    assert client_alice.get(reverse("conversation-fragments", args=[999999])).status_code == 404


def test_compression_page_shows_before_and_after_with_fates_and_savings(client_alice, demo):
    response = client_alice.get(reverse("compression", args=[demo.compression.pk]))
    html = response.content.decode()
    fates = [m.fate for m in response.context["before"]]
    assert fates == ["kept", "summarised", "dropped", "summarised", "kept"]
    assert [m.fate for m in response.context["after"]] == ["kept", "summary", "kept"]
    rows = {r.category: r for r in response.context["categories"]}
    assert rows["tool_observations"].saved == 64_000
    assert rows["compressed_summaries"].before == 0 and rows["compressed_summaries"].after == 2000
    assert 'id="compression-before"' in html and 'id="compression-after"' in html
    assert "OLD OBSERVATION that was dropped" in html
    assert "63k" in html  # tokens saved


def test_tools_page_has_histogram_errors_by_type_and_drill_down(client_alice, demo):
    response = client_alice.get(reverse("tools"))
    histogram = response.context["histogram"]
    assert sum(histogram["counts"]) == 6
    # get_weather took 150, 200 and 250 ms, web_search 2.4 s three times.
    assert histogram["labels"][3:5] == ["< 250 ms", "< 500 ms"]
    assert histogram["counts"] == [0, 0, 0, 2, 1, 0, 3, 0, 0, 0]
    errors = response.context["errors_by_type"]
    assert errors == [{"tool_name": "web_search", "error_type": "timeout", "count": 3,
                       "last_seen": errors[0]["last_seen"]}]
    drill = client_alice.get(reverse("tool-calls"), {"tool": "web_search", "status": "error", "window": "all"})
    calls = list(drill.context["page_obj"].object_list)
    assert len(calls) == 3 and all(not c.success for c in calls)
    assert drill.context["stats"].failures == 3
    one_tool = client_alice.get(reverse("tools"), {"tool": "get_weather"}).context["histogram"]
    assert sum(one_tool["counts"]) == 3


def test_tools_window_excludes_old_calls(client_alice, demo):
    make_tool_call(demo.conversation, None, demo.conversation.started_at - timedelta(days=3), "old_tool")

    def names(window: str) -> set[str]:
        return {s.tool_name for s in client_alice.get(reverse("tools"), {"window": window}).context["tool_stats"]}

    assert "old_tool" not in names("24h")
    assert "old_tool" in names("7d")


def test_artifacts_list_and_escaped_preview_without_a_path(client_alice, demo, artifact_dir):
    html = client_alice.get(reverse("artifacts")).content.decode()
    assert demo.artifact.artifact_id in html and "62.5\xa0KB" in html and "14k" in html
    detail = client_alice.get(reverse("artifact", args=[demo.artifact.artifact_id])).content.decode()
    assert "line of a very long tool output" in detail
    assert reverse("api:artifact-content", args=[demo.artifact.artifact_id]) in detail
    assert str(artifact_dir) not in detail and str(artifact_dir) not in html


def test_artifact_page_refuses_bad_and_unknown_ids(client_alice, demo):
    for bad in ["..%2F..%2Fetc%2Fpasswd", "artifact_XYZ", "artifact_" + "0" * 32]:
        response = client_alice.get(f"/artifacts/{bad}/")
        assert response.status_code == 404, bad


def test_artifact_with_an_html_payload_previews_as_text(client_alice, artifact_dir):
    demo = make_conversation(artifact_dir=artifact_dir, rounds=1)
    (artifact_dir / demo.artifact.artifact_id).write_text(XSS_SCRIPT)
    html = client_alice.get(reverse("artifact", args=[demo.artifact.artifact_id])).content.decode()
    assert XSS_SCRIPT not in html and "&lt;script&gt;window.__xss" in html


def test_a_long_conversation_shows_its_latest_turns_numbered_in_the_conversation(client_alice, demo, monkeypatch):
    monkeypatch.setattr("dashboard.timeline.MAX_TURNS_PER_PAGE", 2)
    url = reverse("conversation", args=[demo.conversation.pk])
    response = client_alice.get(url)
    html = response.content.decode()
    assert [t.number for t in response.context["turns"]] == [2, 3]
    assert "Showing turns 2–3 of 3." in html and 'href="?page=2"' in html
    older = client_alice.get(url, {"page": "2"})
    assert [t.number for t in older.context["turns"]] == [1]
    assert 'href="?page=1"' in older.content.decode()
    fragments = reverse("conversation-fragments", args=[demo.conversation.pk])
    fragment = client_alice.get(fragments, {"timeline": "1", "page": "2"}).json()["fragments"]["timeline"]
    assert fragment.count('<article id="round-') == 1 and "Showing turns 1–1 of 3." in fragment
    # A live refresh of the older page leaves out the turns it does not show.
    rounds = ",".join(str(r.pk) for r in demo.rounds)
    parts = client_alice.get(fragments, {"rounds": rounds, "page": "2"}).json()["fragments"]
    assert [key for key in parts if key.startswith("round-")] == [f"round-{demo.rounds[0].pk}"]


def test_a_page_of_older_turns_charts_the_calls_of_those_turns(client_alice, demo, monkeypatch):
    monkeypatch.setattr("dashboard.timeline.MAX_TURNS_PER_PAGE", 2)
    url = reverse("conversation", args=[demo.conversation.pk])
    in_round = {r.pk: [c.pk for c in demo.llm_calls if c.round_id == r.pk] for r in demo.rounds}
    latest, older = client_alice.get(url), client_alice.get(url, {"page": "2"})
    assert latest.context["context_chart"]["ids"] == in_round[demo.rounds[1].pk] + in_round[demo.rounds[2].pk]
    assert older.context["context_chart"]["ids"] == in_round[demo.rounds[0].pk]


def test_a_page_of_turns_without_llm_calls_charts_no_compression_of_other_turns(client_alice, demo, monkeypatch):
    monkeypatch.setattr("dashboard.timeline.MAX_TURNS_PER_PAGE", 1)  # page 2: the second turn
    first, second = demo.rounds[0], demo.rounds[1]
    type(demo.compression).objects.filter(pk=demo.compression.pk).update(
        round=first, occurred_at=first.started_at + timedelta(seconds=4))
    type(demo.llm_calls[0]).objects.filter(round=second).delete()
    url = reverse("conversation", args=[demo.conversation.pk])
    assert client_alice.get(url, {"page": "2"}).context["context_chart"]["compressions"] == []
    [marker] = client_alice.get(url, {"page": "3"}).context["context_chart"]["compressions"]
    assert marker["url"] == reverse("compression", args=[demo.compression.pk])


def test_llm_call_page_shows_what_the_model_saw(client_alice, demo):
    call = demo.llm_calls[0]
    call.input_messages = [{"role": "system", "parts": [{"type": "text", "content": "Be terse."}]},
                           {"role": "user", "parts": [{"type": "text", "content": XSS_SCRIPT}]}]
    call.save()
    response = client_alice.get(reverse("llm-call", args=[call.pk]))
    html = response.content.decode()
    assert [m.role for m in response.context["input_messages"]] == ["system", "user"]
    assert "Be terse." in html and XSS_SCRIPT not in html and "&lt;script&gt;" in html
    assert response.context["bar"].window == 128_000
    assert "get_weather" in html  # the tool call it asked for


def test_the_download_link_serves_the_artifact_to_a_logged_in_browser(client_alice, demo):
    html = client_alice.get(reverse("artifact", args=[demo.artifact.artifact_id])).content.decode()
    url = reverse("api:artifact-content", args=[demo.artifact.artifact_id])
    assert f'href="{url}"' in html
    response = client_alice.get(url)
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="{demo.artifact.artifact_id}"'
    assert b"".join(response.streaming_content).startswith(b"line of a very long tool output")


def test_live_round_fragments_number_turns_as_the_page_does(client_alice, demo):
    # Two turns that started in the same microsecond: the page numbers them by (start, id).
    Round = type(demo.rounds[0])
    Round.objects.filter(pk=demo.rounds[2].pk).update(started_at=demo.rounds[1].started_at)
    page = client_alice.get(reverse("conversation", args=[demo.conversation.pk])).context["turns"]
    on_page = {t.round.pk: t.number for t in page}
    ids = ",".join(str(r.pk) for r in reversed(demo.rounds))
    fragments = client_alice.get(reverse("conversation-fragments", args=[demo.conversation.pk]),
                                 {"rounds": ids}).json()["fragments"]
    for round_id, number in on_page.items():
        assert f"<h3>Turn {number}</h3>" in fragments[f"round-{round_id}"]
    assert sorted(on_page.values()) == [1, 2, 3]


def test_links_to_a_step_of_an_older_turn_open_the_page_of_turns_that_shows_it(client_alice, demo, monkeypatch):
    monkeypatch.setattr("dashboard.timeline.MAX_TURNS_PER_PAGE", 2)  # 3 turns: the first is on page 2
    first = demo.rounds[0]
    type(demo.compression).objects.filter(pk=demo.compression.pk).update(round=first)
    weather, failing = demo.tool_calls[0], demo.tool_calls[1]
    type(weather).objects.filter(pk=weather.pk).update(llm_call=demo.llm_calls[0])
    links = [
        (reverse("overview"), f"tool-{failing.pk}"),
        (reverse("tool-calls") + "?window=all", f"tool-{failing.pk}"),
        (reverse("llm-call", args=[demo.llm_calls[0].pk]), f"round-{first.pk}"),
        (reverse("llm-call", args=[demo.llm_calls[0].pk]), f"tool-{weather.pk}"),
        (reverse("compression", args=[demo.compression.pk]), f"round-{first.pk}"),
        (reverse("artifact", args=[demo.artifact.artifact_id]), f"tool-{weather.pk}"),
    ]
    for page, anchor in links:
        href = re.search(rf'href="([^"#]*)#{anchor}"', client_alice.get(page).content.decode())
        assert href, (page, anchor)
        landed = client_alice.get(href.group(1), follow=True)
        assert landed.context["page_obj"].number == 2, (page, anchor)
        assert f'id="{anchor}"' in landed.content.decode(), (page, anchor)


def test_a_round_that_is_not_the_conversations_shows_its_latest_page(client_alice, demo):
    other = make_conversation("conv-other", rounds=1)
    url = reverse("conversation", args=[demo.conversation.pk])
    for raw in (str(other.rounds[0].pk), "x", str(2**64), "-1"):
        response = client_alice.get(url, {"round": raw})
        assert response.status_code == 302 and response["Location"] == url, raw


def test_pages_show_token_counts_by_category_stored_past_what_a_count_holds(client_alice, demo):
    """Rows stored before ingest kept these counts within 0..MAX_COUNT: a 400-digit integer (any
    JSON number) made the bar and the compression table divide by it as a float, a 500 for good."""
    huge = 10**400
    call = demo.llm_calls[0]
    LLMCall.objects.filter(pk=call.pk).update(context_composition={"user": huge, "system": 10})
    CompressionEvent.objects.filter(pk=demo.compression.pk).update(tokens_before_by_category={"user": huge})
    conversation = demo.conversation.pk
    for url in [*detail_urls(demo)[:3], reverse("conversation-fragments", args=[conversation]) + "?timeline=1"]:
        assert client_alice.get(url).status_code == 200, url
    bar = context_bar(LLMCall.objects.get(pk=call.pk))
    assert {s.category: s.tokens for s in bar.segments}["user"] == MAX_COUNT
