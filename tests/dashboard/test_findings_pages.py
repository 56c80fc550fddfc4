"""Findings on the pages: the conversation's panel (computed fresh, each finding linked to its
call), the list's count and filter, and the overview's most frequent codes in its window (both
from the stored counts)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from pipeline import models
from pipeline.insight import finding_counts
from tests.insight.agent_events import (
    Conversation,
    assistant,
    calls,
    ingest_client,
    result,
    system,
    tool,
    user,
)

pytestmark = pytest.mark.django_db
XSS_TOOL = '<img src=x onerror="window.__xss=1">'


@pytest.fixture
def client_alice(client, alice):
    client.force_login(alice)
    return client


@pytest.fixture
def api():
    return ingest_client()


def troubled(name: str, *, start=None, tool_name: str = "fetch_page") -> Conversation:
    """An orphan tool result (error) and an oversized observation (warning)."""
    asked = assistant(None, ("call_1", tool_name, {"url": "https://example.com"}))
    question = user("Read the page.")
    conversation = Conversation(name, start=start or timezone.now() - timedelta(minutes=5))
    return (conversation.turn("r1", "Read the page.")
            .llm([system(), question, result("call_9", "left behind")], asked, window=10_000)
            .tool("call_1", tool_name, {"url": "https://example.com"}, "<html>…</html>", tokens=3000)
            .llm([system(), question, result("call_9", "left behind"), asked, result("call_1", "<html>…</html>")],
                 assistant("Done."), window=10_000, input_tokens=3400))


def clean(name: str, *, start=None) -> Conversation:
    asked = assistant(None, ("call_1", "search", {"q": "oslo"}))
    return (Conversation(name, start=start or timezone.now() - timedelta(minutes=5)).turn("r1", "Oslo?")
            .llm([system(), user("Oslo?")], asked)
            .tool("call_1", "search", {"q": "oslo"}, "Cloudy")
            .llm([system(), user("Oslo?"), asked, result("call_1", "Cloudy")], assistant("Cloudy.")))


def test_the_conversation_page_lists_its_findings_linked_to_their_calls(client_alice, api):
    conversation_id = troubled("troubled").send(api)
    first = calls(conversation_id)[0]

    html = client_alice.get(reverse("conversation", args=[conversation_id])).content.decode()

    panel = html[html.index('id="conversation-findings"'):]
    panel = panel[:panel.index("</section>")]
    assert "1 error · 1 warning" in panel
    assert panel.index('data-code="orphan_tool_result"') < panel.index('data-code="oversized_observation"')
    assert f'href="{reverse("llm-call", args=[first.pk])}">LLM call →' in panel
    assert f'href="#tool-{tool(conversation_id, "call_1").pk}">tool call →' in panel
    assert "The observation of fetch_page is 3,000 tokens: 30% of the 10,000-token context window" in panel
    assert f'id="tool-{tool(conversation_id, "call_1").pk}"' in html  # the link's target is on the page


def test_the_panel_is_a_live_fragment_and_says_when_there_is_nothing(client_alice, api):
    conversation_id = clean("clean").send(api)

    data = client_alice.get(reverse("conversation-fragments", args=[conversation_id])).json()

    panel = data["fragments"]["conversation-findings"]
    assert "No findings" in panel and 'class="finding"' not in panel


def test_trace_content_in_a_finding_is_escaped(client_alice, api):
    conversation_id = troubled("xss", tool_name=XSS_TOOL).send(api)

    html = client_alice.get(reverse("conversation", args=[conversation_id])).content.decode()

    assert XSS_TOOL not in html
    assert "The observation of &lt;img src=x onerror=&quot;window.__xss=1&quot;&gt; is 3,000 tokens" in html


def test_the_list_shows_the_stored_count_and_filters_by_code(client_alice, api):
    troubled_id, clean_id = troubled("troubled").send(api), clean("clean").send(api)
    finding_counts.refresh_stale()

    page = client_alice.get(reverse("conversations"))
    rows = {c.pk: c.finding_count for c in page.context["conversations"]}
    assert rows == {troubled_id: 2, clean_id: 0}
    html = page.content.decode()
    assert 'title="orphan_tool_result: 1, oversized_observation: 1">2</td>' in html

    filtered = client_alice.get(reverse("conversations"), {"finding": "orphan_tool_result"})
    assert [c.pk for c in filtered.context["conversations"]] == [troubled_id]
    assert list(client_alice.get(reverse("conversations"), {"finding": "cache_break"}).context["conversations"]) == []


def test_the_overview_ranks_the_codes_of_the_conversations_active_in_its_window(client_alice, api):
    troubled("recent").send(api)
    troubled("recent-too").send(api)
    old = troubled("old", start=timezone.now() - timedelta(days=3))
    # A new system prompt over the question the first turn asked: a cache break and a changed prompt.
    old.turn("r2", "Again").llm([system("A new prompt."), user("Read the page."), user("Again")], assistant("ok"),
                                window=10_000)
    old.send(api)
    finding_counts.refresh_stale()

    def codes(window: str) -> list[tuple[str, str, int, int]]:
        rows = client_alice.get(reverse("overview"), {"window": window}).context["finding_codes"]
        return [(r.code, r.severity, r.findings, r.conversations) for r in rows]

    assert codes("24h") == [("orphan_tool_result", "error", 2, 2), ("oversized_observation", "warning", 2, 2)]
    assert codes("all") == [("orphan_tool_result", "error", 3, 3), ("oversized_observation", "warning", 3, 3),
                            ("cache_break", "warning", 1, 1), ("system_prompt_changed", "info", 1, 1)]
    fragment = client_alice.get(reverse("overview-fragments"), {"window": "24h"}).json()["fragments"]
    assert f'href="{reverse("conversations")}?finding=orphan_tool_result&amp;window=24h"' in fragment[
        "overview-findings"]


def test_a_page_of_turns_lists_the_findings_about_those_turns_with_the_conversations_totals(
        client_alice, api, monkeypatch):
    monkeypatch.setattr("dashboard.timeline.MAX_TURNS_PER_PAGE", 1)
    monkeypatch.setattr("pipeline.insight.findings.WINDOW_LOOKBACK", 1)  # read one call before the page
    conversation = Conversation("paged", start=timezone.now() - timedelta(minutes=5))
    for n in (1, 2, 3):
        asked = assistant(None, (f"call_{n}", "fetch_page", {"page": n}))
        left_behind = [result("call_9", "left behind")] if n == 3 else []
        conversation.turn(f"r{n}", f"Page {n}?").llm([system(), user(f"Page {n}?"), *left_behind], asked,
                                                     window=10_000)
        conversation.tool(f"call_{n}", "fetch_page", {"page": n}, "<html>…</html>", tokens=3000 if n != 2 else 10)
    conversation_id = conversation.send(api)
    finding_counts.refresh_stale()
    url = reverse("conversation", args=[conversation_id])

    def panel(page: str) -> str:
        html = client_alice.get(url, {"page": page}).content.decode()
        section = html[html.index('id="conversation-findings"'):]
        return section[:section.index("</section>")]

    latest, middle, oldest = panel("1"), panel("2"), panel("3")
    # The totals: the whole conversation's stored counts (each turn leaves its tool call unanswered
    # in the next input, the last carries an orphan result, turns 1 and 3 an oversized observation).
    for shown in (latest, middle, oldest):
        assert "3 errors · 2 warnings in the conversation" in shown
    assert "Listed: the findings about turns 3–3" in latest
    # Numbered in the whole conversation although the page read only calls #2 and #3.
    assert "The input of LLM call #3 has a tool result for call_9" in latest
    assert "LLM call #2 asked for tool call call_2 (fetch_page); the input of the next LLM call, #3" in latest
    assert latest.count('data-code="oversized_observation"') == 1 and latest.count('class="finding"') == 3
    assert middle.count('class="finding"') == 1 and "LLM call #1 asked for tool call call_1" in middle
    assert oldest.count('class="finding"') == 1 and 'data-code="oversized_observation"' in oldest


def test_only_the_page_of_the_latest_full_call_says_the_context_is_near_its_window(client_alice, api, monkeypatch):
    monkeypatch.setattr("dashboard.timeline.MAX_TURNS_PER_PAGE", 1)
    conversation = Conversation("full-pages", start=timezone.now() - timedelta(minutes=5))
    for n in (1, 2, 3):  # every call fills 95 % of its window, and no compression follows any
        conversation.turn(f"r{n}", f"Go on {n}.").llm([system(), user(f"Go on {n}.")], assistant(f"{n}"),
                                                       window=10_000, context_tokens=9500)
    conversation_id = conversation.send(api)
    finding_counts.refresh_stale()
    url = reverse("conversation", args=[conversation_id])
    # The whole conversation has one such finding, about its latest call: so has the page of it only.
    assert models.Conversation.objects.get(pk=conversation_id).finding_counts["near_window_limit"] == 1
    codes = {page: [row.finding.code for row in client_alice.get(url, {"page": page}).context["findings"]]
             for page in ("1", "2", "3")}
    assert codes == {"1": ["near_window_limit"], "2": [], "3": []}
