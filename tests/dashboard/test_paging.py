"""The conversations list and its API count only some pages ahead (dashboard.paging): exact for a
short list, a lower bound marked "+" past that, growing as one pages on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from pipeline.models import Conversation

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def seven(monkeypatch) -> None:
    monkeypatch.setattr("dashboard.views.conversations.PAGE_SIZE", 2)
    monkeypatch.setattr("dashboard.paging.PAGES_AHEAD", 1)
    for i in range(7):
        at = T0 + timedelta(minutes=i)
        Conversation.objects.create(external_id=f"conv-{i}", started_at=at, last_activity_at=at)


def test_the_list_counts_a_page_ahead_and_says_there_are_more(client, alice, seven):
    client.force_login(alice)
    first = client.get(reverse("conversations"))
    assert first.context["page_obj"].paginator.count == 4
    assert "4+ conversations · page 1 of 2+" in first.content.decode()
    assert [c.external_id for c in first.context["conversations"]] == ["conv-6", "conv-5"]
    # Two pages on, the count reaches the end: exact again.
    third = client.get(reverse("conversations"), {"page": "3"})
    assert "7 conversations · page 3 of 4" in third.content.decode()
    assert [c.external_id for c in third.context["conversations"]] == ["conv-2", "conv-1"]
    fragment = client.get(reverse("conversations-fragments"), {"page": "2"}).json()["fragments"]
    assert "6+ conversations · page 2 of 3+" in fragment["conversation-results"]


def test_a_bad_page_number_shows_the_first_page(client, alice, seven):
    client.force_login(alice)
    response = client.get(reverse("conversations"), {"page": "many"})
    assert response.status_code == 200 and response.context["page_obj"].number == 1


def test_the_api_counts_a_page_ahead_and_links_the_next_page(client, alice, seven):
    client.force_login(alice)
    first = client.get("/api/conversations/", {"limit": 2}).json()
    assert first["count"] == 4 and first["next"] and len(first["results"]) == 2
    last = client.get("/api/conversations/", {"limit": 2, "offset": 6}).json()
    assert last["count"] == 7 and last["next"] is None and [c["external_id"] for c in last["results"]] == ["conv-0"]


def test_a_page_number_past_any_database_integer_shows_the_last_page(client, alice, seven):
    client.force_login(alice)
    response = client.get(reverse("conversations"), {"page": "100000000000000000000"})
    assert response.status_code == 200
    assert [c.external_id for c in response.context["conversations"]] == ["conv-0"]
    assert "7 conversations · page 4 of 4" in response.content.decode()


def test_an_api_offset_past_any_database_integer_returns_an_empty_page(client, alice, seven):
    client.force_login(alice)
    response = client.get("/api/conversations/", {"limit": 2, "offset": "10000000000000000000"})
    assert response.status_code == 200
    body = response.json()
    assert body["results"] == [] and body["next"] is None and body["previous"]
