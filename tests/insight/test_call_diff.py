"""Each LLM call against the previous call of its stream, on conversations sent through the REST
ingest API: which call is previous, which compression explains a break, one call or many."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from pipeline.insight.calls import DIGEST_FIELDS, call_diff, call_diffs, previous_call_id
from pipeline.insight.conversation_rows import read_compressions
from pipeline.models import LLMCall
from tests import call_diff_cases as cases
from tests.call_diff_cases import ASK, CALL_OSLO, RESULT_OSLO, SYSTEM, SYSTEM_V2, Events, s

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    return cases.ingest_api()


def explained(previous: LLMCall, call: LLMCall) -> bool:
    """Whether a compression of the conversation explains what changed from `previous` to `call`."""
    return read_compressions(call.conversation_id).explain(previous, call)


def digests_of(calls: list[LLMCall]) -> list[LLMCall]:
    """The calls again, loaded as a timeline loads them: digests and token columns only."""
    by_id = LLMCall.objects.only(*DIGEST_FIELDS, "cache_read_tokens").in_bulk([c.pk for c in calls])
    return [by_id[c.pk] for c in calls]


def test_the_previous_call_is_the_one_before_by_start_then_id(api):
    events = Events("same-start")
    events.turn("r1", s(0), "hi", s(10))
    events.llm("r1", s(1), [SYSTEM, ASK])
    events.llm("r1", s(2), [SYSTEM, ASK, CALL_OSLO])
    events.llm("r1", s(2), [SYSTEM, ASK, CALL_OSLO, RESULT_OSLO])  # the same start, stored after
    first, second, third = events.send(api).calls
    assert second.pk < third.pk

    assert previous_call_id(first) is None
    assert previous_call_id(second) == first.pk
    assert previous_call_id(third) == second.pk
    assert call_diff(third)["previous_call_id"] == second.pk
    assert call_diff(third)["added"] == [{"index": 3, "role": "tool", "category": "tool_observations", "tokens": 200}]


def test_calls_of_other_conversations_are_never_previous(api):
    cases.append_only(api, "other")
    case = cases.system_prompt_change(api)

    assert previous_call_id(case.calls[0]) is None
    assert call_diff(case.calls[0])["previous_call_id"] is None


def test_a_compression_linked_to_the_call_explains_its_break(api):
    case = cases.compression(api)
    (event,) = case.compressions
    assert event.llm_call_id == case.calls[1].pk  # ingest linked it to the next call of its turn

    assert explained(case.calls[0], case.calls[1]) is True
    assert call_diff(case.calls[1])["cache_break_reason"] == "compression"


def test_a_compression_at_the_end_of_the_previous_turn_explains_the_break_too(api):
    before, after = [SYSTEM, ASK, CALL_OSLO, RESULT_OSLO], [SYSTEM, cases.SUMMARY]
    events = Events("compressed-after-turn")
    events.turn("r1", s(0), "hi", s(5))
    events.llm("r1", s(1), before)
    events.compression("r1", s(4), before, after)  # no later call in its turn: linked to none
    events.turn("r2", s(10), "again", s(20))
    events.llm("r2", s(12), [*after, cases.FOLLOW_UP])
    case = events.send(api)
    assert case.compressions[0].llm_call_id is None

    assert explained(*case.calls) is True
    diff = call_diff(case.calls[1])
    assert (diff["cache_break"], diff["cache_break_reason"], diff["kept_prefix_messages"]) == (True, "compression", 1)


def test_a_compression_before_the_previous_call_does_not_explain_a_later_edit(api):
    events = Events("compressed-earlier")
    events.turn("r1", s(0), "hi", s(5))
    events.compression("r1", s(0.5), [SYSTEM, ASK, ASK], [SYSTEM, ASK])
    events.llm("r1", s(1), [SYSTEM, ASK])
    events.llm("r1", s(3), [SYSTEM_V2, ASK])
    case = events.send(api)
    assert case.compressions[0].llm_call_id == case.calls[0].pk

    assert explained(*case.calls) is False
    assert call_diff(case.calls[1])["cache_break_reason"] == "edit"


def test_the_batch_gives_every_call_the_diff_it_has_alone_in_three_queries(api):
    built = [cases.append_only(api), cases.edit_in_the_middle(api), cases.compression(api),
             cases.system_prompt_change(api)]
    for case in built:
        calls = digests_of(case.calls)
        with CaptureQueriesContext(connection) as captured:
            diffs = call_diffs(calls)

        assert diffs == {call.pk: call_diff(call) for call in case.calls}
        # Where the lookback starts, the calls' input digests from there to the last one, the compressions.
        assert len(captured.captured_queries) == 3
        assert not [q for q in captured.captured_queries if "input_messages" in q["sql"]]


def test_the_batch_finds_the_previous_call_of_calls_it_was_not_given(api):
    case = cases.append_only(api)
    first, second, third = digests_of(case.calls)

    with CaptureQueriesContext(connection) as captured:
        diffs = call_diffs([third, first])
    # Where the lookback starts, the input digests up to the third call, the compressions.
    assert len(captured.captured_queries) == 3
    assert not [q for q in captured.captured_queries if "input_messages" in q["sql"]]

    assert diffs == {first.pk: call_diff(first), third.pk: call_diff(third)}
    assert diffs[third.pk]["previous_call_id"] == second.pk
    assert diffs[third.pk]["kept_prefix_messages"] == 4
    with CaptureQueriesContext(connection) as captured:
        alone = call_diffs([third])
    assert alone == {third.pk: call_diff(third)}
    assert len(captured.captured_queries) == 3


def test_the_batch_reads_only_a_lookback_of_calls_before_the_first_it_was_given(api, monkeypatch):
    monkeypatch.setattr("pipeline.insight.calls.WINDOW_LOOKBACK", 1)
    case = cases.append_only(api)
    first, second, third = digests_of(case.calls)

    with CaptureQueriesContext(connection) as captured:
        diffs = call_diffs([third])

    assert diffs == {third.pk: call_diff(third)} and diffs[third.pk]["previous_call_id"] == second.pk
    digests = next(q["sql"] for q in captured.captured_queries if "input_digest" in q["sql"])
    assert '"started_at" >=' in digests  # from the second call on, not from the first


def test_the_batch_takes_calls_of_several_conversations(api):
    edit, system = cases.edit_in_the_middle(api), cases.system_prompt_change(api)
    calls = digests_of([*system.calls, *edit.calls])

    diffs = call_diffs(calls)

    assert diffs == {call.pk: call_diff(call) for call in calls}
    assert [diffs[c.pk]["cache_break_reason"] for c in edit.calls + system.calls] == [None, "edit", None, "edit"]


def test_no_calls_no_queries():
    with CaptureQueriesContext(connection) as captured:
        assert call_diffs([]) == {}
    assert captured.captured_queries == []


def test_one_call_reads_two_calls_when_it_extends_the_one_before_it_and_all_earlier_ones_else(api):
    summariser = {"role": "system", "content": cases.padded("Summarise the page.", 200)}
    page = {"role": "user", "content": cases.padded("<html>Tromsoe: 4 C, snow.</html>", 400)}
    events = Events("two-streams")
    events.turn("r1", s(0), "hi", s(10))
    events.llm("r1", s(1), [SYSTEM, ASK], output=CALL_OSLO)
    events.llm("r1", s(2), [summariser, page])  # the tool's own call: the agent's stream is not before it
    events.llm("r1", s(3), [SYSTEM, ASK, CALL_OSLO, RESULT_OSLO])  # extends the first call, not the second
    events.llm("r1", s(4), [SYSTEM, ASK, CALL_OSLO, RESULT_OSLO, cases.ANSWER])
    case = events.send(api)
    batch = call_diffs(digests_of(case.calls))

    counts = []
    for call in case.calls:
        with CaptureQueriesContext(connection) as captured:
            assert call_diff(call) == batch[call.pk]
        counts.append(len(captured.captured_queries))

    # The latest two calls, (every call up to it,) the compressions.
    assert counts == [2, 3, 3, 2]
    assert [batch[c.pk]["previous_call_id"] for c in case.calls] == [None, None, case.calls[0].pk, case.calls[2].pk]
