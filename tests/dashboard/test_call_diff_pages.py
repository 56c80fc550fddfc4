"""The call-to-call diff on the pages: the LLM call page's side-by-side inputs and the one line
per LLM call on the conversation timeline, first load and live fragments alike, on
conversations sent through the REST ingest API (tests/call_diff_cases.py)."""

from __future__ import annotations

import html as html_lib
import re

import pytest
from django.urls import reverse

from tests import call_diff_cases as cases
from tests.call_diff_cases import ASK, SYSTEM, Events, s
from tests.dashboard_fixtures import XSS_SCRIPT

pytestmark = pytest.mark.django_db


@pytest.fixture
def ingest():
    return cases.ingest_api()


@pytest.fixture
def client_alice(client, alice):
    client.force_login(alice)
    return client


def text_of(fragment: str) -> str:
    return " ".join(html_lib.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


def diff_lines(html: str) -> list[str]:
    """The text of every diff line on a page, in page order."""
    return [text_of(m.group(0)) for m in re.finditer(r'<p class="diff-line.*?</p>', html, re.S)]


def fates(side) -> tuple[list[str], list[str]]:
    return [m.fate for m in side.prefix], [m.fate for m in side.rest]


def response_fates(html: str) -> list[str]:
    """The fates marked on this input's side of the page (badges of messages past the prefix)."""
    current = html[html.index('id="diff-current"'):]
    return re.findall(r'<span class="badge fate-(\w+)">', current)


def call_page(client, call):
    response = client.get(reverse("llm-call", args=[call.pk]))
    assert response.status_code == 200
    return response


def test_the_first_call_of_a_conversation_says_so_and_shows_its_input(client_alice, ingest):
    case = cases.append_only(ingest)

    response = call_page(client_alice, case.calls[0])

    html = response.content.decode()
    assert diff_lines(html) == ["First LLM call of the conversation: 2 messages, 120 tokens"]
    assert response.context["sides"] is None and response.context["previous"] is None
    assert "What the model saw" in html and 'id="diff-current"' not in html


def test_an_appended_call_folds_the_kept_prefix_beside_the_providers_cache_read(client_alice, ingest):
    case = cases.append_only(ingest)

    response = call_page(client_alice, case.calls[2])

    html = response.content.decode()
    assert diff_lines(html) == ["+2 messages, +108 tokens; prefix kept 4 messages / 328 tokens · "
                                "provider cache read 300"]
    previous, current = response.context["sides"]
    assert fates(previous) == (["kept"] * 4, [])
    assert fates(current) == (["kept"] * 4, ["added", "added"])
    assert [m.tokens for m in current.prefix + current.rest] == [100, 20, 8, 200, 8, 100]
    assert "<summary>Kept prefix: 4 messages · 328 tokens · provider cache read 300</summary>" in html
    assert f'href="{reverse("llm-call", args=[case.calls[1].pk])}" data-previous-call' in html
    assert "cache-break" not in html
    assert [(r.label, r.text) for r in response.context["by_category"]] == [
        ("Assistant", "+8"), ("Tool observations", "+100")]


def test_an_edit_in_the_middle_marks_the_changed_message_and_the_cache_break(client_alice, ingest):
    case = cases.edit_in_the_middle(ingest)

    response = call_page(client_alice, case.calls[1])

    html = response.content.decode()
    assert diff_lines(html) == ["+1 message, 1 changed, −180 tokens; prefix kept 3 messages / 128 tokens · "
                                "provider cache read 100 cache break · edit 108 tokens no longer cacheable"]
    previous, current = response.context["sides"]
    assert fates(previous) == (["kept"] * 3, ["changed", "kept", "kept"])
    assert fates(current) == (["kept"] * 3, ["changed", "uncached", "uncached", "added"])
    assert [m.tokens for m in previous.rest] == [200, 8, 100]
    assert [m.tokens for m in current.rest] == [10, 8, 100, 10]
    assert 'data-diff-break="edit"' in html


def test_a_compression_is_named_as_the_reason_of_the_break(client_alice, ingest):
    case = cases.compression(ingest)

    response = call_page(client_alice, case.calls[1])

    assert diff_lines(response.content.decode()) == [
        "+1 message, −2 messages, 1 changed, −188 tokens; prefix kept 1 message / 100 tokens "
        "cache break · compression 108 tokens no longer cacheable"]
    previous, current = response.context["sides"]
    assert fates(previous) == (["kept"], ["changed", "removed", "removed", "kept", "kept"])
    assert fates(current) == (["kept"], ["changed", "uncached", "uncached", "added"])


def test_a_changed_system_prompt_keeps_no_prefix(client_alice, ingest):
    case = cases.system_prompt_change(ingest)

    response = call_page(client_alice, case.calls[1])

    html = response.content.decode()
    assert diff_lines(html) == ["+2 messages, 1 changed, +30 tokens; no prefix kept "
                                "cache break · edit 20 tokens no longer cacheable"]
    previous, current = response.context["sides"]
    assert fates(previous) == ([], ["changed", "kept"])
    assert fates(current) == ([], ["changed", "uncached", "added", "added"])
    assert "kept-prefix" not in html


def test_message_text_in_the_diff_is_escaped(client_alice, ingest):
    hostile = {"role": "user", "content": cases.padded(XSS_SCRIPT, 4 * (len(XSS_SCRIPT) // 4 + 1))}
    events = Events("diff-hostile")
    events.turn("r1", s(0), "hi", s(10))
    events.llm("r1", s(1), [SYSTEM, ASK])
    events.llm("r1", s(2), [SYSTEM, hostile, ASK])
    case = events.send(ingest)

    html = call_page(client_alice, case.calls[1]).content.decode()

    assert XSS_SCRIPT not in html
    assert html.count("&lt;script&gt;window.__xss = 1;") == 1  # on this input's side, marked added
    assert response_fates(html) == ["added", "uncached"]  # inserted before the question, which moved


def test_the_timeline_has_one_diff_line_per_llm_call(client_alice, ingest):
    case = cases.append_only(ingest)

    html = client_alice.get(reverse("conversation", args=[case.conversation.pk])).content.decode()

    assert diff_lines(html) == [
        "First LLM call of the conversation: 2 messages, 120 tokens",
        "+2 messages, +208 tokens; prefix kept 2 messages / 120 tokens · provider cache read 100",
        "+2 messages, +108 tokens; prefix kept 4 messages / 328 tokens · provider cache read 300",
    ]


def test_the_timeline_marks_a_cache_break_with_its_reason(client_alice, ingest):
    case = cases.compression(ingest)

    html = client_alice.get(reverse("conversation", args=[case.conversation.pk])).content.decode()

    assert diff_lines(html)[1].endswith("cache break · compression 108 tokens no longer cacheable")
    assert html.count('class="badge cache-break"') == 1


def test_live_fragments_render_the_same_lines_as_the_page(client_alice, ingest):
    case = cases.compression(ingest)
    page = client_alice.get(reverse("conversation", args=[case.conversation.pk])).content.decode()
    url = reverse("conversation-fragments", args=[case.conversation.pk])
    second_round = case.calls[1].round_id

    # A live push of the second turn alone: its call still compares with the first turn's.
    fragments = client_alice.get(url, {"rounds": str(second_round)}).json()["fragments"]
    timeline = client_alice.get(url, {"timeline": "1"}).json()["fragments"]["timeline"]

    assert diff_lines(fragments[f"round-{second_round}"]) == diff_lines(page)[1:]
    assert diff_lines(timeline) == diff_lines(page)
    assert len(diff_lines(page)) == 2
