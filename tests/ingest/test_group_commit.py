"""Group commit: requests queued on the writer behind another share its transaction, and each still
gets the result it would have had alone."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from django.db import IntegrityError, OperationalError, connection

from pipeline.ingest.decode.sdk import span_record
from pipeline.ingest.records import SpanRecord
from pipeline.ingest.service import StoreChunk
from pipeline.ingest.write.store import prepare_spans, store_spans
from pipeline.ingest.write.writer_threads import JoinableWork, WriterPool
from pipeline.models import Conversation, Rollup, Round, Span
from pipeline.signals import ingest_committed
from tests.agent_traces import record_turns

pytestmark = pytest.mark.django_db(transaction=True)


def by_trace(conversation: str, turns: int) -> list[list[SpanRecord]]:
    """A conversation's turns recorded with the OTel SDK, one request per trace."""
    traces: dict[str, list[SpanRecord]] = {}
    for span in record_turns(conversation, turns=turns):
        record = span_record(span)
        traces.setdefault(record.trace_id, []).append(record)
    return list(traces.values())


def chunk(records: list[SpanRecord], source: str = "otlp") -> StoreChunk:
    return StoreChunk(prepare_spans(records), source, None)


@pytest.fixture
def commits() -> Iterator[list[dict]]:
    """The changes of every ingest transaction committed while the test runs."""
    seen: list[dict] = []

    def receiver(sender, changes, **kwargs):
        if sender is store_spans:  # not the token or finding counts written in the background
            seen.append(changes)

    ingest_committed.connect(receiver, dispatch_uid="tests.group_commit")
    yield seen
    ingest_committed.disconnect(dispatch_uid="tests.group_commit")


@pytest.fixture
def pool(settled) -> Iterator[WriterPool]:
    """A writer of the test's own, which joins requests as the server's does on SQLite."""
    pool = WriterPool(1, group_commit=True)
    yield pool
    pool.shutdown()


def queued_behind_a_busy_writer(pool: WriterPool, work: list) -> list:
    """Submit `work` while the writer is busy, so all of it waits in the queue; then let it run."""
    busy, go = threading.Event(), threading.Event()
    pool.submit(lambda: (busy.set(), go.wait(10)))
    assert busy.wait(10)
    futures = [pool.submit(unit) for unit in work]
    go.set()
    return [future.result(timeout=30) for future in futures]


def stored() -> dict[str, object]:
    """What the dashboard reads, by external ids (database ids depend on the order of inserts)."""
    return {
        "spans": Span.objects.count(),
        "conversations": sorted(Conversation.objects.values_list(
            "external_id", "round_count", "llm_call_count", "tool_call_count", "input_tokens", "output_tokens",
            "message_count")),
        "rounds": sorted(Round.objects.values_list(
            "conversation__external_id", "key", "llm_call_count", "tool_call_count", "input_tokens")),
        "rollups": sorted((*row, rounded(sums)) for *row, sums in Rollup.objects.values_list(
            "kind", "grain", "bucket_start", "name", "calls", "errors", "latency", "sums")),
    }


def rounded(sums: dict[str, object]) -> dict[str, object]:
    """Sums of float durations differ in the last bit with the order they were added in."""
    return {name: round(value, 9) if isinstance(value, float) else value for name, value in sums.items()}


def test_requests_queued_behind_a_busy_writer_share_one_transaction_and_store_what_they_would_alone(
        pool, commits):
    requests = [*by_trace("conv-group-a", turns=2), *by_trace("conv-group-b", turns=1)]
    assert len(requests) == 3

    results = queued_behind_a_busy_writer(pool, [chunk(r) for r in requests])

    assert [(r.accepted, r.duplicates) for r in results] == [(len(r), 0) for r in requests]
    assert len(commits) == 1  # one transaction, announced once, with every request's spans
    assert commits[0]["span_count"] == sum(map(len, requests))
    together = stored()

    Conversation.objects.all().delete()
    Span.objects.all().delete()
    Rollup.objects.all().delete()
    commits.clear()
    for request in requests:  # the same requests, one transaction each
        assert pool.submit(chunk(request)).result(timeout=30).accepted == len(request)
    assert len(commits) == len(requests)
    assert stored() == together


def test_a_request_joining_a_group_counts_its_already_stored_spans_as_duplicates(pool, commits):
    first, second = by_trace("conv-group-dup", turns=2)
    other = by_trace("conv-group-other", turns=1)[0]
    assert pool.submit(chunk(first[:2])).result(timeout=30).accepted == 2
    commits.clear()

    results = queued_behind_a_busy_writer(pool, [chunk(other), chunk(first), chunk(second)])

    assert len(commits) == 1
    assert [(r.accepted, r.duplicates) for r in results] == [
        (len(other), 0), (len(first) - 2, 2), (len(second), 0)]
    assert Span.objects.count() == len(first) + len(second) + len(other)


def test_a_resent_request_does_not_join_its_original_and_finds_it_stored(pool, commits, caplog):
    request = by_trace("conv-group-resend", turns=1)[0]

    with caplog.at_level("INFO", logger="pipeline.ingest.service"):
        original, resent = queued_behind_a_busy_writer(pool, [chunk(request), chunk(list(request))])

    assert "group commit failed" not in caplog.text  # not joined, and so not stored one by one after a failure

    assert (original.accepted, original.duplicates) == (len(request), 0)
    assert (resent.accepted, resent.duplicates) == (0, len(request))
    assert len(commits) == 2
    assert Span.objects.count() == len(request)


def test_work_of_another_kind_keeps_its_place_in_the_queue(pool, commits):
    first, later = by_trace("conv-group-order", turns=2)

    _, spans_seen_between, _ = queued_behind_a_busy_writer(pool, [chunk(first), Span.objects.count, chunk(later)])

    assert spans_seen_between == len(first)  # `later` was not taken past the count
    assert [c["span_count"] for c in commits] == [len(first), len(later)]


