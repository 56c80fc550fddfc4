"""The threads that write ingest data: one per process on SQLite, a few on PostgreSQL.

SQLite has one writer at a time, and writers that find the lock taken wait in its busy handler,
which sleeps in steps of up to 100 ms and leaves the lock idle in between; measured here, four
concurrent OTLP requests spent most of their time asleep in BEGIN IMMEDIATE. Queuing every
write of the process — OTLP batches and the deferred token work — on one thread keeps the
single writer busy instead. PostgreSQL takes concurrent writers, so there the pool has several
threads. Other processes still coordinate through the database itself (busy timeout, locks).

A writer thread keeps its connection between units of work (opening one costs ~20 ms on
PostgreSQL here) and closes it after `IDLE_SECONDS` without work, and when the pool stops
(`stop_writer()`, also run at interpreter exit), so an idle process holds no connections and
a test database can be dropped. On SQLite it leaves WAL checkpoints (which fsync) to a
checkpointer thread that runs one every second: measured, the checkpoints SQLite otherwise runs
inside a commit every ~4 MB cost the writer about 7 ms per 100-span batch.

    reply = await sync_to_async(work, thread_sensitive=False, executor=writer())(...)
    result = writer().submit(store_spans, records).result()   # from synchronous code

Group commit (SQLite's one writer): a unit of `JoinableWork` takes along the units of its class
queued right behind it that `fits` admits, and `run_together` runs them in one transaction. Every
SQLite commit writes each page the transaction changed to the WAL, and the pages of the indexes,
conversations, rounds and rollups a request changes are mostly the ones the next request changes
again: on the standard load, transactions of 400 spans cost about a quarter less store CPU per
span than transactions of 100 (`bench/ingest_phases.py --batch 400` against `--batch 100`).
PostgreSQL's several writers commit side by side instead; there it is not measured, so not on.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Executor, Future
from functools import cache
from typing import Any

from django.db import connection
from django.db.backends.signals import connection_created
from django.dispatch import receiver

logger = logging.getLogger(__name__)

POSTGRES_WRITERS = 4
THREAD_PREFIX = "ctxlens-writer"
CHECKPOINT_SECONDS = 1.0
IDLE_SECONDS = 30.0
_STOP = None  # the queue item that ends a writer thread
_NOTHING = object()  # no queue item held over
MAX_JOINED = 16  # units of work one transaction takes at most


class JoinableWork(ABC):
    """A unit of writer work that may share its transaction with others of its class.

    Called alone, it runs by itself. The writer hands a unit and the queued units that `fits`
    admitted after it, in queue order, to `run_together`, which returns one outcome per unit:
    its result, or the exception it failed with.
    """

    @abstractmethod
    def __call__(self) -> Any: ...

    @abstractmethod
    def fits(self, group: list[Any]) -> bool:
        """Whether this unit may join `group` (units of its class, in queue order)."""

    @classmethod
    @abstractmethod
    def run_together(cls, group: list[Any]) -> list[Any]: ...


class WriterPool(Executor):
    """A fixed set of writer threads that give their database connections back when idle."""

    def __init__(self, threads: int, *, idle_seconds: float = IDLE_SECONDS, checkpoints: bool = False,
                 group_commit: bool = False) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._idle_seconds = idle_seconds
        self._group_commit = group_commit
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._threads = [threading.Thread(target=self._work, name=f"{THREAD_PREFIX}_{i}", daemon=True)
                         for i in range(threads)]
        if checkpoints:
            self._threads.append(threading.Thread(target=self._checkpoint, name="ctxlens-checkpointer", daemon=True))
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        with self._lock:
            if self._stopped.is_set():
                raise RuntimeError("the ingest writer has stopped")
            self._queue.put((future, fn, args, kwargs))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Finish what is queued, then stop every thread; each closes its connection."""
        with self._lock:
            if not self._stopped.is_set():
                self._stopped.set()
                for _ in range(len(self._threads)):
                    self._queue.put(_STOP)
        if wait:
            for thread in self._threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _work(self) -> None:
        held = _NOTHING  # an item taken off the queue that did not fit the group before it: next
        try:
            while True:
                item, held = held, _NOTHING
                if item is _NOTHING:
                    try:
                        item = self._queue.get(timeout=self._idle_seconds)
                    except queue.Empty:
                        connection.close()  # idle: give the connection back until there is work again
                        item = self._queue.get()
                if item is _STOP:
                    return
                future, fn, args, kwargs = item
                del item
                if self._group_commit and isinstance(fn, JoinableWork) and not args and not kwargs:
                    group, held = self._take_joining(future, fn)
                    self._run_group(group)
                    del group
                elif future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn(*args, **kwargs))
                    except BaseException as exc:
                        future.set_exception(exc)
                    finally:
                        _release_connection()
                del future, fn, args, kwargs  # drop references to the request before waiting again
        finally:
            connection.close()

    def _take_joining(self, future: Future, first: JoinableWork) -> tuple[list[tuple[Future, Any]], Any]:
        """`first` and the units queued right behind it that join it; the item that stopped the
        taking (it runs next), or _NOTHING. A `fits` that fails ends the taking, not the thread."""
        group = [(future, first)]
        while len(group) < MAX_JOINED:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            try:
                joins = item is not _STOP and type(item[1]) is type(first) and not item[2] and not item[3] \
                    and item[1].fits([unit for _, unit in group])
            except Exception:
                logger.exception("could not tell whether a unit of work joins a group; it runs on its own")
                joins = False
            if not joins:
                return group, item
            group.append((item[0], item[1]))
        return group, _NOTHING

    def _run_group(self, group: list[tuple[Future, Any]]) -> None:
        """Each unit's future gets its own outcome, whatever goes wrong."""
        running = [(future, unit) for future, unit in group if future.set_running_or_notify_cancel()]
        if not running:
            return
        try:
            if len(running) == 1:
                outcomes = [outcome_of(running[0][1])]
            else:
                outcomes = type(running[0][1]).run_together([unit for _, unit in running])
            if len(outcomes) != len(running):
                raise RuntimeError(f"{len(outcomes)} outcomes for {len(running)} units of work")
        except BaseException as exc:
            outcomes = [exc] * len(running)
        finally:
            _release_connection()
        for (future, _), outcome in zip(running, outcomes):
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def _checkpoint(self) -> None:
        try:
            while not self._stopped.wait(CHECKPOINT_SECONDS):
                try:
                    with connection.cursor() as cursor:
                        cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except Exception:  # a busy or closed database: the next round tries again
                    logger.debug("WAL checkpoint skipped", exc_info=True)
                    connection.close()
        finally:
            connection.close()


