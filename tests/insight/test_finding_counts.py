"""Finding counts stored per conversation (pipeline.insight.finding_counts): marked stale by the
ingest and by deferred token counting, refreshed from fresh findings, never losing a change that
arrives during a refresh, and announced live when they change."""

from __future__ import annotations

import pytest

from pipeline.ingest.write import deferred
from pipeline.ingest.write.precount import recent_calls
from pipeline.insight import finding_counts
from pipeline.models import Conversation as ConversationRow
from pipeline.signals import ingest_committed
from tests.insight.agent_events import Conversation, assistant, ingest_client, read_client, result, system, user

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    return ingest_client()


def orphans(name: str, *ids: str) -> Conversation:
    """One LLM call whose input carries a tool result for each of `ids` that nothing asked for."""
    return Conversation(name).turn("r1", "Hi").llm(
        [system(), user("Hi"), *(result(i, "left behind") for i in ids)], assistant("Hello!"))


def stored(conversation_id: int) -> tuple[dict, int, bool]:
    row = ConversationRow.objects.get(pk=conversation_id)
    return row.finding_counts, row.finding_count, row.findings_stale > 0


def test_ingest_marks_the_conversation_stale_and_a_refresh_stores_its_counts(api):
    conversation_id = orphans("two-orphans", "call_1", "call_2").llm(
        [system("Another prompt."), user("Hi")], assistant("Hello again!")).send(api)
    assert stored(conversation_id) == ({}, 0, True)

    finding_counts.refresh_stale()

    counts = {"orphan_tool_result": 2, "cache_break": 1, "system_prompt_changed": 1}
    assert stored(conversation_id) == (counts, 4, False)
    listed = read_client().get("/api/conversations/").json()["results"]
    assert [(c["id"], c["finding_count"], c["finding_counts"]) for c in listed] == [(conversation_id, 4, counts)]
    detail = read_client().get(f"/api/conversations/{conversation_id}/").json()
    assert (detail["finding_count"], detail["finding_counts"]) == (4, counts)


def test_a_change_during_a_refresh_leaves_the_conversation_stale_for_the_next_one(api):
    conversation_id = orphans("racing", "call_1").send(api)
    counted = finding_counts.count_some()  # the refresh has computed the counts ...
    orphans("racing", "call_1").turn("r2", "Again").llm(  # ... when another ingest changes the conversation
        [system(), user("Hi"), result("call_1", "left behind"), result("call_7", "also left behind")],
        assistant("Hello!")).send(api)

    finding_counts.write_counts(counted)
    assert stored(conversation_id) == ({}, 0, True)  # counts of an older mark are not stored; still stale

    # A refresh that read the mark, then another worker's refresh, then a new change: the first
    # refresh's counts (read before the change) must not clear the new change's mark.
    slow = finding_counts.count_some()
    finding_counts.refresh_stale()
    orphans("racing", "call_1").turn("r3", "Once more").llm(
        [system(), user("Hi"), result("call_1", "left behind"), result("call_8", "gone")],
        assistant("Hello!")).send(api)
    finding_counts.write_counts(slow)
    assert stored(conversation_id)[2] is True

    finding_counts.refresh_stale()
    assert stored(conversation_id) == ({"orphan_tool_result": 3}, 3, False)


def test_counting_an_observation_after_the_response_refreshes_the_counts(api):
    observation = "row 17: revenue 4,210 EUR, region north; " * 60  # some 700 tokens, counted after ingest
    asked = assistant(None, ("call_1", "query_sales", {"quarter": "Q3"}))
    asking = Conversation("counted-later").turn("r1", "Sales?").llm([system(), user("Sales?")], asked, window=2000,
                                                                    input_tokens=300)
    conversation_id = asking.send(api)
    # The tool in a request of its own, to a process that did not see its requesting call (another
    # worker's): its tokens are counted after the response (with the call in the same batch, or
    # seen by this process, they are counted before it: pipeline.ingest.write.precount).
    recent_calls.clear()
    answering = Conversation("counted-later")
    answering.clock = asking.clock
    answering.tool("call_1", "query_sales", {"quarter": "Q3"}, observation, tokens=None).send(api)
    finding_counts.refresh_stale()
    assert stored(conversation_id) == ({}, 0, False)  # its tokens are not counted yet

    deferred.complete_pending()

    assert stored(conversation_id)[2] is True
    finding_counts.refresh_stale()
    assert stored(conversation_id) == ({"oversized_observation": 1}, 1, False)


def test_changed_counts_are_announced_after_commit_and_unchanged_ones_are_not(api, django_capture_on_commit_callbacks):
    conversation_id = orphans("announced", "call_1").send(api)
    received = []

    def receiver(sender, changes, **kwargs):
        received.append((sender, changes["conversation_ids"]))

    ingest_committed.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            finding_counts.refresh_stale()
        assert received == [(finding_counts.write_counts, [conversation_id])]

        finding_counts.mark_stale([conversation_id])
        with django_capture_on_commit_callbacks(execute=True):
            finding_counts.refresh_stale()
        assert received == [(finding_counts.write_counts, [conversation_id])]  # same counts: nothing new
        assert stored(conversation_id) == ({"orphan_tool_result": 1}, 1, False)
    finally:
        ingest_committed.disconnect(receiver)
