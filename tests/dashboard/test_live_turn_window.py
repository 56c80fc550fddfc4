"""A conversation page's live fragments describe the window of turns the page holds, as new turns
come: the latest page follows the newest turns, an older page keeps the turns it lists (pages are
counted from the newest turn, so its number names newer turns with each one), and the chart, the
findings and the timeline describe those same turns."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.dashboard_fixtures import Demo, make_conversation

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_a_page(monkeypatch) -> None:
    monkeypatch.setattr("dashboard.timeline.MAX_TURNS_PER_PAGE", 2)


@pytest.fixture
def client_alice(client, alice):
    client.force_login(alice)
    return client


def ids(rounds) -> str:
    return ",".join(str(r.pk) for r in rounds)


def calls_of(demo: Demo, rounds) -> list[int]:
    wanted = {r.pk for r in rounds}
    return [c.pk for c in demo.llm_calls if c.round_id in wanted]


def fragments(client, demo: Demo, **params: str) -> dict:
    response = client.get(reverse("conversation-fragments", args=[demo.conversation.pk]), params)
    assert response.status_code == 200
    return response.json()


def test_an_older_page_keeps_the_turns_it_lists_when_its_number_names_newer_ones(client_alice, two_a_page):
    # Five turns, two a page: page 2 is turns 2–3 now; opened at four turns, it lists turns 1–2.
    demo = make_conversation("conv-held", rounds=5)
    r = demo.rounds
    json = fragments(client_alice, demo, page="2", shown=ids(r[:2]), rounds=ids(r))
    window = json["data"]["turn_window"]
    assert window == {"rounds": [r[0].pk, r[1].pk], "first": 1, "last": 2, "total": 5, "pages": 3, "moved": True}
    assert json["data"]["context_chart"]["ids"] == calls_of(demo, r[:2])
    # Only its own turns, numbered as before: none of the turns a newer page shows.
    assert sorted(k for k in json["fragments"] if k.startswith("round-")) == sorted(f"round-{x.pk}" for x in r[:2])
    assert "<h3>Turn 1</h3>" in json["fragments"][f"round-{r[0].pk}"]
    # The whole timeline (after a reconnect) is the same turns, and says the pages moved on.
    timeline = fragments(client_alice, demo, page="2", shown=ids(r[:2]), timeline="1")["fragments"]["timeline"]
    assert [f'id="round-{x.pk}"' in timeline for x in r] == [True, True, False, False, False]
    assert "Showing turns 1–2 of 5." in timeline and 'id="timeline-moved" role="status">' in timeline


def test_an_older_page_whose_turns_are_still_its_numbers_has_not_moved(client_alice, two_a_page):
    demo = make_conversation("conv-held-still", rounds=5)
    r = demo.rounds
    json = fragments(client_alice, demo, page="2", shown=ids(r[1:3]))
    assert json["data"]["turn_window"]["rounds"] == [r[1].pk, r[2].pk]
    assert json["data"]["turn_window"]["moved"] is False
    page = client_alice.get(reverse("conversation", args=[demo.conversation.pk]), {"page": "2"})
    assert json["data"]["context_chart"] == page.context["context_chart"]
    assert 'id="timeline-moved" role="status" hidden>' in page.content.decode()


def test_the_latest_page_follows_the_newest_turns_as_a_reload_shows_them(client_alice, two_a_page):
    # Opened at four turns, the latest page lists turns 3–4; the fifth came.
    demo = make_conversation("conv-latest", rounds=5)
    r = demo.rounds
    json = fragments(client_alice, demo, shown=ids(r[2:4]))
    assert json["data"]["turn_window"]["rounds"] == [r[3].pk, r[4].pk]  # turn 3 leaves the page
    assert json["data"]["turn_window"]["moved"] is False
    # The new turn is sent though the page did not ask for it; the turn it keeps is not.
    assert [k for k in json["fragments"] if k.startswith("round-")] == [f"round-{r[4].pk}"]
    page = client_alice.get(reverse("conversation", args=[demo.conversation.pk]))
    assert [t.round.pk for t in page.context["turns"]] == json["data"]["turn_window"]["rounds"]
    assert json["data"]["context_chart"] == page.context["context_chart"]
    assert json["data"]["context_chart"]["ids"] == calls_of(demo, r[3:])


def test_a_page_whose_turns_are_gone_gets_the_turns_its_number_names(client_alice, two_a_page):
    demo = make_conversation("conv-held-gone", rounds=5)
    r = demo.rounds
    json = fragments(client_alice, demo, page="2", shown=f"{r[0].pk},999999")
    assert json["data"]["turn_window"]["rounds"] == [r[1].pk, r[2].pk]
    assert sorted(k for k in json["fragments"] if k.startswith("round-")) == sorted(f"round-{x.pk}" for x in r[1:3])


def test_shown_must_be_a_list_of_ids(client_alice):
    demo = make_conversation("conv-held-bad", rounds=1)
    url = reverse("conversation-fragments", args=[demo.conversation.pk])
    assert client_alice.get(url, {"shown": "1,x"}).status_code == 400


def test_a_held_older_page_costs_the_same_queries_however_long_the_conversation(client_alice, two_a_page):
    def count(rounds: int) -> int:
        demo = make_conversation(f"conv-held-{rounds}", rounds=rounds)
        r = demo.rounds
        # Page 2 as it was one turn ago: it moved, so the window is the held one.
        shown = ids(r[-5:-3])
        with CaptureQueriesContext(connection) as captured:
            json = fragments(client_alice, demo, page="2", shown=shown, rounds=ids(r[-3:]))
        assert json["data"]["turn_window"]["moved"] is True
        return len(captured.captured_queries)

    count(6)  # the session and content types are cached after the first request
    # Both long enough that the findings read their lookback before the window (one more query).
    assert count(80) == count(40)
