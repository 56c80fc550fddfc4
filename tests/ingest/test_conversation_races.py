"""Two ingest transactions on one conversation or one trace at once, on PostgreSQL
(tests.concurrency): one request's transaction is held open after it stored its spans, or paused
before a chosen statement, while another request for the same conversation (or the same trace)
runs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipeline import semconv as sc
from pipeline.ingest.records import LogRecord, SpanRecord
from pipeline.ingest.write.store import store_spans
from pipeline.models import Conversation, LLMCall, Rollup, Span
from tests.concurrency import Held, PausedAt, deadlocks, finish, needs_postgres, run_until_it_waits

pytestmark = [pytest.mark.django_db(transaction=True), needs_postgres, pytest.mark.usefixtures("settled")]

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


def test_a_request_finishing_an_open_span_locks_its_conversations_in_one_pass_in_id_order():
    """One request finishes a span stored open in the later conversation and adds a turn to the
    earlier one; another adds turns to both. Every writer locks conversations in id order, and
    the first request now locks both before it deletes the open span's rows. (It locked the open
    span's conversation first, then the batch's: the two requests each held one conversation and
    waited for the other, and PostgreSQL aborted one of them.)"""
    store_spans([span("a" * 32, "a" * 16, 0, 10, **{sc.CONVERSATION_ID: "earlier"})])
    running = span("b" * 32, "b" * 16, 100, 0, **{sc.CONVERSATION_ID: "later"})
    running.end_time_unix_nano = 0  # still running: stored open
    store_spans([running])
    earlier, later = Conversation.objects.order_by("pk")
    assert (earlier.external_id, later.external_id) == ("earlier", "later")
    before = deadlocks()

    finishing = PausedAt("DELETE FROM", lambda: store_spans([
        span("b" * 32, "b" * 16, 100, 900, **{sc.CONVERSATION_ID: "later"}),
        span("c" * 32, "c" * 16, 200, 300, **{sc.CONVERSATION_ID: "earlier"})]))
    other = run_until_it_waits(lambda: store_spans([
        span("d" * 32, "d" * 16, 400, 500, **{sc.CONVERSATION_ID: "earlier"}),
        span("e" * 32, "e" * 16, 400, 500, **{sc.CONVERSATION_ID: "later"})]))
    assert other.is_alive()  # waits for a conversation the finishing request holds
    finishing.go_on()
    assert finishing.result().accepted == 2
    finish(other)

    assert deadlocks(finishing.backend, other.backend) == before
    assert Span.objects.get(trace_id="b" * 32).end_time_unix_nano == T0 + 900 * MS
    assert sorted(Conversation.objects.values_list("external_id", "round_count")) == [("earlier", 3), ("later", 2)]


def test_a_request_with_logs_of_a_stored_trace_locks_its_conversation_with_the_others():
    """A request brings the event logs of a call stored in the earlier conversation, whose messages
    it rebuilds, and a turn of the later one; another adds turns to both. (The logs' conversation
    was locked after the call was rebuilt, out of id order: the two requests deadlocked.)"""
    store_spans([span("f" * 32, "1" * 16, 0, 10, **{sc.CONVERSATION_ID: "earlier"}),
                 span("f" * 32, "2" * 16, 1, 5, parent="1" * 16, **{sc.CONVERSATION_ID: "earlier"})])
    store_spans([span("9" * 32, "9" * 16, 100, 200, **{sc.CONVERSATION_ID: "later"})])
    earlier, later = Conversation.objects.order_by("pk")
    assert (earlier.external_id, later.external_id) == ("earlier", "later")
    assert not LLMCall.objects.get(span_id="2" * 16).input_messages
    before = deadlocks()

    logs = [LogRecord("f" * 32, "2" * 16, T0 + 2 * MS, "gen_ai.user.message", {"content": "Weather in Paris?"})]
    with_logs = PausedAt('"pipeline_spanlog"', lambda: store_spans(
        [span("a" * 32, "a" * 16, 300, 400, **{sc.CONVERSATION_ID: "later"})], logs=logs), after=" FOR UPDATE")
    other = run_until_it_waits(lambda: store_spans([
        span("b" * 32, "b" * 16, 500, 600, **{sc.CONVERSATION_ID: "earlier"}),
        span("c" * 32, "c" * 16, 500, 600, **{sc.CONVERSATION_ID: "later"})]))
    assert other.is_alive()  # waits for a conversation the request with logs holds
    with_logs.go_on()
    assert with_logs.result().accepted == 1
    finish(other)

    assert deadlocks(with_logs.backend, other.backend) == before
    assert LLMCall.objects.get(span_id="2" * 16).input_messages  # rebuilt from the logs
    assert sorted(Conversation.objects.values_list("external_id", "round_count")) == [("earlier", 2), ("later", 3)]


def test_a_request_of_logs_alone_locks_the_conversation_of_the_call_it_rebuilds():
    """The call sits in another conversation than its span (an operator moved it): a request of
    its event logs alone locks the call's conversation before rebuilding it."""
    store_spans([span("9" * 32, "9" * 16, 0, 10, **{sc.CONVERSATION_ID: "earlier"})])
    store_spans([span("f" * 32, "1" * 16, 100, 200, **{sc.CONVERSATION_ID: "later"}),
                 span("f" * 32, "2" * 16, 101, 150, parent="1" * 16, **{sc.CONVERSATION_ID: "later"})])
    earlier, later = Conversation.objects.order_by("pk")
    assert (earlier.external_id, later.external_id) == ("earlier", "later")
    LLMCall.objects.filter(span_id="2" * 16).update(conversation=earlier, round=None)  # as the admin leaves it
    before = deadlocks()

    logs = [LogRecord("f" * 32, "2" * 16, T0 + 102 * MS, "gen_ai.user.message", {"content": "Weather in Paris?"})]
    with_logs = PausedAt('"pipeline_spanlog"', lambda: store_spans([], logs=logs), after=" FOR UPDATE")
    other = run_until_it_waits(lambda: store_spans([
        span("b" * 32, "b" * 16, 500, 600, **{sc.CONVERSATION_ID: "earlier"}),
        span("c" * 32, "c" * 16, 500, 600, **{sc.CONVERSATION_ID: "later"})]))
    assert other.is_alive()  # waits for the conversation the request of logs holds
    with_logs.go_on()
    with_logs.result()
    finish(other)

    assert deadlocks(with_logs.backend, other.backend) == before
    assert LLMCall.objects.get(span_id="2" * 16).input_messages  # rebuilt from the logs
