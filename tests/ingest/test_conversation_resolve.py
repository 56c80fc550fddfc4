"""Which conversation a batch's traces go to, and what the conversation keeps, in one transaction.

Runs on either database. On SQLite (one writer) decide_conversations inserts the new rows in one
statement and resolve_conversations widens the rows read by external id, without the
lock-and-read PostgreSQL needs: these pin that the outcome is the same.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipeline import semconv as sc
from pipeline.ingest.records import SpanRecord
from pipeline.ingest.write.store import store_spans
from pipeline.models import Conversation, Rollup, Span

pytestmark = pytest.mark.django_db

T0 = 1_763_800_000_000_000_000
MS = 1_000_000


def span(trace: str, span_id: str, start_ms: int, end_ms: int, parent: str = "", **attributes: object) -> SpanRecord:
    return SpanRecord(trace, span_id, "invoke_agent" if not parent else "chat gpt-4o", T0 + start_ms * MS,
                      T0 + end_ms * MS, parent_span_id=parent,
                      attributes={"gen_ai.operation.name": "invoke_agent" if not parent else "chat", **attributes})


def at(ms: int) -> datetime:
    return datetime.fromtimestamp((T0 + ms * MS) / 1e9, tz=UTC)


def conversations_in_rollups() -> int:
    return sum(Rollup.objects.filter(kind="conversation", grain="d").values_list("calls", flat=True))


def test_a_batch_widens_a_stored_conversation_and_creates_new_ones_once():
    store_spans([span("1" * 32, "1" * 16, 100, 200, **{sc.CONVERSATION_ID: "stored",
                                                       sc.CONVERSATION_TITLE: "The first title"})])
    stored_id = Conversation.objects.get().id

    result = store_spans([
        span("2" * 32, "2" * 16, 50, 300, **{sc.CONVERSATION_ID: "stored", sc.CONVERSATION_TITLE: "A later title",
                                            "gen_ai.agent.name": "planner"}),
        span("3" * 32, "3" * 16, 500, 900, **{sc.CONVERSATION_ID: "new"}),
        span("4" * 32, "4" * 16, 400, 600, **{sc.CONVERSATION_ID: "new"}),
        span("5" * 32, "5" * 16, 700, 800),  # names none: a placeholder named after its trace
    ])

    by_external = {c.external_id: c for c in Conversation.objects.all()}
    assert sorted(by_external) == ["5" * 32, "new", "stored"]
    stored, new = by_external["stored"], by_external["new"]
    assert stored.id == stored_id
    assert (stored.started_at, stored.last_activity_at) == (at(50), at(300))
    assert (stored.title, stored.title_explicit, stored.agent_name) == ("The first title", True, "planner")
    assert (new.started_at, new.last_activity_at, new.round_count) == (at(400), at(900), 2)
    assert result.changes["new_conversation_ids"] == sorted([new.id, by_external["5" * 32].id])
    assert sorted(result.changes["conversation_ids"]) == sorted(c.id for c in by_external.values())
    assert conversations_in_rollups() == 3


def test_a_placeholder_is_folded_into_a_conversation_the_same_batch_creates():
    trace = "6" * 32
    store_spans([span(trace, f"{i:016x}", 10 * i, 10 * i + 5, parent="a" * 16, **{"gen_ai.request.model": "gpt-4o"})
                 for i in range(1, 4)])
    assert list(Conversation.objects.values_list("external_id", flat=True)) == [trace]

    result = store_spans([span(trace, "a" * 16, 5, 100, **{sc.CONVERSATION_ID: "named"}),
                          span("7" * 32, "7" * 16, 0, 50, **{sc.CONVERSATION_ID: "named"})])

    conversation = Conversation.objects.get()
    assert conversation.external_id == "named"
    assert result.changes["new_conversation_ids"] == [conversation.id]
    assert (conversation.started_at, conversation.last_activity_at) == (at(0), at(100))
    assert (conversation.round_count, conversation.llm_call_count) == (2, 3)
    assert Span.objects.filter(conversation=conversation).count() == 5
    assert conversations_in_rollups() == 1  # the placeholder folded in leaves no count behind
