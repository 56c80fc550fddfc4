"""Trace content is text on every page and in every live fragment: each field a span can set
carries markup of its own (tests/dashboard_fixtures.py `make_hostile_conversation`), and no
page may contain that markup unescaped, while every field still shows up somewhere, escaped."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse
from django.utils.html import escape

from tests.dashboard_fixtures import hostile, make_hostile_conversation

pytestmark = pytest.mark.django_db

TAGS = [
    "conv-id", "conv-title", "conv-model", "agent", "user-id", "service", "user-message", "final-answer",
    "llm-model", "provider", "finish", "llm-error-type", "llm-error", "role", "input-message", "thought",
    "requested-tool", "observation", "tool-name", "tool-call-id", "argument-key", "argument", "lvl",
    "tool-error-type", "code", "tool-error", "summary", "before-role", "before-message", "after-message",
    "category", "skill", "chain", "skill-error", "mime", "artifact-summary", "artifact-content",
]
# What a leak would look like whichever field it came from: an element the payload opened.
RAW_MARKUP = re.compile(r"<(img src=x|i id=)", re.I)


@pytest.fixture
def pages(client, alice, artifact_dir) -> dict[str, str]:
    """Every page and fragment that shows the hostile conversation, as HTML, by URL."""
    demo = make_hostile_conversation(artifact_dir)
    client.force_login(alice)
    tool = demo.tool_calls[1].tool_name
    urls = [
        reverse("overview"), reverse("overview") + "?window=all", reverse("conversations"),
        reverse("conversations") + "?model=" + demo.conversation.model,
        reverse("conversation", args=[demo.conversation.pk]), reverse("llm-call", args=[demo.llm_calls[0].pk]),
        reverse("compressions"), reverse("compression", args=[demo.compression.pk]),
        reverse("tools") + "?window=all", reverse("tools") + "?window=all&tool=" + tool,
        reverse("tool-calls") + "?window=all", reverse("tool-calls") + "?window=all&status=error&tool=" + tool,
        reverse("artifacts"), reverse("artifact", args=[demo.artifact.artifact_id]),
    ]
    html = {}
    for url in urls:
        response = client.get(url)
        assert response.status_code == 200, url
        html[url] = response.content.decode()
    fragment_urls = [
        reverse("overview-fragments") + "?window=all", reverse("conversations-fragments"),
        reverse("tools-fragments") + "?window=all&tool=" + tool, reverse("artifacts-fragments"),
        reverse("conversation-fragments", args=[demo.conversation.pk]) + "?timeline=1",
        reverse("conversation-fragments", args=[demo.conversation.pk]) + f"?rounds={demo.rounds[0].pk}",
    ]
    for url in fragment_urls:
        response = client.get(url)
        assert response.status_code == 200, url
        for key, fragment in response.json()["fragments"].items():
            html[f"{url}#{key}"] = fragment
    return html


def test_no_page_or_fragment_contains_the_markup_of_any_field(pages):
    for url, html in pages.items():
        for tag in TAGS:
            assert hostile(tag) not in html, f"{tag} unescaped on {url}"
        assert not RAW_MARKUP.search(html), url


def as_text(tag: str) -> tuple[str, str]:
    """How a field's markup reads on a page: escaped, or escaped inside JSON (tool arguments)."""
    return escape(hostile(tag)), escape(json.dumps(hostile(tag), ensure_ascii=False))


def test_every_field_is_shown_somewhere_as_text(pages):
    shown = {tag for tag in TAGS if any(text in html for html in pages.values() for text in as_text(tag))}
    assert sorted(set(TAGS) - shown) == []


def test_the_charts_data_is_json_that_cannot_close_its_script_element(pages):
    for url, html in pages.items():
        for data in re.findall(r'<script id="[\w-]+-data" type="application/json">(.*?)</script>', html, re.S):
            assert "<" not in data, url
