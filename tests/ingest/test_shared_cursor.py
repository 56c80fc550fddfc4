"""The ingest transaction's statements share one cursor (pipeline.ingest.write.sql.shared_cursor);
outside such a block each statement has its own, as before."""

from __future__ import annotations

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


def test_an_ingest_transaction_sends_every_statement_on_one_cursor_and_all_are_logged(monkeypatch):
    """Django's query log (what assertNumQueries counts) still sees each statement."""
    spans = [_chat("9" * 32, "00000000000000c1", 1, "gpt-4o", requested=["call_1"]),
             _tool("9" * 32, "00000000000000d1", 3, OBSERVATIONS["short"], "call_1")]
    opened = []
    backend = type(connections[DEFAULT_DB_ALIAS])
    real = backend.create_cursor

    def counting(self, name=None):
        opened.append(name)
        return real(self, name)

    monkeypatch.setattr(backend, "create_cursor", counting)
    with CaptureQueriesContext(connection) as queries:
        store_spans(spans)
    assert Span.objects.count() == 2
    assert len(queries.captured_queries) > 10
    assert len(opened) < len(queries.captured_queries) / 2
