"""Lookups of a round read in part (pipeline.ingest.write.linking: `RoundRows._read_round`,
`_answering_calls`), each in a turn that needs it: stored in two requests, the turn ends up as
stored in one. The rows the second request adds start after the stored call the result depends
on, so only that lookup brings the call in (each test fails with its lookup's condition negated
or its rows dropped)."""

from __future__ import annotations

import json

import pytest

from pipeline.ingest.records import SpanRecord
from pipeline.ingest.write.store import store_spans
from pipeline.models import Conversation, LLMCall, Round, Span, ToolCall

pytestmark = pytest.mark.django_db

T0 = 1_763_900_000_000_000_000
MS = 1_000_000
TRACE = "5cf92f3577b34da6a3ce929d0e0e4755"
ASK = {"role": "user", "parts": [{"type": "text", "content": "Look it up"}]}


def _asks(call_id: str, name: str) -> dict:
    return {"role": "assistant", "parts": [{"type": "tool_call", "id": call_id, "name": name, "arguments": {}}]}


def _says(text: str) -> dict:
    return {"role": "assistant", "parts": [{"type": "text", "content": text}]}


def _chat(number: int, start: int, end: int, output: dict) -> SpanRecord:
    return SpanRecord(TRACE, f"{number:016x}", "chat gpt-4o", T0 + start * MS, T0 + end * MS, attributes={
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o", "gen_ai.conversation.id": "conv-reads",
        "gen_ai.input.messages": json.dumps([ASK]), "gen_ai.output.messages": json.dumps([output]),
    })


def _tool(number: int, start: int, name: str, call_id: str = "") -> SpanRecord:
    attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                  "gen_ai.conversation.id": "conv-reads", "gen_ai.tool.call.result": f"{name} result"}
    if call_id:
        attributes["gen_ai.tool.call.id"] = call_id
    return SpanRecord(TRACE, f"{number:016x}", f"execute_tool {name}", T0 + start * MS, T0 + (start + 30) * MS,
                      attributes=attributes)


def _stored() -> dict:
    calls = {c.id: c.span_id for c in LLMCall.objects.all()}
    return {
        "final_answer": Round.objects.get().final_answer,
        "steps": sorted(LLMCall.objects.values_list("span_id", "step")),
        "tools": sorted((t.span_id, t.tool_call_id, calls.get(t.llm_call_id)) for t in ToolCall.objects.all()),
    }


def _in(*batches: list[SpanRecord]) -> dict:
    for model in (Span, Conversation):
        model.objects.all().delete()
    for batch in batches:
        store_spans(batch)
    return _stored()


def _split_equals_whole(first: list[SpanRecord], second: list[SpanRecord]) -> dict:
    whole = _in(first + second)
    assert _in(first, second) == whole
    return whole


def test_a_late_tool_with_a_call_id_finds_the_earlier_call_that_asked_for_it():
    # the tool's call (1) started before the last call before the tool (2), and the span names the
    # tool otherwise than the model did: only the request's id finds the call
    first = [_chat(1, 0, 40, _asks("call_A", "search")), _chat(2, 100, 140, _asks("call_B", "fetch"))]
    whole = _split_equals_whole(first, [_tool(3, 200, "web_search", "call_A")])
    assert (f"{3:016x}", "call_A", f"{1:016x}") in whole["tools"]


def test_a_late_tool_without_a_call_id_takes_the_unclaimed_request_of_its_name():
    first = [_chat(1, 0, 40, _asks("call_A", "search")), _chat(2, 100, 140, _asks("call_B", "fetch"))]
    whole = _split_equals_whole(first, [_tool(3, 200, "search")])
    assert (f"{3:016x}", "call_A", f"{1:016x}") in whole["tools"]


def test_an_earlier_call_that_answers_last_is_weighed_as_in_one_request():
    # call 1 answers but ends last, before the second request's rows; the root, sent with call 3,
    # states call 3's answer, so the round's answer is decided again (stored answers that equal a
    # call's are taken for fallbacks), and call 1 takes part only if the answering calls are read
    root = SpanRecord(TRACE, f"{0xff:016x}", "invoke_agent", T0, T0 + 6_000 * MS, attributes={
        "gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "conv-reads",
        "ctxlens.round.final_answer": "Quick."})
    first = [_chat(1, 0, 5_000, _says("Slow answer.")), _chat(2, 100, 140, _asks("call_A", "search"))]
    _split_equals_whole(first, [_tool(4, 150, "search", "call_A"), _chat(3, 300, 400, _says("Quick.")), root])


def test_a_call_starting_with_a_stored_call_is_numbered_after_it():
    first = [_chat(1, 0, 40, _asks("call_A", "search")), _chat(2, 100, 140, _says("Done."))]
    whole = _split_equals_whole(first, [_chat(3, 100, 150, _says("Also done."))])  # starts as call 2 does
    assert whole["steps"] == [(f"{1:016x}", 0), (f"{2:016x}", 1), (f"{3:016x}", 2)]


def test_a_span_starting_with_a_stored_call_leaves_the_steps_as_they_are():
    first = [_chat(1, 0, 40, _asks("call_A", "search")), _chat(2, 100, 140, _says("Done."))]
    whole = _split_equals_whole(first, [_tool(3, 100, "search", "call_A")])  # starts as call 2 does
    assert whole["steps"] == [(f"{1:016x}", 0), (f"{2:016x}", 1)]
