"""The cache the runtime keeps short-lived state in: tool results, summaries, the summary budget.

`Cache` is the small key-value API the runtime uses (get / set / add / incr / decr / delete /
clear, timeouts in seconds). The server's cache framework already has these methods, so the
server passes its cache object (local memory or Redis) as it is; `InMemoryCache` is the default
of an agent without a server: one process, thread-safe, each key with its own expiry.

    executor = ToolExecutor(tools, cache=InMemoryCache())
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

DEFAULT_TIMEOUT = 300  # seconds, the server cache's default too

_MISSING = object()


@runtime_checkable
class Cache(Protocol):
    """`timeout` is in seconds; None keeps the key until it is deleted."""

    def get(self, key: str, default: Any = None) -> Any: ...

    def set(self, key: str, value: Any, timeout: float | None = DEFAULT_TIMEOUT) -> None: ...

    def add(self, key: str, value: Any, timeout: float | None = DEFAULT_TIMEOUT) -> bool:
        """Set `key` only if it is absent; True if this call set it."""
        ...

    def incr(self, key: str, delta: int = 1) -> int:
        """Add `delta` to an existing integer and return the sum; ValueError if `key` is absent."""
        ...

    def decr(self, key: str, delta: int = 1) -> int: ...

    def delete(self, key: str) -> bool: ...

    def clear(self) -> None: ...


class InMemoryCache:
    """A thread-safe dict with per-key expiry: the runtime's cache when no server passes one.

    Expired keys are dropped when touched and swept whenever `max_entries` is reached; if every
    key is still live, the ones closest to expiry go first.
    """

    def __init__(self, *, max_entries: int = 10_000, clock: Callable[[], float] = time.time) -> None:
        self.max_entries = max_entries
        self._clock = clock
        self._entries: dict[str, tuple[Any, float | None]] = {}  # key -> (value, expires at)
        self._lock = threading.Lock()

    def _deadline(self, timeout: float | None) -> float | None:
        return None if timeout is None else self._clock() + timeout

    def _live(self, key: str) -> Any:
        """The value under `key`, or _MISSING; call with the lock held."""
        entry = self._entries.get(key)
        if entry is None:
            return _MISSING
        value, expires = entry
        if expires is not None and expires <= self._clock():
            del self._entries[key]
            return _MISSING
        return value

    def _store(self, key: str, value: Any, timeout: float | None) -> None:
        if key not in self._entries and len(self._entries) >= self.max_entries:
            self._make_room()
        self._entries[key] = (value, self._deadline(timeout))

    def _make_room(self) -> None:
        now = self._clock()
        for key in [k for k, (_, exp) in self._entries.items() if exp is not None and exp <= now]:
            del self._entries[key]
        if len(self._entries) >= self.max_entries:
            by_expiry = sorted(self._entries, key=lambda k: (self._entries[k][1] is None, self._entries[k][1] or 0))
            for key in by_expiry[: len(self._entries) - self.max_entries + 1]:
                del self._entries[key]

    def get(self, key: str, default: Any = None) -> Any:
        with self._lock:
            value = self._live(key)
        return default if value is _MISSING else value

    def set(self, key: str, value: Any, timeout: float | None = DEFAULT_TIMEOUT) -> None:
        with self._lock:
            self._store(key, value, timeout)

    def add(self, key: str, value: Any, timeout: float | None = DEFAULT_TIMEOUT) -> bool:
        with self._lock:
            if self._live(key) is not _MISSING:
                return False
            self._store(key, value, timeout)
            return True

    def incr(self, key: str, delta: int = 1) -> int:
        with self._lock:
            value = self._live(key)
            if value is _MISSING:
                raise ValueError(f"Key '{key}' not found")
            total = value + delta
            self._entries[key] = (total, self._entries[key][1])
            return total

    def decr(self, key: str, delta: int = 1) -> int:
        return self.incr(key, -delta)

    def delete(self, key: str) -> bool:
        with self._lock:
            return self._entries.pop(key, None) is not None

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return sum(1 for key in list(self._entries) if self._live(key) is not _MISSING)
