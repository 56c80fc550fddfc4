"""Every dashboard page, live fragment and read API endpoint runs a fixed number of queries:
as many for a store with one short conversation as for one with many long ones (no N+1)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.dashboard_fixtures import Demo, make_conversation, make_skill

pytestmark = pytest.mark.django_db

Url = Callable[[Demo], str]


def rounds_of(demo: Demo) -> str:
    return ",".join(str(r.pk) for r in demo.rounds)


URLS: dict[str, Url] = {
    "overview": lambda d: reverse("overview"),
    "overview all time": lambda d: reverse("overview") + "?window=all",
    "conversations": lambda d: reverse("conversations"),
    "conversations filtered": lambda d: reverse("conversations") + "?q=weather&status=ok&window=24h",
    "conversation": lambda d: reverse("conversation", args=[d.conversation.pk]),
    "conversation older turns": lambda d: reverse("conversation", args=[d.conversation.pk]) + "?page=2",
    "llm call": lambda d: reverse("llm-call", args=[d.llm_calls[-1].pk]),
    "compressions": lambda d: reverse("compressions"),
    "compression": lambda d: reverse("compression", args=[d.compression.pk]),
    "tools": lambda d: reverse("tools") + "?window=all",
    "tool calls": lambda d: reverse("tool-calls") + "?window=all",
    "one tool's failures": lambda d: reverse("tool-calls") + "?tool=web_search&status=error&window=all",
    "artifacts": lambda d: reverse("artifacts"),
    "artifact": lambda d: reverse("artifact", args=[d.artifact.artifact_id]),
    "overview fragments": lambda d: reverse("overview-fragments"),
    "conversations fragments": lambda d: reverse("conversations-fragments"),
    "tools fragments": lambda d: reverse("tools-fragments"),
    "artifacts fragments": lambda d: reverse("artifacts-fragments"),
    "conversation fragments": lambda d: reverse("conversation-fragments", args=[d.conversation.pk]),
    "conversation round fragments": (
        lambda d: reverse("conversation-fragments", args=[d.conversation.pk]) + f"?rounds={rounds_of(d)}"),
    "conversation timeline fragment": (
        lambda d: reverse("conversation-fragments", args=[d.conversation.pk]) + "?timeline=1&page=2"),
    "api conversations": lambda d: "/api/conversations/?search=weather",
    "api conversation": lambda d: f"/api/conversations/{d.conversation.pk}/",
    "api llm call": lambda d: f"/api/llm-calls/{d.llm_calls[-1].pk}/",
    "api compressions": lambda d: "/api/compressions/",
    "api compression": lambda d: f"/api/compressions/{d.compression.pk}/",
    "api artifacts": lambda d: "/api/artifacts/",
    "api tool stats": lambda d: "/api/tools/stats/",
    "api model stats": lambda d: "/api/models/stats/",
    "api conversation findings": lambda d: f"/api/conversations/{d.conversation.pk}/findings/",
    "api round spans": lambda d: f"/api/rounds/{d.rounds[-1].pk}/spans/",
}


def queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, url
    return len(captured.captured_queries)


def grow(demo: Demo, index: int) -> Demo:
    """Another conversation, longer than the first, with skills in its turns."""
    started = demo.conversation.started_at - timedelta(hours=index)
    more = make_conversation(f"conv-more-{index}", rounds=6, started=started)
    for round_ in more.rounds:
        make_skill(more.conversation, round_, round_.started_at)
    return more


@pytest.mark.parametrize("name", URLS)
def test_the_query_count_does_not_grow_with_the_store(client, alice, artifact_dir, django_assert_max_num_queries,
                                                        name):
    client.force_login(alice)
    url = URLS[name]
    small = make_conversation("conv-small", rounds=1, artifact_dir=artifact_dir)
    make_skill(small.conversation, small.rounds[0], small.rounds[0].started_at)
    client.get(url(small))  # the session and content types are cached after the first request
    baseline = queries(client, url(small))

    larger = [grow(small, i) for i in range(1, 4)]
    big = larger[0]
    big.artifact = small.artifact
    with django_assert_max_num_queries(baseline):
        response = client.get(url(big))
    assert response.status_code == 200
    # The page showed the bigger conversation, not an empty one.
    if "round fragments" in name:
        assert len([key for key in response.json()["fragments"] if key.startswith("round-")]) == 6


# Pages that list or chart records, and the columns they must not read: each can hold a whole
# context window (megabytes a row with a real agent), shown only on the page of that one record.
HEAVY_COLUMNS = ('"input_messages"', '"before_messages"', '"after_messages"', '"observation"')
LISTS = ["overview", "overview all time", "conversation", "conversation older turns", "compressions", "tool calls",
         "one tool's failures", "overview fragments", "conversation fragments", "conversation round fragments",
         "conversation timeline fragment"]


@pytest.mark.parametrize("name", LISTS)
def test_lists_and_timelines_do_not_read_whole_context_windows(client, alice, name):
    client.force_login(alice)
    demo = make_conversation("conv-heavy", rounds=2)
    with CaptureQueriesContext(connection) as captured:
        assert client.get(URLS[name](demo)).status_code == 200
    for query in captured.captured_queries:
        select = query["sql"].split(" FROM ")[0]
        # The conversation timeline shows observations (clipped): those may be read there.
        allowed = ('"observation"',) if "conversation" in name else ()
        assert not [c for c in HEAVY_COLUMNS if c in select and c not in allowed], query["sql"][:200]
