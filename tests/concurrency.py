"""Two transactions at once on PostgreSQL: one held open after its work (`Held`) or paused before
a chosen statement (`PausedAt`), another run until it waits on a lock (or has finished, when
nothing made it wait), then the first goes on; `deadlocks` counts what PostgreSQL had to abort.

SQLite runs one writer at a time (BEGIN IMMEDIATE), so there the second could not even start:
tests using these run on CI's PostgreSQL pass.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection, connections, transaction

needs_postgres = pytest.mark.skipif(
    not os.environ.get("DATABASE_URL", "").startswith("postgres"),
    reason="needs a PostgreSQL DATABASE_URL: SQLite has one writer, so these transactions cannot overlap",
)


class Held:
    """`work()` in a thread whose transaction stays open until `commit()`."""

    def __init__(self, work: Callable[[], object]) -> None:
        self._work = work
        self._worked, self._release = threading.Event(), threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run)
        self._thread.start()
        assert self._worked.wait(30), "the held transaction did not finish its work"
        if self.error:
            raise self.error

    def _run(self) -> None:
        try:
            with transaction.atomic():
                self._work()
                self._worked.set()
                self._release.wait(30)
        except BaseException as error:  # reported to the test
            self.error = error
            self._worked.set()
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
    thread.backend = backend  # type: ignore[attr-defined]  # its connection's backend pid, once it has one
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


class PausedAt:
    """`work()` in a thread whose connection stops just before its first statement containing
    `fragment` (once one containing `after` has run), until `go_on()`; `result()` is what work
    returned (its error raised)."""

    def __init__(self, fragment: str, work: Callable[[], object], after: str = "") -> None:
        self._reached, self._go_on = threading.Event(), threading.Event()
        seen = [not after]

        def paused(execute: Callable, statement: str, params: object, many: bool, context: dict) -> object:
            if seen[0] and fragment in statement and not self._reached.is_set():
                self._reached.set()
                assert self._go_on.wait(30)
            seen[0] = seen[0] or after in statement
            return execute(statement, params, many, context)

        self.backend: list[int] = []  # its connection's backend pid

        def run() -> object:
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_backend_pid()")
                    self.backend.append(cursor.fetchone()[0])
                with connection.execute_wrapper(paused):
                    return work()
            finally:
                connections.close_all()

        self._pool = ThreadPoolExecutor(1)
        self._future = self._pool.submit(run)
        assert self._reached.wait(30), f"the work never ran a statement with {fragment!r}"

    def go_on(self) -> None:
        self._go_on.set()

    def result(self) -> object:
        try:
            return self._future.result(30)
        finally:
            self._pool.shutdown()


def deadlocks(*backends: list[int]) -> int:
    """Deadlocks PostgreSQL has ended in this database, once the connections of `backends` (pids,
    closed by now) are gone: a backend reports its statistics when it exits at the latest."""
    with connection.cursor() as cursor:
        pids = [pid for pids in backends for pid in pids]
        deadline = time.monotonic() + 10
        while pids and time.monotonic() < deadline:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids])
            if cursor.fetchone()[0] == 0:
                break
            time.sleep(0.05)
        else:
            assert not pids, "the connections that raced did not close"
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]
