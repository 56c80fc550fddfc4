"""Reading the inputs' digests from their JSON text (pipeline.insight.conversation_rows.read_streams):
an input that extends an earlier one is read as the earlier entries plus the decoded additions,
in the text SQLite keeps (Django's json.dumps) and in PostgreSQL's jsonb text alike, and each
call gets the call it follows in its stream."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from pipeline.insight.conversation_rows import CallRow, first_hash, read_streams


def entry(n: int, **more) -> dict:
    return {"hash": f"{n:016x}", "role": "user", "category": "user", "bytes": n, **more}


INPUTS = [
    [],
    [entry(1)],
    [entry(1), entry(2, requests=["call_}, {1"])],  # trace text that looks like an element boundary
    [entry(1), entry(2, requests=["call_}, {1"])],  # the same input again
    [entry(9), entry(2, requests=["call_}, {1"])],  # an edit: read whole
    [entry(9), entry(2, requests=["call_}, {1"]), entry(3, answers=["call_}, {1"])],
]


def jsonb_text(value: list) -> str:
    """How PostgreSQL prints jsonb: ", " and ": " separators, keys by length then bytes."""
    return "[" + ", ".join(
        "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(e.items(), key=lambda kv: (len(kv[0]), kv[0])))
        + "}" for e in value) + "]"


def rows(n: int) -> list[CallRow]:
    return [CallRow(i, datetime(2026, 5, 1, tzinfo=UTC), 0) for i in range(n)]


def previous_ids(calls: list[CallRow]) -> list[int | None]:
    return [call.previous.pk if call.previous else None for call in calls]


@pytest.mark.parametrize("serialise", [json.dumps, jsonb_text])
def test_extended_inputs_are_read_from_what_they_add(serialise):
    calls = rows(len(INPUTS))

    read_streams(calls, [serialise(value) for value in INPUTS])

    assert [call.input for call in calls] == INPUTS
    assert [call.added for call in calls] == [None, None, [entry(2, requests=["call_}, {1"])], [], None,
                                              [entry(3, answers=["call_}, {1"])]]
    # [e1] shares nothing with the empty input before it; the edit [e9, e2] follows the call
    # before it, with which it shares e2.
    assert previous_ids(calls) == [None, None, 1, 2, 3, 4]


def test_an_input_printed_differently_still_extends_the_same_messages():
    texts = [json.dumps(value) if i % 2 else jsonb_text(value) for i, value in enumerate(INPUTS)]
    calls = rows(len(INPUTS))

    read_streams(calls, texts)

    assert [call.input for call in calls] == INPUTS
    assert [call.added for call in calls] == [None, None, [entry(2, requests=["call_}, {1"])], [], None,
                                              [entry(3, answers=["call_}, {1"])]]
    assert previous_ids(calls) == [None, None, 1, 2, 3, 4]


def test_each_call_follows_the_latest_call_of_its_stream():
    agent, tool = entry(1, role="system"), entry(7, role="system")
    inputs = [
        [agent, entry(2)],  # 0: the agent asks for a tool
        [tool, entry(8)],  # 1: the tool's own LLM call: a new stream
        [agent, entry(2), entry(3), entry(4)],  # 2: extends 0, not the call before it
        [tool, entry(9)],  # 3: the tool again: same first message as 1, extends nothing
        [agent, entry(2), entry(3), entry(4)],  # 4: 2 recorded again
        [agent, entry(5)],  # 5: an edit of the agent's stream: the latest call with its first message
        [],  # 6: input not recorded: the call before it in time
    ]
    calls = rows(len(inputs))

    read_streams(calls, [json.dumps(value) for value in inputs])

    assert previous_ids(calls) == [None, None, 0, 1, 2, 4, 5]
    assert [call.added for call in calls] == [None, None, [entry(3), entry(4)], None, [], None, None]


def test_only_the_latest_calls_with_one_first_message_are_followed():
    from pipeline.insight.conversation_rows import STREAM_LOOKBACK

    system = entry(1, role="system")
    inputs = [[system, entry(2)], *([system, entry(100 + n)] for n in range(STREAM_LOOKBACK)),
              [system, entry(2), entry(3)]]
    calls = rows(len(inputs))

    read_streams(calls, [json.dumps(value) for value in inputs])

    # Call 0 is one call too far back: the last call follows the latest with its first message.
    assert previous_ids(calls)[-1] == STREAM_LOOKBACK
    assert calls[-1].added is None

    shorter = [inputs[0], *inputs[2:]]
    calls = rows(len(shorter))
    read_streams(calls, [json.dumps(value) for value in shorter])
    assert previous_ids(calls)[-1] == 0
    assert calls[-1].added == [entry(3)]


@pytest.mark.parametrize("serialise", [json.dumps, jsonb_text])
def test_the_first_hash_is_read_from_the_first_entry_alone(serialise):
    assert first_hash(serialise([entry(5), entry(6)])) == f"{5:016x}"
    assert first_hash(" [ " + serialise([entry(5)])[1:]) == f"{5:016x}"
    assert [first_hash(text) for text in ("[]", "", "[1, 2]", "{}", "[{\"hash\": 3}]", "[{\"hash\": ")] == [None] * 6
