"""One run of a tool body in its own thread, waited on with a deadline.

A Python thread cannot be killed, so a run that overruns its deadline keeps going until the
tool returns on its own. `RunningTools` remembers such overrunning runs by the call's
idempotency key, so that the executor never starts the same call a second time while the first
run still goes (see ToolExecutor's docstring for the rule).

A tool that is a generator (`yield`s its items) is consumed here, item by item: when the
deadline passes, the items it produced so far are its partial result (the seeds' timeout rule:
"return partial results if available"). The complete result of a generator tool is the list of
its items, or, when every item is a string (streamed text), their concatenation.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


class DeadlineExceeded(TimeoutError):
    def __init__(self, timeout_ms: int) -> None:
        super().__init__(f"Tool execution timed out after {timeout_ms} ms")
        self.timeout_ms = timeout_ms


def collected(items: list[Any]) -> Any:
    """A generator tool's result: its items, or their concatenation when all are strings."""
    if items and all(isinstance(item, str) for item in items):
        return "".join(items)
    return list(items)


class ToolRun:
    """`func` running in a daemon worker thread that sees the caller's contextvars.

    `on_exit` runs in the worker as it ends, whatever the tool did (it releases what the tool
    or an adapter bound to that thread, e.g. a database connection); `on_done` runs after it
    (the executor forgets the run there).
    """

    def __init__(
        self,
        func: Callable[[], Any],
        *,
        on_exit: Callable[[], None] | None = None,
        on_done: Callable[[ToolRun], None] | None = None,
    ) -> None:
        self._func = func
        self._on_exit = on_exit
        self._on_done = on_done
        self._items: list[Any] = []
        self._items_lock = threading.Lock()
        self._outcome: dict[str, Any] = {}
        self.done = threading.Event()

    def start(self) -> ToolRun:
        context = contextvars.copy_context()
        threading.Thread(target=self._work, args=(context,), name="ctxlens-tool", daemon=True).start()
        return self

    def _work(self, context: contextvars.Context) -> None:
        try:
            self._outcome["value"] = context.run(self._consume)
        except BaseException as exc:  # handed to whoever waits
            self._outcome["error"] = exc
        finally:
            try:
                if self._on_exit is not None:
                    self._on_exit()
            except Exception:
                logger.warning("the tool worker's exit hook failed", exc_info=True)
            self.done.set()
            if self._on_done is not None:
                self._on_done(self)

    def _consume(self) -> Any:
        value = self._func()
        if not inspect.isgenerator(value):
            return value
        for item in value:
            with self._items_lock:
                self._items.append(item)
        return collected(self.partial_items())

    def partial_items(self) -> list[Any]:
        """A copy of the items a generator tool has yielded so far (empty for other tools)."""
        with self._items_lock:
            return list(self._items)

    def wait(self, timeout_ms: int | None) -> Any:
        """The tool's value; raises DeadlineExceeded after `timeout_ms` (None: no limit), or what the tool raised."""
        if not self.done.wait(None if timeout_ms is None else timeout_ms / 1000):
            raise DeadlineExceeded(timeout_ms or 0)
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome["value"]


def run_with_deadline(
    func: Callable[[], Any], timeout_ms: int | None, *, on_exit: Callable[[], None] | None = None
) -> Any:
    """Call `func` in a worker thread and wait at most `timeout_ms`.

    Raises DeadlineExceeded when the deadline passes (the thread keeps running), or whatever
    `func` raised. `timeout_ms=None` calls `func` inline, and `on_exit` is not called: the
    caller's thread keeps its resources.
    """
    if timeout_ms is None:
        value = func()
        return collected(list(value)) if inspect.isgenerator(value) else value
    return ToolRun(func, on_exit=on_exit).start().wait(timeout_ms)


class RunningTools:
    """Runs that overran their deadline and still go, by idempotency key (this process only:
    the threads live here, so no shared store could say more)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, ToolRun] = {}

    def get(self, key: str) -> ToolRun | None:
        with self._lock:
            run = self._runs.get(key)
            return run if run is not None and not run.done.is_set() else None

    def overran(self, key: str, run: ToolRun) -> None:
        """Remember `run` as still going, unless it has finished meanwhile."""
        with self._lock:
            if not run.done.is_set():
                self._runs[key] = run

    def finished(self, run: ToolRun) -> None:
        with self._lock:
            for key in [k for k, r in self._runs.items() if r is run]:
                del self._runs[key]

    def __len__(self) -> int:
        with self._lock:
            return sum(not run.done.is_set() for run in self._runs.values())
