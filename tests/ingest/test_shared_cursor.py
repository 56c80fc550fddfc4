"""The ingest transaction's statements share one cursor (pipeline.ingest.write.sql.shared_cursor);
outside such a block each statement has its own, as before."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
from django.db import DEFAULT_DB_ALIAS, Error, connection, connections
from django.test.utils import CaptureQueriesContext

from pipeline.ingest.write import sql
from pipeline.ingest.write.store import store_spans
from pipeline.models import Span
from tests.ingest.test_precount import OBSERVATIONS, _chat, _tool

pytestmark = pytest.mark.django_db


def test_statements_inside_the_block_share_its_cursor_and_outside_do_not():
    with sql.cursor() as first, sql.cursor() as second:
        assert first is not second
    with sql.shared_cursor():
        with sql.cursor() as first, sql.cursor() as second:
            assert first is second
        with sql.shared_cursor(), sql.cursor() as nested:  # a block inside a block keeps the outer one's
            assert nested is first
        assert sql.fetch("SELECT %s, %s", [1, "two"]) == [(1, "two")]
        assert sql.fetch("SELECT %s", [3]) == [(3,)]  # the previous statement's rows are not mixed in
    with sql.cursor() as after:
        assert after is not first


def test_a_shared_cursor_is_closed_with_its_block_even_when_the_block_fails():
    with pytest.raises(ZeroDivisionError), sql.shared_cursor():
        with sql.cursor() as shared:
            pass
        1 / 0
    with sql.cursor() as after:
        assert after is not shared
    with pytest.raises(Error):  # closed: sqlite3's ProgrammingError, psycopg's InterfaceError
        shared.execute("SELECT 1")


def test_an_ingest_transaction_opens_a_cursor_for_few_of_its_statements_and_logs_each(monkeypatch):
    """The same batch stored with and without the shared cursor: Django's query log (what
    assertNumQueries counts) sees as many statements either way, and far fewer cursors are opened
    with it (the rest are the ORM's own, the rollups' and, on PostgreSQL, the server-bound cursors
    of pipeline.ingest.write.sql.executemany). Cursors are counted as Django wraps them, in a run
    without the query log (which wraps them otherwise)."""
    backend = type(connections[DEFAULT_DB_ALIAS])
    real = backend.make_cursor
    opened: list[object] = []

    def counting(self, cursor):
        opened.append(cursor)
        return real(self, cursor)

    monkeypatch.setattr(backend, "make_cursor", counting)

    def store(trace: str) -> None:
        store_spans([_chat(trace, "00000000000000c1", 1, "gpt-4o", requested=["call_1"]),
                     _tool(trace, "00000000000000d1", 3, OBSERVATIONS["short"], "call_1")])

    def stored(statements_trace: str, cursors_trace: str) -> tuple[int, int]:
        with CaptureQueriesContext(connection) as queries:
            store(statements_trace)
        opened.clear()
        store(cursors_trace)
        return len(queries.captured_queries), len(opened)

    store("7" * 32)  # the buckets' rollup rows created, so the runs below write alike
    shared_statements, shared_cursors = stored("9" * 32, "a" * 32)
    monkeypatch.setattr(sql, "shared_cursor", nullcontext)
    own_statements, own_cursors = stored("8" * 32, "b" * 32)
    assert Span.objects.count() == 10
    assert shared_statements == own_statements > 10
    assert own_cursors >= own_statements - 1  # without it, (nearly) one cursor per statement
    assert shared_cursors < own_cursors / 2
