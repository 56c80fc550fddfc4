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


def _deadlocks() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def test_the_flush_after_a_test_is_tried_again_when_a_background_read_deadlocks_it(transactional_db):
    """A read that holds the last table the flush's TRUNCATE locks and then wants the first, as a
    server's background run reading two tables can: the TRUNCATE, waiting first, is the one
    PostgreSQL aborts. The flush starts again once the read is done, and empties every table."""
    make_conversation("left over")
    truncate = sql_flush(no_style(), connection)[0]  # the statement the flush runs, its tables in locking order
    tables = re.findall(r'"([^"]+)"', truncate)
    before, read_failed, holding = _deadlocks(), [], threading.Event()

    def background_read() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f'SELECT 1 FROM "{tables[-1]}" LIMIT 1')
                holding.set()
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:  # until the TRUNCATE waits for this read's table
                    cursor.execute("SELECT pg_stat_clear_snapshot()")  # else the transaction's first view, again
                    cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                   "AND query LIKE 'TRUNCATE%%'")
                    if cursor.fetchone()[0]:
                        break
                    time.sleep(0.02)
                cursor.execute(f'SELECT 1 FROM "{tables[0]}" LIMIT 1')  # waits for the TRUNCATE: a cycle
        except Exception as error:  # the test fails on it: the flush, not the read, was to give way
            read_failed.append(error)
        finally:
            connection.close()

    reader = threading.Thread(target=background_read)
    reader.start()
    assert holding.wait(10)
    call_command("flush", verbosity=0, interactive=False)
    reader.join(30)

    assert not reader.is_alive() and read_failed == []
    assert _deadlocks() == before + 1  # the case this test is about happened
    assert not Conversation.objects.exists()
