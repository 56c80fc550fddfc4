"""The test suite's own teardown: what it does when a served uvicorn still reads in the background."""

from __future__ import annotations

import re
import threading
import time

import pytest
from django.core.management import call_command
from django.core.management.color import no_style
from django.core.management.sql import sql_flush
from django.db import connection, transaction

from pipeline.models import Conversation
from tests.factories import make_conversation

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql",
                                reason="needs a PostgreSQL DATABASE_URL: SQLite's flush deletes under one write lock")


def _fetch(query: str, params: list | None = None) -> object:
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchone()[0]


def _deadlocks_reaching(count: int) -> int:
    """This database's deadlock count once it reaches `count` (10 s at most): a backend hands its
    statistics over when it is next idle, at most once a second."""
    _fetch("SELECT pg_stat_force_next_flush()")
    deadline = time.monotonic() + 10
    while True:
        _fetch("SELECT pg_stat_clear_snapshot()")
        seen = _fetch("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        if seen >= count or time.monotonic() > deadline:
            return seen
        time.sleep(0.1)


def test_the_flush_after_a_test_is_tried_again_when_a_background_read_deadlocks_it(transactional_db):
    """A read that holds the last table the flush's TRUNCATE locks and then wants the first, as a
    server's background run reading two tables can: the TRUNCATE, waiting first, is the one
    PostgreSQL aborts. The flush starts again once the read is done, and empties every table."""
    make_conversation("left over")
    truncate = sql_flush(no_style(), connection)[0]  # the statement the flush runs, its tables in locking order
    tables = re.findall(r'"([^"]+)"', truncate)
    flushing = _fetch("SELECT pg_backend_pid()")
    before = _deadlocks_reaching(0)
    read_failed: list[BaseException] = []
    holding = threading.Event()

    def background_read() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f'SELECT 1 FROM "{tables[-1]}" LIMIT 1')
                holding.set()
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:  # until the TRUNCATE waits for this very read
                    cursor.execute("SELECT pg_backend_pid() = ANY(pg_blocking_pids(%s))", [flushing])
                    if cursor.fetchone()[0]:
                        break
                    time.sleep(0.02)
                else:
                    raise AssertionError("the TRUNCATE never waited for this read")
                cursor.execute(f'SELECT 1 FROM "{tables[0]}" LIMIT 1')  # waits for the TRUNCATE: a cycle
        except BaseException as error:  # the test fails on it: the flush, not the read, was to give way
            read_failed.append(error)
        finally:
            connection.close()

    reader = threading.Thread(target=background_read)
    reader.start()
    try:
        assert holding.wait(10)
        call_command("flush", verbosity=0, interactive=False)
    finally:
        reader.join(40)

    assert not reader.is_alive() and read_failed == []
    assert _deadlocks_reaching(before + 1) == before + 1  # the case this test is about happened
    assert not Conversation.objects.exists()
