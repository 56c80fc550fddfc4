"""Two ingest transactions on one conversation or one trace at once, on PostgreSQL.

One request's transaction is held open after it stored its spans; another request for the same
conversation (or the same trace) runs meanwhile and, once it waits on a lock (or has finished,
when nothing made it wait), the first commits. SQLite runs one writer at a time (BEGIN
IMMEDIATE), so there the second could not even start: these run on CI's PostgreSQL pass.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from django.db import connection, connections, transaction

from pipeline import semconv as sc
from pipeline.ingest.records import SpanRecord
from pipeline.ingest.write.store import store_spans
from pipeline.models import Conversation, Rollup, Span

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not os.environ.get("DATABASE_URL", "").startswith("postgres"),
        reason="needs a PostgreSQL DATABASE_URL: SQLite has one writer, so these transactions cannot overlap",
    ),
]

T0 = 1_763_800_000_000_000_000
MS = 1_000_000
TRACE = "6bf92f3577b34da6a3ce929d0e0e4736"


def span(trace: str, span_id: str, start_ms: int, end_ms: int, parent: str = "", **attributes: object) -> SpanRecord:
    return SpanRecord(trace, span_id, "invoke_agent" if not parent else "chat gpt-4o", T0 + start_ms * MS,
                      T0 + end_ms * MS, parent_span_id=parent,
                      attributes={"gen_ai.operation.name": "invoke_agent" if not parent else "chat", **attributes})


class Held:
    """store_spans(records) in a thread whose transaction stays open until `commit()`."""

    def __init__(self, records: list[SpanRecord]) -> None:
        self._records = records
        self._stored, self._release = threading.Event(), threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run)
        self._thread.start()
        assert self._stored.wait(30), "the held transaction did not store its spans"
        if self.error:
            raise self.error

    def _run(self) -> None:
        try:
            with transaction.atomic():
                store_spans(self._records)
                self._stored.set()
                self._release.wait(30)
        except BaseException as error:  # reported to the test
            self.error = error
            self._stored.set()
        finally:
            connections.close_all()

    def commit(self) -> None:
        self._release.set()
        self._thread.join(30)
        if self.error:
            raise self.error


def run_until_it_waits(work: Callable[[], object]) -> threading.Thread:
    """Start `work` in a thread; return once it has finished or waits on a database lock."""
    done = threading.Event()
    backend: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                backend.append(cursor.fetchone()[0])
            work()
        except BaseException as error:
            errors.append(error)
        finally:
            connections.close_all()
            done.set()

    thread = threading.Thread(target=run)
    thread.start()
    thread.errors = errors  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30
    while not done.is_set() and time.monotonic() < deadline:
        if backend:
            with connection.cursor() as cursor:
                cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [backend[0]])
                row = cursor.fetchone()
            if row and row[0] == "Lock":
                return thread
        time.sleep(0.02)
    assert done.is_set(), "the concurrent request neither finished nor waited on a lock"
    return thread


def finish(thread: threading.Thread) -> None:
    thread.join(30)
    assert not thread.is_alive()
    if thread.errors:  # type: ignore[attr-defined]
        raise thread.errors[0]  # type: ignore[attr-defined]


def at(ms: int) -> datetime:
    return datetime.fromtimestamp((T0 + ms * MS) / 1e9, tz=UTC)


def conversations_in_rollups() -> int:
    return sum(Rollup.objects.filter(kind="conversation", grain="d").values_list("calls", flat=True))


def test_concurrent_requests_for_one_conversation_only_widen_its_times_and_the_first_title_wins():
    store_spans([span("1" * 32, "1" * 16, 0, 10, **{sc.CONVERSATION_ID: "widened"})])
    held = Held([span("2" * 32, "2" * 16, 100, 1000, **{sc.CONVERSATION_ID: "widened",
                                                           sc.CONVERSATION_TITLE: "The first title"})])
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
    held = Held([span("4" * 32, "4" * 16, 0, 100, **{sc.CONVERSATION_ID: "fresh"})])
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
    held = Held(first if isinstance(first, list) else [first])
    other = run_until_it_waits(lambda: store_spans(second if isinstance(second, list) else [second]))
    held.commit()
    finish(other)

    assert list(Conversation.objects.values_list("external_id", flat=True)) == ["named"]
    assert Span.objects.filter(trace_id=TRACE, conversation__external_id="named").count() == 4
    conversation = Conversation.objects.get()
    assert (conversation.round_count, conversation.llm_call_count) == (1, 3)
    assert conversations_in_rollups() == 1  # a placeholder folded in leaves no count behind