def test_requests_beyond_the_chunk_size_logs_or_another_source_start_a_new_group(settings):
    a, b, c = by_trace("conv-group-fits", turns=3)
    assert chunk(b).fits([chunk(a)])
    assert not chunk(b, source="rest").fits([chunk(a)])
    assert not StoreChunk(prepare_spans(b), "otlp", [object()]).fits([chunk(a)])
    assert not chunk(b).fits([StoreChunk(prepare_spans(a), "otlp", [object()])])
    assert not chunk(a[:1]).fits([chunk(a)])  # a span in both
    assert not chunk([]).fits([chunk(a)])
    settings.CTXLENS_INGEST_CHUNK_SPANS = len(a) + len(b)
    assert chunk(b).fits([chunk(a)])
    assert not chunk(c).fits([chunk(a), chunk(b)])


def trigger_on(span_id: str, sqlite_body: str, postgresql_raise: str) -> tuple[list[str], list[str]]:
    """SQL that makes inserting the span `span_id` fail as the database would, and SQL that undoes it."""
    if connection.vendor == "sqlite":
        return ([f"CREATE TRIGGER refuse_span BEFORE INSERT ON pipeline_span WHEN NEW.span_id = '{span_id}' "
                 f"BEGIN {sqlite_body}; END"], ["DROP TRIGGER refuse_span"])
    return ([
        "CREATE FUNCTION refuse_span() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        f"IF NEW.span_id = '{span_id}' THEN {postgresql_raise}; END IF; RETURN NEW; END $$",
        "CREATE TRIGGER refuse_span BEFORE INSERT ON pipeline_span FOR EACH ROW EXECUTE FUNCTION refuse_span()",
    ], ["DROP TRIGGER refuse_span ON pipeline_span", "DROP FUNCTION refuse_span()"])


def run_sql(statements: list[str]) -> None:
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


def test_a_request_that_fails_the_group_fails_alone_and_the_others_are_stored(pool, commits, caplog):
    good, bad, also_good = by_trace("conv-group-fail", turns=3)
    refuse, allow = trigger_on(bad[-1].span_id, "SELECT RAISE(ABORT, 'refused by the test')",
                               "RAISE EXCEPTION 'refused by the test' USING ERRCODE = '23514'")
    run_sql(refuse)
    try:
        busy, go = threading.Event(), threading.Event()
        pool.submit(lambda: (busy.set(), go.wait(10)))
        assert busy.wait(10)
        futures = [pool.submit(chunk(request)) for request in (good, bad, also_good)]
        with caplog.at_level("INFO", logger="pipeline.ingest.service"):
            go.set()
            first = futures[0].result(timeout=30)
            with pytest.raises(IntegrityError, match="refused by the test"):
                futures[1].result(timeout=30)
            third = futures[2].result(timeout=30)
    finally:
        run_sql(allow)
    assert caplog.text.count("group commit failed") == 1
    assert [(first.accepted, first.duplicates), (third.accepted, third.duplicates)] == [
        (len(good), 0), (len(also_good), 0)]  # the failed group left their results as they were
    assert [c["span_count"] for c in commits] == [len(good), len(also_good)]
    assert set(Span.objects.values_list("trace_id", flat=True)) == {good[0].trace_id, also_good[0].trace_id}


def test_a_group_the_database_refuses_to_store_fails_every_request_at_once(pool, commits, caplog):
    one, other = by_trace("conv-group-unavailable", turns=2)
    refuse, allow = trigger_on(other[-1].span_id, "INSERT INTO no_such_table VALUES (1)",
                               "RAISE EXCEPTION 'unavailable in the test' USING ERRCODE = '57014'")
    run_sql(refuse)
    try:
        with caplog.at_level("INFO", logger="pipeline.ingest.service"):
            busy, go = threading.Event(), threading.Event()
            pool.submit(lambda: (busy.set(), go.wait(10)))
            assert busy.wait(10)
            futures = [pool.submit(chunk(request)) for request in (one, other)]
            go.set()
            errors = [future.exception(timeout=30) for future in futures]
    finally:
        run_sql(allow)
    assert all(isinstance(error, OperationalError) for error in errors), errors
    assert "group commit failed" not in caplog.text  # a database problem is not retried request by request
    assert commits == [] and Span.objects.count() == 0


class Unjoinable(JoinableWork):
    """A unit whose `fits` fails."""

    def __call__(self) -> str:
        return "ran alone"

    def fits(self, group: list) -> bool:
        raise ValueError("fits failed")

    @classmethod
    def run_together(cls, group: list) -> list:
        raise AssertionError("never joined")


def test_a_unit_that_cannot_tell_whether_it_joins_runs_alone_and_the_writer_goes_on(pool):
    assert queued_behind_a_busy_writer(pool, [Unjoinable(), Unjoinable(), Span.objects.count]) == [
        "ran alone", "ran alone", 0]


def test_a_writer_stopped_while_a_group_forms_stores_the_group_and_stops(settled):
    pool = WriterPool(1, group_commit=True)
    request = by_trace("conv-group-stop", turns=1)[0]
    busy, go = threading.Event(), threading.Event()
    pool.submit(lambda: (busy.set(), go.wait(10)))
    assert busy.wait(10)
    stored = pool.submit(chunk(request))
    pool.shutdown(wait=False)  # the stop is queued right behind the unit: taken while its group forms
    go.set()
    assert stored.result(timeout=30).accepted == len(request)
    thread = pool._threads[0]
    thread.join(timeout=30)
    assert not thread.is_alive()
