"""A turn's user message, final answer and start that a placeholder's fold brings: stated by its span, or
in the input of the turn's earliest call (a batch's own spans give them as `_widen_round` reads them)."""

from __future__ import annotations

import json

import pytest

from pipeline.ingest.normalise.span import nanos_to_datetime
from pipeline.ingest.records import SpanRecord
from pipeline.ingest.write.store import store_spans
from pipeline.models import Conversation, Round

pytestmark = pytest.mark.django_db

T0 = 1_763_800_000_000_000_000
MS = 1_000_000
QUESTION = "How warm is Lisbon?\nIn Celsius."


def chat(trace: str, span_id: str, start: int, turn: str, conversation: str = "", question: str = "",
         answer: str = "") -> SpanRecord:
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o", "ctxlens.round.id": turn,
                  "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 5}
    if answer:
        attributes["gen_ai.output.messages"] = json.dumps([{"role": "assistant", "parts": [{"type": "text",
                                                                                         "content": answer}]}])
    if question:
        attributes["gen_ai.input.messages"] = json.dumps([{"role": "user", "parts": [{"type": "text",
                                                                                     "content": question}]}])
    if conversation:
        attributes["gen_ai.conversation.id"] = conversation
    return SpanRecord(trace, span_id, "chat gpt-4o", T0 + start * MS, T0 + (start + 1) * MS,
                      parent_span_id="00000000000000a0", attributes=attributes)


def turn_one() -> Round:
    return Round.objects.get(conversation__external_id="conv-1", key="turn-1")


@pytest.mark.parametrize("later_turn", ["turn-1", "turn-2"], ids=["folding span in the turn", "in another turn"])
@pytest.mark.parametrize("how", ["stated by a span", "in the call's input"])
def test_a_turn_takes_the_user_message_a_folded_placeholder_brings(how, later_turn):
    """Turn 1 of conv-1 has a call without messages. Trace 2's earlier call, in turn 1 too, names
    no conversation: a placeholder, with the user's question (stated, or in its input). A later
    span of trace 2 (in turn 1 or 2) names conv-1, and the placeholder's turn 1 is folded into conv-1's."""
    store_spans([chat("1" * 32, "00000000000000c2", 5, "turn-1", "conv-1")])
    assert turn_one().user_message == ""
    early = chat("2" * 32, "00000000000000c1", 1, "turn-1", question=QUESTION if how == "in the call's input" else "")
    if how == "stated by a span":
        early.attributes["ctxlens.round.user_message"] = QUESTION
    store_spans([early])
    assert Round.objects.get(key="turn-1", conversation__external_id="2" * 32).user_message == QUESTION

    store_spans([chat("2" * 32, "00000000000000c3", 10, later_turn, "conv-1")])

    assert Round.objects.filter(key="turn-1").count() == 1
    assert turn_one().user_message == QUESTION
    assert Conversation.objects.get(external_id="conv-1").title == "How warm is Lisbon?"



@pytest.mark.parametrize("later_turn", ["turn-1", "turn-2"], ids=["folding span in the turn", "in another turn"])
def test_a_fold_keeps_the_texts_that_would_have_won_had_the_spans_come_together(later_turn):
    """conv-1's turn 1 has a later call, with a follow-up question and an answer of its own (the
    turn's fallback answer). The placeholder's turn 1 started first, with the first question, and
    a span stating the turn's answer: both win over conv-1's, as in one batch."""
    store_spans([chat("1" * 32, "00000000000000c2", 5, "turn-1", "conv-1", question="Later follow-up",
                      answer="Looking it up")])
    assert (turn_one().user_message, turn_one().final_answer) == ("Later follow-up", "Looking it up")
    stating = chat("2" * 32, "00000000000000c1", 1, "turn-1", question=QUESTION)
    stating.attributes["ctxlens.round.final_answer"] = "It is 21 degrees."
    store_spans([stating])

    store_spans([chat("2" * 32, "00000000000000c3", 10, later_turn, "conv-1")])

    assert (turn_one().user_message, turn_one().final_answer) == (QUESTION, "It is 21 degrees.")
    assert turn_one().started_at == nanos_to_datetime(T0 + MS)  # the placeholder's call started it


def test_a_fold_leaves_a_stated_answer_of_the_turn_it_joins():
    stated = chat("1" * 32, "00000000000000c2", 5, "turn-1", "conv-1", question="Later follow-up")
    stated.attributes["ctxlens.round.final_answer"] = "The stated answer."
    store_spans([stated])
    store_spans([chat("2" * 32, "00000000000000c1", 1, "turn-1", question=QUESTION, answer="A call's answer")])

    store_spans([chat("2" * 32, "00000000000000c3", 10, "turn-2", "conv-1")])

    assert turn_one().final_answer == "The stated answer."



def test_a_fold_keeps_the_status_of_the_turns_root_the_placeholder_held():
    """The placeholder held trace 2's root, which ended with an error; conv-1's turn 1 had only a
    call, so it was still running. No root of the turn will come again: the fold keeps the error."""
    store_spans([chat("1" * 32, "00000000000000c2", 5, "turn-1", "conv-1")])
    root = SpanRecord("2" * 32, "00000000000000a0", "agent run", T0, T0 + 20 * MS, status_code=2,
                      attributes={"ctxlens.round.id": "turn-1"})
    store_spans([root, chat("2" * 32, "00000000000000c1", 1, "turn-1")])
    assert turn_one().status == "running"

    store_spans([chat("2" * 32, "00000000000000c3", 10, "turn-2", "conv-1")])

    turn = turn_one()
    assert (turn.status, turn.started_at) == ("error", nanos_to_datetime(T0))
    assert turn.ended_at == nanos_to_datetime(T0 + 20 * MS)
    assert turn.duration_ms == 20.0
