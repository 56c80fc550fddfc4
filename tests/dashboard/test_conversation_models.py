"""The conversations list's model filter offers each stored model once, in order, without the
conversations that name none (read by one index seek per model, dashboard.queries)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.urls import reverse

from dashboard.queries import conversation_models
from pipeline.models import Conversation

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def stored() -> None:
    for i, model in enumerate(("gpt-4o", "", "claude-sonnet", "gpt-4o", "", "llama-3", "claude-sonnet")):
        Conversation.objects.create(external_id=f"conv-{i}", model=model, started_at=T0, last_activity_at=T0)


def test_each_model_is_offered_once_in_order(stored):
    assert conversation_models() == ["claude-sonnet", "gpt-4o", "llama-3"]


def test_the_list_stops_at_the_limit(stored):
    assert conversation_models(2) == ["claude-sonnet", "gpt-4o"]


def test_no_conversations_no_models():
    assert conversation_models() == []


def test_the_page_offers_them(client, alice, stored):
    client.force_login(alice)
    response = client.get(reverse("conversations"))
    assert response.context["models"] == ["claude-sonnet", "gpt-4o", "llama-3"]
    assert '<option value="llama-3">llama-3</option>' in response.content.decode()
