"""A long turn stored in many batches ends up as if stored in one: each batch reads only the stored
rows its new ones can change (pipeline.ingest.write.linking.RoundRows.around), and adds its rows'
figures to the round's counters instead of aggregating the round again."""

from __future__ import annotations

import json
import random

import pytest

from pipeline.ingest.records import SpanRecord
from pipeline.ingest.write.counters import recompute_counters
from pipeline.ingest.write.store import store_spans
from pipeline.models import Conversation, LLMCall, Round, Span, ToolCall, ToolRequest

pytestmark = pytest.mark.django_db

T0 = 1_763_900_000_000_000_000
MS = 1_000_000
TRACE = "5cf92f3577b34da6a3ce929d0e0e4737"
ROOT = "00000000000000ff"
STEPS = 12


def _messages(*items: dict) -> str:
    return json.dumps(list(items))


def long_turn() -> list[SpanRecord]:
    """A root and STEPS LLM calls, each asking for one tool but the last, which answers. Every third
    tool span carries no call id (linked by name), every fourth no result (read from the next
    call's input), and one call fails."""
    def span(number: int, name: str, start: int, end: int, attrs: dict, parent: str = ROOT, **kw) -> SpanRecord:
        return SpanRecord(TRACE, f"{number:016x}", name, T0 + start * MS, T0 + end * MS, parent_span_id=parent,
                          attributes=attrs, resource={"service.name": "long-turn"}, **kw)

    spans = [span(0xff, "invoke_agent helper", 0, 10_000, {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "conv-long",
    }, parent="")]
    for i in range(STEPS):
        t = 10 + i * 100
        tool_name = f"tool_{i}"  # one name a step: a match by name has one answer
        history = [{"role": "user", "parts": [{"type": "text", "content": "Find it"}]}]
        if i:
            history.append({"role": "tool", "parts": [
                {"type": "tool_call_response", "id": f"call_{i - 1}", "response": f"result {i - 1}"}]})
        last = i == STEPS - 1
        output = ({"role": "assistant", "parts": [{"type": "text", "content": "All done."}]} if last else
                  {"role": "assistant", "parts": [{"type": "tool_call", "id": f"call_{i}", "name": tool_name,
                                                   "arguments": {"step": i}}]})
        spans.append(span(2 * i + 1, "chat gpt-4o", t, t + 40, {
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
            "gen_ai.usage.input_tokens": 100 + i, "gen_ai.usage.output_tokens": 10 + i,
            "gen_ai.input.messages": _messages(*history), "gen_ai.output.messages": _messages(output),
        }, status_code=2 if i == 5 else 0))
        if last:
            continue
        tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool_name}
        if i % 3:
            tool["gen_ai.tool.call.id"] = f"call_{i}"
        if i % 4:
            tool["gen_ai.tool.call.result"] = f"result {i}"
        spans.append(span(2 * i + 2, f"execute_tool {tool_name}", t + 50, t + 90, tool))
    return spans


def snapshot() -> dict:
    calls = {c.id: c.span_id for c in LLMCall.objects.all()}
    conversation, round_ = Conversation.objects.get(), Round.objects.get()
    return {
        "round": (round_.final_answer, round_.status, round_.llm_call_count, round_.tool_call_count,
                  round_.error_count, round_.input_tokens, round_.output_tokens, round_.cost_usd,
                  round_.unpriced_call_count),
        "conversation": (conversation.llm_call_count, conversation.tool_call_count, conversation.error_count,
                         conversation.input_tokens, conversation.message_count, conversation.cost_usd),
        "steps": sorted((c.span_id, c.step) for c in LLMCall.objects.all()),
        "tools": sorted((t.span_id, t.tool_call_id, calls.get(t.llm_call_id), json.dumps(t.arguments), t.observation)
                        for t in ToolCall.objects.all()),
        "requests": sorted((calls[r.llm_call_id], r.tool_call_id, r.name) for r in ToolRequest.objects.all()),
    }


def _clear() -> None:
    for model in (Span, Conversation):
        model.objects.all().delete()


def _store_in(batches: list[list[SpanRecord]]) -> dict:
    _clear()
    for batch in batches:
        store_spans(batch)
    stored = snapshot()
    recompute_counters(set(Round.objects.values_list("id", flat=True)), set(Conversation.objects.values_list("id", flat=True)))
    assert snapshot() == stored, "counters added batch by batch differ from counters aggregated again"
    return stored


def test_a_turn_stored_span_by_span_equals_the_turn_stored_at_once():
    whole = _store_in([long_turn()])
    assert whole["round"][:5] == ("All done.", "ok", STEPS, STEPS - 1, 1)
    assert whole["steps"] == sorted((f"{2 * i + 1:016x}", i) for i in range(STEPS))
    assert all(tool_call_id and owner for _, tool_call_id, owner, _, _ in whole["tools"])
    assert ("", "") not in {(t[1], t[4]) for t in whole["tools"]}  # ids by name, results from the next input
    assert _store_in([[s] for s in long_turn()]) == whole
    assert _store_in([[s] for s in reversed(long_turn())]) == whole


@pytest.mark.parametrize("seed", range(6))
def test_a_turn_in_any_order_and_any_split_equals_the_turn_stored_at_once(seed):
    whole = _store_in([long_turn()])
    spans = long_turn()
    rng = random.Random(seed)
    rng.shuffle(spans)
    cuts = sorted(rng.sample(range(1, len(spans)), rng.randint(3, 10)))
    assert _store_in([spans[a:b] for a, b in zip([0, *cuts], [*cuts, len(spans)], strict=True)]) == whole
