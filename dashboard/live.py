"""Ingest → websockets: each committed ingest becomes one small channel-layer group message.

The receiver sends to the `live` group (overview and lists) and to the group of every
conversation the ingest touched. It does no database work: it runs right after the ingest
commit. Browsers are not flooded: each process reads each group once, merges what arrives
and hands its sockets of that group at most one message per `CTXLENS_LIVE_INTERVAL_MS`
sustained (dashboard/hub.py).

Ingest commits on threads that run no event loop (the ingest writer thread, the deferred
token work, the gRPC server), and the in-memory channel layer is not thread-safe: the send
must run on the event loop that serves the websockets. `record_serving_loop` wraps the ASGI
application and remembers that loop; the receiver hands the send to it without waiting.
Only in a process that serves nothing (a management command) does the send get a loop of
its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, TypedDict

from channels.layers import get_channel_layer

from pipeline.signals import IngestChanges, ingest_committed

logger = logging.getLogger(__name__)

LIVE_GROUP = "live"
EVENT_TYPE = "live.changes"  # read by the process's hub (dashboard/hub.py)
# A merged message names at most this many ids of a kind; past that it says "overflow" and
# the page refreshes everything it shows instead of the named rows.
MAX_IDS = 200
SEND_TIMEOUT_S = 10.0

_ID_KEYS = ("conversation_ids", "new_conversation_ids", "round_ids", "compression_ids")
_COUNT_KEYS = ("llm_calls", "tool_calls", "input_tokens", "output_tokens", "spans")


class LiveChanges(TypedDict):
    """What changed since the last message; the body a browser receives (plus `type`)."""

    conversation_ids: list[int]
    new_conversation_ids: list[int]
    round_ids: list[int]
    compression_ids: list[int]
    llm_calls: int
    tool_calls: int
    input_tokens: int
    output_tokens: int
    spans: int
    overflow: bool


class LiveEvent(TypedDict):
    type: str
    changes: LiveChanges


def conversation_group(conversation_id: int) -> str:
    return f"conversation.{conversation_id}"


def _capped(ids: list[int]) -> tuple[list[int], bool]:
    unique = list(dict.fromkeys(ids))
    return unique[:MAX_IDS], len(unique) > MAX_IDS


def changes_from_ingest(changes: IngestChanges) -> LiveChanges:
    live: dict = {"overflow": bool(changes.get("rows_removed"))}  # what a page shows may be gone: reload it
    for key in _ID_KEYS:
        live[key], over = _capped([int(i) for i in changes.get(key, [])])
        live["overflow"] |= over
    live["llm_calls"] = len(changes.get("llm_call_ids", []))
    live["tool_calls"] = len(changes.get("tool_call_ids", []))
    live["input_tokens"] = int(changes.get("input_tokens", 0))
    live["output_tokens"] = int(changes.get("output_tokens", 0))
    live["spans"] = int(changes.get("span_count", 0))
    return LiveChanges(**live)


def merge_changes(older: LiveChanges, newer: LiveChanges) -> LiveChanges:
    """One message that says everything `older` and `newer` say."""
    merged: dict = {"overflow": older["overflow"] or newer["overflow"]}
    for key in _ID_KEYS:
        merged[key], over = _capped(older[key] + newer[key])
        merged["overflow"] |= over
    for key in _COUNT_KEYS:
        merged[key] = older[key] + newer[key]
    return LiveChanges(**merged)


async def send_changes(changes: LiveChanges, conversation_ids: list[int]) -> None:
    """To the live group, and to the group of each of `conversation_ids` (all of them, uncapped).

    Sends started on one event loop go out one after another, in the order they were started
    (the order of this process's commits): a Redis group_send awaits several round trips, and
    interleaved sends would reach a consumer out of order. A send that takes longer than
    SEND_TIMEOUT_S is given up (and logged), so a stuck channel layer does not hold up the
    sends behind it for good.
    """
    layer = get_channel_layer()
    if layer is None:
        return
    event = LiveEvent(type=EVENT_TYPE, changes=changes)
    async with _send_lock(), asyncio.timeout(SEND_TIMEOUT_S):
        await layer.group_send(LIVE_GROUP, event)
        for conversation_id in dict.fromkeys(conversation_ids):
            await layer.group_send(conversation_group(conversation_id), event)


# Process state, not app state: the event loop this process serves ASGI connections on, the
# sends started on it, kept referenced until they finish (asyncio holds only weak references
# to running tasks), and the lock that orders them, one per loop.
_serving: dict[str, asyncio.AbstractEventLoop] = {}
_running: set[asyncio.Task | Future] = set()
_send_locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}


def _send_lock() -> asyncio.Lock:
    """The running loop's lock (an asyncio.Lock belongs to the loop it is first used on); it
    wakes its waiters first come, first served. Locks of closed loops are dropped."""
    loop = asyncio.get_running_loop()
    lock = _send_locks.get(loop)
    if lock is None:
        for closed in [other for other in _send_locks if other.is_closed()]:
            del _send_locks[closed]
        lock = _send_locks[loop] = asyncio.Lock()
    return lock


ASGIApp = Callable[[dict, Any, Any], Awaitable[None]]


def record_serving_loop(app: ASGIApp) -> ASGIApp:
    """Wrap the ASGI application: every connection notes the loop it is served on."""

    async def serve(scope: dict, receive: Any, send: Any) -> None:
        _serving["loop"] = asyncio.get_running_loop()
        await app(scope, receive, send)

    return serve


def _serving_loop() -> asyncio.AbstractEventLoop | None:
    loop = _serving.get("loop")
    return loop if loop is not None and loop.is_running() and not loop.is_closed() else None


def _done(sending: asyncio.Task | Future) -> None:
    _running.discard(sending)
    if not sending.cancelled() and sending.exception() is not None:
        logger.warning("live: could not notify websocket clients", exc_info=sending.exception())


def on_ingest_committed(sender: object, changes: IngestChanges, **kwargs: object) -> None:
    """Receiver of `pipeline.signals.ingest_committed`; never fails (nor waits for) the ingest that sent it."""
    live = changes_from_ingest(changes)
    conversation_ids = [int(i) for i in changes.get("conversation_ids", [])]
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    try:
        if running is not None:  # on the event loop itself (an async view)
            sending: asyncio.Task | Future = running.create_task(send_changes(live, conversation_ids))
        elif (loop := _serving_loop()) is not None:  # another thread of a serving process
            sending = asyncio.run_coroutine_threadsafe(send_changes(live, conversation_ids), loop)
        else:  # nothing is served here (a command): no websocket listens in this process
            # On this thread's own loop, not async_to_sync's executor: a background refresh that
            # finishes as the command exits still sends (the executor refuses work by then).
            asyncio.run(send_changes(live, conversation_ids))
            return
        _running.add(sending)
        sending.add_done_callback(_done)
    except Exception:
        logger.warning("live: could not notify websocket clients", exc_info=True)


def connect_receivers() -> None:
    ingest_committed.connect(on_ingest_committed, dispatch_uid="dashboard.live")
