"""A round read in part (pipeline.ingest.write.linking.RoundRows.around) links as if read whole:
findings of the review of the batch-linear ingest, each stored through store_spans in the batches
that showed it."""

from __future__ import annotations

import json
import sqlite3

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from pipeline.ingest.records import SpanRecord
from pipeline.ingest.write.store import store_spans
from pipeline.models import Conversation, LLMCall, Round, Span, ToolCall

pytestmark = pytest.mark.django_db

T0 = 1_763_900_000_000_000_000
MS = 1_000_000
ROUND_1 = "5cf92f3577b34da6a3ce929d0e0e4701"
ROUND_2 = "5cf92f3577b34da6a3ce929d0e0e4702"


def _chat(trace: str, number: int, start: int, history: list[dict], output: dict) -> SpanRecord:
    return SpanRecord(trace, f"{number:016x}", "chat gpt-4o", T0 + start * MS, T0 + (start + 40) * MS, attributes={
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o", "gen_ai.conversation.id": "conv-review",
        "gen_ai.input.messages": json.dumps(history), "gen_ai.output.messages": json.dumps([output]),
    })


def _result(call_id: str, text: str) -> dict:
    return {"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, "response": text}]}


ASK = {"role": "user", "parts": [{"type": "text", "content": "Look it up"}]}
ASKS_A = {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_A", "name": "lookup", "arguments": {}}]}
DONE = {"role": "assistant", "parts": [{"type": "text", "content": "Done."}]}


def test_a_tool_takes_its_result_from_its_own_round_not_a_later_turns_copy():
    l1 = _chat(ROUND_1, 1, 0, [ASK], ASKS_A)
    l2 = _chat(ROUND_1, 2, 100, [ASK, _result("call_A", "FULL RESULT")], DONE)
    # the next turn carries the same call, its result cut short by the agent's history trimming
    l3 = _chat(ROUND_2, 3, 5_000, [ASK, _result("call_A", "[truncated]"), ASK], DONE)
    tool = SpanRecord(ROUND_1, f"{4:016x}", "execute_tool lookup", T0 + 50 * MS, T0 + 90 * MS, attributes={
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup", "gen_ai.tool.call.id": "call_A",
        "gen_ai.conversation.id": "conv-review",
    })
    for batch in ([l1, l2], [l3], [tool]):
        store_spans(batch)
    stored = ToolCall.objects.get()
    assert (stored.observation, stored.llm_call_id) == ("FULL RESULT", LLMCall.objects.get(span_id=l1.span_id).pk)


def test_linking_reads_no_tool_row_one_by_one():
    """The tools a batch relinks are read with every column linking uses: none is fetched again
    alone (a deferred field costs a SELECT per row)."""
    store_spans([_chat(ROUND_1, 1, 0, [ASK], ASKS_A)])
    tool = SpanRecord(ROUND_1, f"{4:016x}", "execute_tool lookup", T0 + 50 * MS, T0 + 90 * MS, attributes={
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup", "gen_ai.conversation.id": "conv-review",
    })
    store_spans([tool])  # stored before the call that answers it: its result is found later
    with CaptureQueriesContext(connection) as queries:
        store_spans([_chat(ROUND_1, 2, 100, [ASK, _result("call_A", "FULL RESULT")], DONE)])
    assert ToolCall.objects.get().observation == "FULL RESULT"
    one_by_one = [q["sql"] for q in queries if "pipeline_toolcall" in q["sql"] and "LIMIT 21" in q["sql"]]
    assert one_by_one == []


def _turn_call(trace: str, number: int, start: int, turn: str, conversation: str = "") -> SpanRecord:
    record = _chat(trace, number, start, [ASK], DONE)
    record.attributes["ctxlens.round.id"] = turn
    if conversation:
        record.attributes["gen_ai.conversation.id"] = conversation
    else:
        del record.attributes["gen_ai.conversation.id"]
    return record


def test_a_turn_a_placeholder_was_folded_into_is_numbered_and_counted_again():
    """Trace 2 starts without naming its conversation (a placeholder holds it); a later span of
    it names the conversation from another turn, so the batch that folds trace 2's turn-1 calls
    into the conversation's turn-1 does not itself touch turn-1."""
    store_spans([_turn_call(ROUND_1, 1, 0, "turn-1", "conv-fold")])
    store_spans([_turn_call(ROUND_2, 2, 100, "turn-1"), _turn_call(ROUND_2, 3, 200, "turn-1")])
    store_spans([_turn_call(ROUND_2, 4, 5_000, "turn-2", "conv-fold")])
    turn = Round.objects.get(key="turn-1")
    assert Conversation.objects.get().external_id == "conv-fold"
    assert sorted(turn.llm_calls.values_list("span_id", "step")) == [(f"{n:016x}", n - 1) for n in (1, 2, 3)]
    assert (turn.llm_call_count, turn.conversation.llm_call_count) == (3, 4)


def test_a_trace_goes_to_its_conversation_though_one_of_its_spans_has_none():
    """Span.conversation is nullable: a span row of the trace that holds none (written by hand,
    or before spans carried one) must not hide the conversation the trace's other spans are in."""
    store_spans([_chat(ROUND_1, 2, 0, [ASK], DONE)])
    Span.objects.create(trace_id=ROUND_1, span_id=f"{1:016x}", name="orphan", start_time=Span.objects.get().start_time)
    late = _chat(ROUND_1, 3, 100, [ASK], DONE)
    del late.attributes["gen_ai.conversation.id"]  # a child that names nothing: the trace's conversation holds it
    store_spans([late])
    assert list(Conversation.objects.values_list("external_id", flat=True)) == ["conv-review"]
    assert LLMCall.objects.filter(conversation__external_id="conv-review").count() == 2


VARIABLE_LIMIT = 1000  # what the ingest's own chunks need at most (sql.by_spans: 500 pairs)


@pytest.mark.skipif(connection.vendor != "sqlite", reason="lowers a limit of SQLite's connection")
def test_a_batch_early_in_a_very_long_round_stays_within_sqlites_variable_limit():
    """A batch whose rows start before a long stretch of stored calls reads that stretch
    (RoundRows.around): no IN list may hold all of it. SQLite's limit on a statement's variables
    (32,766 by default) is lowered here so that a round of a thousand calls reaches it."""
    long_stretch = [_chat(ROUND_1, n, 1_000 + n, [ASK], DONE) for n in range(1, VARIABLE_LIMIT + 100)]
    store_spans(long_stretch)
    early = [
        _chat(ROUND_1, 0xF0000, 0, [ASK], {"role": "assistant", "parts": [{"type": "text", "content": "Early."}]}),
        SpanRecord(ROUND_1, f"{0xF0001:016x}", "execute_tool lookup", T0 + 5 * MS, T0 + 9 * MS, attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup", "gen_ai.tool.call.id": "call_X",
            "gen_ai.conversation.id": "conv-review",
        }),
    ]
    connection.ensure_connection()
    before = connection.connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, VARIABLE_LIMIT)
    try:
        store_spans(early)
    finally:
        connection.connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, before)
    turn = Round.objects.get()
    assert turn.llm_call_count == len(long_stretch) + 1
    assert LLMCall.objects.get(span_id=f"{0xF0000:016x}").step == 0
    assert LLMCall.objects.get(span_id=f"{VARIABLE_LIMIT + 99:016x}").step == len(long_stretch)
