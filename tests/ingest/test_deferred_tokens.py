"""Deferred token counting (pipeline.ingest.write.deferred) against ingest that changes the same rows."""

from __future__ import annotations

import pytest

from pipeline.ingest.records import LogRecord, SpanRecord
from pipeline.ingest.write import deferred
from pipeline.ingest.write.store import store_spans
from pipeline.models import Conversation, LLMCall, Round

pytestmark = pytest.mark.django_db

T0 = 1_763_800_000_000_000_000
MS = 1_000_000
TRACE, CHAT = "5bf92f3577b34da6a3ce929d0e0e4736", "00000000000000c1"


def _chat_without_messages_or_counts() -> SpanRecord:
    return SpanRecord(TRACE, CHAT, "chat gpt-4o", T0, T0 + 5 * MS, attributes={
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o"})


def _log(i: int, name: str, body: dict) -> LogRecord:
    return LogRecord(TRACE, CHAT, T0 + i, name, body)


def test_messages_rebuilt_by_a_log_batch_while_tokens_are_counted_get_counted_too():
    store_spans([_chat_without_messages_or_counts()],
                logs=[_log(1, "gen_ai.user.message", {"content": "What is the weather in Paris today?"})])
    assert LLMCall.objects.get().tokens_pending

    counted = deferred.count_some()  # the background work has read and counted the call ...
    # ... when its answer arrives as a log in another request, which rebuilds the messages
    store_spans([], logs=[_log(2, "gen_ai.choice", {"index": 0, "message": {"content": "Sunny and warm, 24 degrees."}})])
    deferred.write_counted(counted)
    deferred.complete_pending()

    call = LLMCall.objects.get()
    assert call.output_messages[0]["parts"] == [{"type": "text", "content": "Sunny and warm, 24 degrees."}]
    assert not call.tokens_pending
    assert call.input_tokens > 0 and call.output_tokens > 0
    assert call.total_tokens == call.input_tokens + call.output_tokens
    assert Round.objects.get().output_tokens == Conversation.objects.get().output_tokens == call.output_tokens


def test_a_huge_prompt_without_counts_is_estimated_past_the_cap_and_marked(client, alice):
    """Tokenising ~1 s per MB on the writer made a 20 MB prompt stall every other export: a
    message is counted exactly up to MAX_EXACT_CHARS and estimated past it, and the call says so."""
    from pipeline.tokens.counting import MAX_EXACT_CHARS, MESSAGE_OVERHEAD, count_tokens

    prompt = " ".join(f"row {i}: revenue {i * 37 % 1000} EUR, region {i % 7};" for i in range(60_000))
    assert len(prompt) > 20 * MAX_EXACT_CHARS
    small = "What is the weather in Paris today?"
    store_spans([_chat_without_messages_or_counts()],
                logs=[_log(1, "gen_ai.user.message", {"content": prompt}), _log(2, "gen_ai.choice", {
                    "index": 0, "message": {"content": small}})])

    deferred.complete_pending()

    call = LLMCall.objects.get()
    exact = count_tokens(prompt, "gpt-4o")
    assert call.tokens_estimated and not call.tokens_pending
    assert abs(call.input_tokens - exact) <= 0.05 * exact
    assert call.output_tokens == count_tokens(small, "gpt-4o") + MESSAGE_OVERHEAD  # short text stays exact
    client.force_login(alice)
    detail = client.get(f"/api/conversations/{call.conversation_id}/").json()
    assert detail["rounds"][0]["llm_calls"][0]["tokens_estimated"] is True


def test_short_messages_are_counted_exactly_and_not_marked():
    from pipeline.tokens.counting import MESSAGE_OVERHEAD, count_tokens

    store_spans([_chat_without_messages_or_counts()],
                logs=[_log(1, "gen_ai.user.message", {"content": "What is the weather in Paris today?"})])
    deferred.complete_pending()
    call = LLMCall.objects.get()
    assert not call.tokens_estimated
    assert call.input_tokens == count_tokens("What is the weather in Paris today?", "gpt-4o") + MESSAGE_OVERHEAD


def test_a_row_that_cannot_be_counted_does_not_hold_back_the_rows_behind_it(caplog):
    """The chunk used to fail whole, and the next run took the same rows first again (review)."""
    from django.utils import timezone

    from tests.dashboard_fixtures import make_llm_call
    from tests.factories import make_conversation

    conversation = make_conversation("uncountable")
    now = timezone.now()
    broken = make_llm_call(conversation, None, now, input_tokens=0, output_tokens=0, context_composition={},
                           input_messages=5, tokens_pending=True)  # not a list: as an old or hand-edited row
    good = make_llm_call(conversation, None, now, input_tokens=0, output_tokens=0, context_composition={},
                         tokens_pending=True)

    deferred.complete_pending()

    broken.refresh_from_db()
    good.refresh_from_db()
    assert (broken.tokens_pending, broken.tokens_estimated) == (False, True)
    assert not good.tokens_pending and good.input_tokens > 0
    assert "could not count the tokens of LLMCall" in caplog.text
