"""Artifact cleanup without cron: the server runs `cleanup_artifacts()` itself, at most once per
CTXLENS_ARTIFACT_CLEANUP_INTERVAL_S (default 3600 s, the seeds' cleanup interval; 0 turns it off),
on a background thread, never on a request's path.

Not the seeds' free-running daemon thread (DESIGN.md: no free-running daemon threads): the end of
any request (`request_finished`: a page, an API call, an OTLP export) asks `maybe_run()`, which
costs a clock comparison until the interval has passed; then one worker across all processes
wins the cache entry of the current interval (`cache.add` of a key named after
`now // interval`, atomic in Redis and in local memory; named by the clock rather than kept by
a cache expiry, so every worker agrees on the interval) and runs the cleanup on its single
cleanup thread, which exists only while there is work. `stop()` ends it (waiting for a
run in progress) and turns the periodic run off for the process. A server without requests has
nothing new to clean; `manage.py cleanup_artifacts` from cron stays for installs that want a
fixed schedule.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from django.core.cache import cache
from django.core.signals import request_finished
from django.db import connections
from django.dispatch import receiver

from pipeline.conf import ctxlens_config

logger = logging.getLogger(__name__)

CACHE_KEY = "ctxlens:artifact-cleanup:interval:{}"


class PeriodicCleanup:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next_check = 0.0  # time.time() before which this process does not even ask the cache
        self._executor: ThreadPoolExecutor | None = None
        self._running: Future[None] | None = None
        self._stopped = False

    def maybe_run(self) -> Future[None] | None:
        """Start a cleanup in the background if the interval has passed (for every process); its future, or None."""
        interval = ctxlens_config().artifact_cleanup_interval_s
        now = time.time()
        if interval <= 0 or self._stopped or now < self._next_check:
            return None
        with self._lock:
            if self._stopped or now < self._next_check or (self._running and not self._running.done()):
                return None
            self._next_check = now + interval
            try:
                claimed = cache.add(CACHE_KEY.format(int(now // interval)), now, timeout=2 * interval)
            except Exception as error:  # the shared cache (Redis) is down: skip this turn, never the request
                logger.warning("artifact cleanup skipped: the cache is unavailable (%s)", type(error).__name__)
                return None
            if not claimed:
                return None  # another process ran it within the interval
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctxlens-artifact-cleanup")
            try:
                self._running = self._executor.submit(_run_cleanup)
            except RuntimeError:  # the interpreter is stopping
                return None
            return self._running

    def wait(self, timeout: float | None = None) -> None:
        """Until the run in progress, if any, has finished."""
        running = self._running
        if running is not None:
            running.result(timeout)

    def stop(self, wait: bool = True) -> None:
        """No more periodic runs in this process; `wait` for a run in progress to finish."""
        with self._lock:
            self._stopped = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=wait)

    def restart(self) -> None:
        """Allow periodic runs again (after stop()), the next one at the next request."""
        with self._lock:
            self._stopped, self._next_check = False, 0.0


def _run_cleanup() -> None:
    from pipeline.artifacts.cleanup import cleanup_artifacts

    try:
        logger.info("%s (periodic)", cleanup_artifacts().line())
    except Exception:
        logger.exception("periodic artifact cleanup failed; it runs again after the interval")
    finally:
        connections.close_all()  # this thread's own connections


periodic_cleanup = PeriodicCleanup()


@receiver(request_finished, dispatch_uid="ctxlens-periodic-artifact-cleanup")
def _after_request(**kwargs: object) -> None:
    periodic_cleanup.maybe_run()
