"""The ingest writer threads hold a database connection only while there is work."""

from __future__ import annotations

import time

import pytest
from django.db import connections

from pipeline.ingest.write.store import store_spans
from pipeline.ingest.write.writer_threads import WriterPool, stop_writer, writer
from pipeline.models import Span
from pipeline.ingest.decode.sdk import span_record
from tests.agent_traces import record_turns

pytestmark = pytest.mark.django_db(transaction=True)


def _query_and_report() -> tuple[object, bool]:
    """On a writer thread: use the database; its connection wrapper and whether it is open."""
    Span.objects.count()
    wrapper = connections["default"]
    return wrapper, wrapper.connection is not None


def test_an_idle_writer_thread_gives_its_connection_back():
    pool = WriterPool(1, idle_seconds=0.05)
    try:
        wrapper, was_open = pool.submit(_query_and_report).result()
        assert was_open
        deadline = time.monotonic() + 10
        while wrapper.connection is not None and time.monotonic() < deadline:
            time.sleep(0.01)  # polls a real timer in another thread: time_machine cannot move it
        assert wrapper.connection is None
        assert pool.submit(_query_and_report).result()[1]  # and opens one again for the next work
    finally:
        pool.shutdown()


def test_stopping_the_writer_finishes_its_work_and_closes_its_connections():
    records = [span_record(s) for s in record_turns("conv-writer-stop")]
    stored = writer().submit(store_spans, records)  # queued work, and the token work it schedules
    wrappers = [writer().submit(_query_and_report) for _ in range(3)]
    stop_writer()
    assert stored.result().accepted == len(records)
    assert all(future.result()[0].connection is None for future in wrappers)
    assert Span.objects.count() == len(records)
    assert writer().submit(Span.objects.count).result() == len(records)  # a new pool starts on demand
    stop_writer()
