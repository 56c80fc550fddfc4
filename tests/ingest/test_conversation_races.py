"""Two ingest transactions on one conversation or one trace at once, on PostgreSQL
(tests.concurrency): one request's transaction is held open after it stored its spans while
another request for the same conversation (or the same trace) runs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipeline import semconv as sc
from pipeline.ingest.records import SpanRecord
from pipeline.ingest.write.store import store_spans
from pipeline.models import Conversation, Rollup, Span
from tests.concurrency import Held, finish, needs_postgres, run_until_it_waits

pytestmark = [pytest.mark.django_db(transaction=True), needs_postgres]

T0 = 1_763_800_000_000_000_000
MS = 1_000_000
TRACE = "6bf92f3577b34da6a3ce929d0e0e4736"


def span(trace: str, span_id: str, start_ms: int, end_ms: int, parent: str = "", **attributes: object) -> SpanRecord:
    return SpanRecord(trace, span_id, "invoke_agent" if not parent else "chat gpt-4o", T0 + start_ms * MS,
                      T0 + end_ms * MS, parent_span_id=parent,
                      attributes={"gen_ai.operation.name": "invoke_agent" if not parent else "chat", **attributes})


def at(ms: int) -> datetime:
    return datetime.fromtimestamp((T0 + ms * MS) / 1e9, tz=UTC)


def conversations_in_rollups() -> int:
    return sum(Rollup.objects.filter(kind="conversation", grain="d").values_list("calls", flat=True))


def test_concurrent_requests_for_one_conversation_only_widen_its_times_and_the_first_title_wins():
    store_spans([span("1" * 32, "1" * 16, 0, 10, **{sc.CONVERSATION_ID: "widened"})])
    held = Held(lambda: store_spans([span("2" * 32, "2" * 16, 100, 1000, **{
        sc.CONVERSATION_ID: "widened", sc.CONVERSATION_TITLE: "The first title"})]))
    other = run_until_it_waits(lambda: store_spans([span("3" * 32, "3" * 16, 200, 500, **{
        sc.CONVERSATION_ID: "widened", sc.CONVERSATION_TITLE: "A later title"})]))
    held.commit()
    finish(other)

    conversation = Conversation.objects.get()
    assert (conversation.started_at, conversation.last_activity_at) == (at(0), at(1000))
    assert (conversation.title, conversation.title_explicit) == ("The first title", True)
    assert conversation.round_count == 3
    assert conversations_in_rollups() == 1


def test_two_requests_creating_one_new_conversation_count_it_once():
    held = Held(lambda: store_spans([span("4" * 32, "4" * 16, 0, 100, **{sc.CONVERSATION_ID: "fresh"})]))
    # Its INSERT of the same conversation waits on the held one's uncommitted row, then skips it.
    other = run_until_it_waits(lambda: store_spans([span("5" * 32, "5" * 16, 50, 300, **{sc.CONVERSATION_ID: "fresh"})]))
    held.commit()
    finish(other)

    conversation = Conversation.objects.get()
    assert (conversation.started_at, conversation.last_activity_at, conversation.round_count) == (at(0), at(300), 2)
    assert conversations_in_rollups() == 1


@pytest.mark.parametrize("root_first", [True, False], ids=["root-first", "children-first"])
def test_a_trace_whose_root_and_children_arrive_in_concurrent_requests_stays_in_one_conversation(root_first):
    root = span(TRACE, "a" * 16, 0, 100, **{sc.CONVERSATION_ID: "named"})
    children = [span(TRACE, f"{i:016x}", 10 * i, 10 * i + 5, parent="a" * 16, **{"gen_ai.request.model": "gpt-4o"})
                for i in range(1, 4)]
    first, second = (root, children) if root_first else (children, root)
    held = Held(lambda: store_spans(first if isinstance(first, list) else [first]))
    other = run_until_it_waits(lambda: store_spans(second if isinstance(second, list) else [second]))
    held.commit()
    finish(other)

    assert list(Conversation.objects.values_list("external_id", flat=True)) == ["named"]
    assert Span.objects.filter(trace_id=TRACE, conversation__external_id="named").count() == 4
    conversation = Conversation.objects.get()
    assert (conversation.round_count, conversation.llm_call_count) == (1, 3)
    assert conversations_in_rollups() == 1  # a placeholder folded in leaves no count behind
