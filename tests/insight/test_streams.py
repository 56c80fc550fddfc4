"""Several streams of LLM calls in one conversation: a tool that calls a model itself, one call
recorded by two spans. The findings API and the call-to-call diff API both compare a call with the
previous call of its stream, and agree on which compression explains a break. Conversations are
sent through the REST ingest API (message sizes and tokens as in tests/call_diff_cases.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from tests import call_diff_cases as cases
from tests.call_diff_cases import (
    ANSWER,
    ASK,
    CALL_BERLIN,
    CALL_OSLO,
    ELIDED,
    RESULT_BERLIN,
    RESULT_OSLO,
    SUMMARY,
    SYSTEM,
    T0,
    Case,
    Events,
    padded,
    s,
)
from tests.insight.agent_events import read_client

pytestmark = pytest.mark.django_db

# The tool's own model call: another system prompt and the page it summarises.
SUMMARISER = {"role": "system", "content": padded("Summarise the page in one sentence.", 200)}  # 50 tokens
PAGE_TROMSOE = {"role": "user", "content": padded("<html>Tromsoe: 4 C, snow.</html>", 400)}  # 100
PAGE_HAMBURG = {"role": "user", "content": padded("<html>Hamburg: 11 C, rain.</html>", 400)}  # 100
SHORT_TROMSOE = {"role": "assistant", "content": padded("Tromsoe: 4 C, snow.", 40)}
SHORT_HAMBURG = {"role": "assistant", "content": padded("Hamburg: 11 C, rain.", 40)}


@pytest.fixture
def ingest() -> APIClient:
    return cases.ingest_api()


@pytest.fixture
def reader() -> APIClient:
    return read_client()


def findings(reader: APIClient, case: Case) -> list[dict[str, Any]]:
    reply = reader.get(f"/api/conversations/{case.conversation.pk}/findings/")
    assert reply.status_code == 200, reply.content
    return reply.json()["results"]


def diff_of(reader: APIClient, call_id: int) -> dict[str, Any]:
    reply = reader.get(f"/api/llm-calls/{call_id}/")
    assert reply.status_code == 200, reply.content
    return reply.json()["diff"]


def item(index: int, role: str, category: str, tokens: int) -> dict[str, Any]:
    return {"index": index, "role": role, "category": category, "tokens": tokens}


def tool(events: Events, at: timedelta, call_id: str, city: str, observation: str, duration_ms: float) -> None:
    events.events.append({
        "conversation_id": events.external_id, "round_id": "r1", "type": "tool_call",
        "tool_name": "get_weather", "tool_call_id": call_id, "call_id": f"tool-{call_id}",
        "arguments": {"city": city}, "observation": observation, "started_at": (T0 + at).isoformat(),
        "duration_ms": duration_ms, "observation_tokens": len(observation) // 4,
    })


def llm(events: Events, at: timedelta, messages: list[dict], output: dict, *, duration_ms: float = 500) -> None:
    events.llm("r1", at, messages, output=output)
    events.events[-1]["duration_ms"] = duration_ms


def summarising_tool_loop(ingest: APIClient) -> Case:
    """A clean tool loop whose tool summarises a page with a model call of its own, inside the
    tool call, with its own system prompt: agent, summary, agent, summary, agent."""
    events = Events("summarising-tool")
    events.turn("r1", s(0), "Weather in Tromsoe and Hamburg?", s(20))
    llm(events, s(1), [SYSTEM, ASK], CALL_OSLO)
    tool(events, s(2), "call_1", "Tromsoe", RESULT_OSLO["content"], 3000)
    llm(events, s(3), [SUMMARISER, PAGE_TROMSOE], SHORT_TROMSOE)
    llm(events, s(6), [SYSTEM, ASK, CALL_OSLO, RESULT_OSLO], CALL_BERLIN)
    tool(events, s(7), "call_2", "Hamburg", RESULT_BERLIN["content"], 3000)
    llm(events, s(8), [SUMMARISER, PAGE_HAMBURG], SHORT_HAMBURG)
    llm(events, s(11), [SYSTEM, ASK, CALL_OSLO, RESULT_OSLO, CALL_BERLIN, RESULT_BERLIN], ANSWER)
    return events.send(ingest)


def test_a_tool_that_calls_a_model_itself_leaves_a_clean_loop_without_findings(ingest, reader):
    case = summarising_tool_loop(ingest)

    assert findings(reader, case) == []


def test_the_diff_compares_each_call_with_the_previous_call_of_its_stream(ingest, reader):
    agent_1, summary_1, agent_2, summary_2, agent_3 = (call.pk for call in summarising_tool_loop(ingest).calls)

    diffs = {pk: diff_of(reader, pk) for pk in (agent_1, summary_1, agent_2, summary_2, agent_3)}

    assert {pk: diff["previous_call_id"] for pk, diff in diffs.items()} == {
        agent_1: None, summary_1: None, agent_2: agent_1, summary_2: summary_1, agent_3: agent_2}
    assert diffs[summary_1] == {  # opens a stream of its own
        "previous_call_id": None, "kept_prefix_messages": 0, "kept_prefix_tokens": 0,
        "added": [item(0, "system", "system", 50), item(1, "user", "user", 100)], "removed": [], "changed": [],
        "token_delta": 150, "token_delta_by_category": {"system": 50, "user": 100},
        "cache_break": False, "cache_break_reason": None, "uncacheable_tokens": 0,
    }
    assert diffs[agent_2] == {
        "previous_call_id": agent_1, "kept_prefix_messages": 2, "kept_prefix_tokens": 120,
        "added": [item(2, "assistant", "assistant", 8), item(3, "tool", "tool_observations", 200)],
        "removed": [], "changed": [], "token_delta": 208,
        "token_delta_by_category": {"assistant": 8, "tool_observations": 200},
        "cache_break": False, "cache_break_reason": None, "uncacheable_tokens": 0,
    }
    # The second page replaces the first after the shared system prompt: a break, but nothing a
    # cache held is lost, so the findings (above) have no cache_break.
    assert diffs[summary_2] == {
        "previous_call_id": summary_1, "kept_prefix_messages": 1, "kept_prefix_tokens": 50,
        "added": [], "removed": [],
        "changed": [{**item(1, "user", "user", 100), "previous_index": 1, "previous_tokens": 100}],
        "token_delta": 0, "token_delta_by_category": {},
        "cache_break": True, "cache_break_reason": "edit", "uncacheable_tokens": 0,
    }
    assert (diffs[agent_3]["kept_prefix_messages"], diffs[agent_3]["cache_break"]) == (4, False)


def recorded_twice(ingest: APIClient) -> Case:
    """Each model call recorded by a framework's span and the provider SDK's span inside it (the
    same input and output, started 100 ms later, ended 100 ms earlier)."""
    events = Events("recorded-twice")
    events.turn("r1", s(0), "Weather in Tromsoe?", s(10))
    llm(events, s(1), [SYSTEM, ASK], CALL_OSLO, duration_ms=900)
    llm(events, s(1.1), [SYSTEM, ASK], CALL_OSLO, duration_ms=700)
    tool(events, s(2), "call_1", "Tromsoe", RESULT_OSLO["content"], 500)
    llm(events, s(4), [SYSTEM, ASK, CALL_OSLO, RESULT_OSLO], ANSWER, duration_ms=900)
    llm(events, s(4.1), [SYSTEM, ASK, CALL_OSLO, RESULT_OSLO], ANSWER, duration_ms=700)
    return events.send(ingest)


def test_one_call_recorded_by_two_spans_is_checked_once(ingest, reader):
    case = recorded_twice(ingest)

    assert findings(reader, case) == []


def test_the_diff_of_a_call_recorded_again_keeps_everything(ingest, reader):
    framework_1, provider_1, framework_2, provider_2 = (call.pk for call in recorded_twice(ingest).calls)

    again = diff_of(reader, provider_1)
    after = diff_of(reader, framework_2)

    assert again == {
        "previous_call_id": framework_1, "kept_prefix_messages": 2, "kept_prefix_tokens": 120, "added": [],
        "removed": [], "changed": [], "token_delta": 0, "token_delta_by_category": {},
        "cache_break": False, "cache_break_reason": None, "uncacheable_tokens": 0,
    }
    assert (after["previous_call_id"], after["kept_prefix_messages"], len(after["added"]), after["cache_break"]) == (
        provider_1, 2, 2, False)
    assert diff_of(reader, provider_2)["previous_call_id"] == framework_2


def test_a_second_recording_of_a_call_whose_result_is_missing_reports_it_once(ingest, reader):
    events = Events("recorded-twice-missing")
    events.turn("r1", s(0), "Weather in Tromsoe and Hamburg?", s(10))
    both = {"role": "assistant", "tool_calls": [
        {"id": "call_1", "name": "get_weather", "arguments": {"city": "Tromsoe"}},
        {"id": "call_2", "name": "get_weather", "arguments": {"city": "Hamburg"}}]}
    llm(events, s(1), [SYSTEM, ASK], both, duration_ms=900)
    llm(events, s(1.1), [SYSTEM, ASK], both, duration_ms=700)
    events.llm("r1", s(4), [SYSTEM, ASK, CALL_OSLO, RESULT_OSLO])  # call_2 unanswered
    case = events.send(ingest)
    third = case.calls[2]

    assert findings(reader, case) == [{
        "code": "missing_tool_result", "severity": "error",
        "message": "LLM call #1 asked for tool call call_2; the input of the next LLM call of its stream, #3, has no "
                   "tool result for it.",
        "round_id": third.round_id, "llm_call_id": third.pk, "tool_call_id": "call_2", "tool_call": None,
    }]


def test_a_compression_at_the_start_of_the_previous_call_is_its_own_for_the_diff_and_the_findings(ingest, reader):
    before = [SYSTEM, ASK, CALL_OSLO, RESULT_OSLO, CALL_BERLIN, RESULT_BERLIN]
    events = Events("compressed-at-the-previous-start")
    events.turn("r1", s(0), "Weather in Tromsoe and Hamburg?", s(10))
    events.compression("r1", s(1), [*before, ANSWER], before)
    events.llm("r1", s(1), before)
    events.llm("r1", s(3), [SYSTEM, ASK, CALL_OSLO, ELIDED, CALL_BERLIN, RESULT_BERLIN, ANSWER])
    case = events.send(ingest)
    first, second = case.calls
    assert case.compressions[0].llm_call_id == first.pk  # it came before the first call

    assert diff_of(reader, second.pk)["cache_break_reason"] == "edit"
    assert findings(reader, case) == [{
        "code": "cache_break", "severity": "warning",
        "message": "The input of LLM call #2 does not extend the input of call #1: it keeps the first 3 of its 6 "
                   "messages and no compression explains the change; 108 tokens of messages both inputs share sit "
                   "past that point and can no longer come from a prompt cache.",
        "round_id": second.round_id, "llm_call_id": second.pk, "tool_call_id": None, "tool_call": None,
    }]


def test_a_compression_linked_to_the_call_explains_its_break_for_the_diff_and_the_findings(ingest, reader):
    before = [SYSTEM, ASK, CALL_OSLO, RESULT_OSLO, CALL_BERLIN, RESULT_BERLIN]
    after = [SYSTEM, SUMMARY, CALL_BERLIN, RESULT_BERLIN]
    events = Events("compressed-in-an-overlapping-turn")
    events.turn("r1", s(0), "Weather in Tromsoe and Hamburg?", s(5))
    events.turn("r2", s(0.2), "And tomorrow?", s(10))  # started while r1 ran
    events.compression("r2", s(0.5), before, after)  # before r1's call: outside the calls' window
    events.llm("r1", s(1), before)
    events.llm("r2", s(3), [*after, ASK])
    case = events.send(ingest)
    first, second = case.calls
    assert case.compressions[0].llm_call_id == second.pk

    diff = diff_of(reader, second.pk)
    assert (diff["previous_call_id"], diff["cache_break"], diff["cache_break_reason"]) == (
        first.pk, True, "compression")
    assert findings(reader, case) == []


def test_two_spans_that_print_a_tool_call_differently_are_still_one_call(ingest, reader):
    events = Events("recorded-twice-printed-differently")
    events.turn("r1", s(0), "Weather in Tromsoe?", s(10))
    llm(events, s(1), [SYSTEM, ASK], CALL_OSLO, duration_ms=900)
    # The provider SDK's span: the same tool call, its arguments as the provider's JSON text.
    provider_call = {"role": "assistant", "tool_calls": [{"id": "call_1", "name": "get_weather",
                                                          "arguments": '{"city":"Tromsoe"}'}]}
    llm(events, s(1.1), [SYSTEM, ASK], provider_call, duration_ms=700)
    tool(events, s(2), "call_1", "Tromsoe", RESULT_OSLO["content"], 500)
    llm(events, s(4), [SYSTEM, ASK, CALL_OSLO, RESULT_OSLO], ANSWER)
    case = events.send(ingest)
    framework, provider, _ = case.calls
    assert framework.output_digest[0]["hash"] != provider.output_digest[0]["hash"]

    assert findings(reader, case) == []


def test_a_call_sent_again_is_not_the_step_that_must_answer_its_tool_calls(ingest, reader):
    events = Events("sent-again")
    events.turn("r1", s(0), "Weather in Tromsoe and Hamburg?", s(10))
    llm(events, s(1), [SYSTEM, ASK], CALL_OSLO)  # the agent drops this output (say, it failed to parse)
    llm(events, s(2), [SYSTEM, ASK], CALL_BERLIN)  # and sends the same input again
    tool(events, s(3), "call_2", "Hamburg", RESULT_BERLIN["content"], 500)
    llm(events, s(4), [SYSTEM, ASK, CALL_BERLIN, RESULT_BERLIN], ANSWER)
    case = events.send(ingest)

    assert findings(reader, case) == []
