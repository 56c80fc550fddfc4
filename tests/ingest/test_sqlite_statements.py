"""The SQLite backend ctxlens runs on (config.sqlite3): Django's, with each statement's `%s` → `?`
conversion remembered and lists of rows handed to executemany as they are. What a statement
does must not change: literal percent signs, named parameters, generators of rows, long
statements and Django's error classes all behave as on Django's own backend."""

from __future__ import annotations

import uuid

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.backends.sqlite3.base import SQLiteCursorWrapper as DjangoCursor

from config.sqlite3.base import MAX_REMEMBERED, SQLiteCursorWrapper

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "sqlite", reason="the SQLite backend's own behaviour"),
]


@pytest.fixture
def scratch_table():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE scratch (k TEXT PRIMARY KEY, v TEXT)")
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE scratch")


def _rows() -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT k, v FROM scratch ORDER BY k")
        return cursor.fetchall()


def test_the_configured_sqlite_database_runs_on_the_remembering_backend():
    with connection.cursor() as cursor:
        assert type(cursor.cursor) is SQLiteCursorWrapper
    assert connection.settings_dict["ENGINE"] == "config.sqlite3"


@pytest.mark.parametrize("query", [
    "SELECT %s, '%%s', '100%%', %s",
    "SELECT %s, '%%%%s' || %s",  # an escaped escape
    "SELECT %s || ' %% ' || %s",
])
def test_a_statement_converts_as_djangos_cursor_converts_it_every_time(query):
    with connection.cursor() as cursor:
        ours = [cursor.execute(query, ["a", "b"]).fetchall() for _ in range(3)]
    raw = connection.connection.cursor(factory=DjangoCursor)
    try:
        theirs = raw.execute(query, ["a", "b"]).fetchall()
    finally:
        raw.close()
    assert ours == [theirs] * 3


@pytest.fixture
def conversions(monkeypatch):
    """The statements the backend converts (rather than finds converted), from this test only:
    other threads' statements and earlier runs' are not counted."""
    import config.sqlite3.base as backend

    converted: list[str] = []
    convert = backend._qmark

    def counting(query: str) -> str:
        converted.append(query)
        return convert(query)

    monkeypatch.setattr(backend, "_qmark", counting)
    return converted


def test_a_statement_sent_again_is_converted_once(conversions):
    query = f"SELECT %s + %s -- {uuid.uuid4()}"  # a statement no earlier run sent
    with connection.cursor() as cursor:
        for i in range(5):
            cursor.execute(query, [i, 1])
            assert cursor.fetchone() == (i + 1,)
    assert conversions.count(query) == 1


def test_a_long_statement_is_converted_every_time_and_not_remembered(conversions):
    values = list(range(MAX_REMEMBERED // 3))
    query = f"SELECT count(*) FROM (VALUES {', '.join(['(%s)'] * len(values))})"
    assert len(query) > MAX_REMEMBERED
    with connection.cursor() as cursor:
        for _ in range(2):
            cursor.execute(query, values)
            assert cursor.fetchone() == (len(values),)
    assert conversions.count(query) == 2


@pytest.mark.parametrize("rows", [
    lambda: [("a", "1"), ("b", "2%")],
    lambda: (("a", "1"), ("b", "2%")),
    lambda: (row for row in [("a", "1"), ("b", "2%")]),  # a generator goes Django's way
])
def test_executemany_inserts_every_row_however_they_are_given(scratch_table, rows):
    given = rows()
    expected = sorted(given) if isinstance(given, list | tuple) else [("a", "1"), ("b", "2%")]
    with connection.cursor() as cursor:
        cursor.executemany("INSERT INTO scratch (k, v) VALUES (%s, %s)", given)
    assert _rows() == expected


def test_executemany_with_named_parameters(scratch_table):
    with connection.cursor() as cursor:
        cursor.executemany("INSERT INTO scratch (k, v) VALUES (%(k)s, %(v)s)", [{"k": "a", "v": "1"}, {"k": "b", "v": "2"}])
    assert _rows() == [("a", "1"), ("b", "2")]


def test_a_refused_row_raises_djangos_integrity_error_and_writes_nothing(scratch_table):
    """Ingest retries a batch on django.db.IntegrityError (a concurrent writer stored a span first)."""
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.executemany("INSERT INTO scratch (k, v) VALUES (%s, %s)", [("a", "1"), ("a", "2")])
    assert _rows() == []