@cache
def writer() -> WriterPool:
    sqlite = connection.vendor == "sqlite"
    return WriterPool(1 if sqlite else POSTGRES_WRITERS, checkpoints=sqlite, group_commit=sqlite)


def stop_writer() -> None:
    """Stop this process's writer threads once their queued work is done, closing their connections.

    The next `writer()` starts a new pool.
    """
    if writer.cache_info().currsize:
        writer().shutdown()
        writer.cache_clear()


atexit.register(stop_writer)


def outcome_of(work: Callable[[], Any]) -> Any:
    """`work()`, or the exception it raised."""
    try:
        return work()
    except Exception as exc:
        return exc


def _release_connection() -> None:
    """End of a unit of work: keep a healthy connection, drop a broken one (and, except on
    SQLite, one older than CONN_MAX_AGE)."""
    if connection.connection is not None and connection.errors_occurred and not connection.is_usable():
        connection.close()
    elif connection.vendor != "sqlite":
        connection.close_if_unusable_or_obsolete()


_long_lived_prefixes: set[str] = {THREAD_PREFIX}


def keep_connections_on(thread_name_prefix: str) -> None:
    """Threads named so live as long as their pool (the OTLP receivers' workers): they keep their
    database connection across units of work, as the writer threads do."""
    _long_lived_prefixes.add(thread_name_prefix)


@receiver(connection_created)
def _long_lived_thread_keeps_its_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    """A thread of a long-lived pool keeps its connection past CONN_MAX_AGE (0 for request threads,
    which end with their request) until it is idle or broken: opening one costs ~20 ms on
    PostgreSQL."""
    if threading.current_thread().name.startswith(tuple(_long_lived_prefixes)):
        connection.close_at = None


@receiver(connection_created)
def _writer_leaves_checkpoints(sender: Any, connection: Any, **kwargs: Any) -> None:
    if connection.vendor == "sqlite" and threading.current_thread().name.startswith(THREAD_PREFIX):
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_autocheckpoint=0")
