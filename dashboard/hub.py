"""The live fan-out: one channel-layer subscription per process and group, merged frames at a capped rate.

With a channel-layer group per browser, every commit was one message into each connected
consumer's channel: O(browsers × commits) work on the event loop, a JSON encoding per browser,
and, once a consumer's channel held `capacity` messages (100 by default), group_send dropped
the rest, so a browser missed conversations. Here a process subscribes once to each group some
of its websockets watch (one channel-layer channel per process and group, so with Redis every
worker still gets every commit of every worker), merges what arrives, and encodes one "changes"
frame that every local websocket of the group gets as is: at most one per
`CTXLENS_LIVE_INTERVAL_MS` sustained, up to FRAME_BURST back to back after a quiet spell
(`FrameBudget`). Holding every frame a whole interval after the previous one held a commit that
came just after a frame even while ingest committed far below that rate: with 200 sockets under
1,000 spans/s the p95 from POST to frame was 49-62 ms that way, 31-41 ms with the budget, 0.68x
in alternating rounds (`bench/live.py --part latency --clients 200 --load 1000 --base <commit>`).

A member is a websocket (dashboard/consumers.py): `deliver(frame)` must not wait; the member
queues the frame and sends it on its own task, so a slow socket holds up only itself (and
leaves the group, to be closed, when it falls too far behind: the page reconnects and catches
up on its own).

State lives per event loop and channel layer: the subscriptions belong to the loop that reads
them, and tests swap the layer through settings.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from typing import Protocol

from channels.layers import BaseChannelLayer, get_channel_layer

from dashboard.live import EVENT_TYPE, LiveChanges, changes_from_ingest, merge_changes
from pipeline.conf import ctxlens_config

logger = logging.getLogger(__name__)

NOTHING = changes_from_ingest({})  # type: ignore[typeddict-item]
RETRY_AFTER_S = 1.0  # after the channel layer failed a receive (Redis restarting)
# Channel layers forget a group member after `group_expiry` (a day by default); a subscription
# outlives any one socket, so it renews its membership well before that.
RENEW_EVERY_S = 3600.0
# Frames a group may send back to back after a quiet spell; sustained, one per interval.
FRAME_BURST = 4


class FrameBudget:
    """When a group's next frame may go: up to `burst` back to back after a quiet spell, one per
    `interval` sustained (GCRA: `due` is when the next frame would be due at exactly one per
    interval; a frame may go while that is at most `burst - 1` intervals ahead)."""

    def __init__(self, interval: float, burst: int = FRAME_BURST) -> None:
        self.interval, self.burst = interval, burst
        self.due = -math.inf

    def wait(self, now: float) -> float:
        """Seconds from `now` until a frame may go (0: at once)."""
        return max(0.0, self.due - (self.burst - 1) * self.interval - now)

    def spend(self, now: float) -> None:
        """A frame went at `now`."""
        self.due = max(self.due, now) + self.interval


class Member(Protocol):
    def deliver(self, frame: str) -> None:
        """Queue one encoded "changes" frame; never waits."""


class _Feed:
    """One group's subscription in this process: its reader, its pending changes, its members."""

    def __init__(self, layer: BaseChannelLayer, group: str) -> None:
        self.layer = layer
        self.group = group
        self.members: set[Member] = set()
        self.budget = FrameBudget(ctxlens_config().live_interval_ms / 1000)
        self.pending: LiveChanges | None = None
        self.channel = ""
        self.reader: asyncio.Task | None = None
        self.renewer: asyncio.Task | None = None
        self.flusher: asyncio.Task | None = None

    async def open(self) -> None:
        self.channel = await self.layer.new_channel()
        await self.layer.group_add(self.group, self.channel)
        self.reader = asyncio.create_task(self._read())
        self.renewer = asyncio.create_task(self._renew())

    async def close(self) -> None:
        for task in (self.reader, self.renewer, self.flusher):
            if task is not None:
                task.cancel()
        await self.layer.group_discard(self.group, self.channel)

    async def _read(self) -> None:
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("live: could not read group %s", self.group, exc_info=True)
                await asyncio.sleep(RETRY_AFTER_S)
                await self._join()  # a restarted Redis has forgotten the group's members
                continue
            if message.get("type") != EVENT_TYPE:
                continue
            try:
                # merged even into nothing: a malformed event fails here, not in the next merge
                self.pending = merge_changes(self.pending or NOTHING, message["changes"])
            except Exception:  # one malformed event (a worker of another version) must not end the feed
                logger.warning("live: ignored a malformed event in group %s", self.group, exc_info=True)
                continue
            if self.flusher is None:
                self.flusher = asyncio.create_task(self._flush())

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(RENEW_EVERY_S)
            await self._join()

    async def _join(self) -> None:
        try:
            await self.layer.group_add(self.group, self.channel)
        except Exception:
            logger.warning("live: could not join group %s", self.group, exc_info=True)

    async def _flush(self) -> None:
        """Send what is pending as soon as the group's frame budget allows."""
        wait = self.budget.wait(time.monotonic())
        if wait > 0:
            await asyncio.sleep(wait)
        changes, self.pending, self.flusher = self.pending, None, None
        if changes is None:
            return
        self.budget.spend(time.monotonic())
        frame = json.dumps({"type": "changes", **changes})
        for member in list(self.members):
            try:
                member.deliver(frame)
            except Exception:
                logger.warning("live: could not deliver to a websocket", exc_info=True)


class Hub:
    def __init__(self, layer: BaseChannelLayer) -> None:
        self.layer = layer
        self.feeds: dict[str, _Feed] = {}
        # Held only while a subscription opens or closes, so that a join never races the last
        # leave of the same group.
        self.lock = asyncio.Lock()

    async def join(self, group: str, member: Member) -> None:
        async with self.lock:
            feed = self.feeds.get(group)
            if feed is None:
                feed = _Feed(self.layer, group)
                await feed.open()
                self.feeds[group] = feed
            feed.members.add(member)

    async def leave(self, group: str, member: Member) -> None:
        async with self.lock:
            feed = self.feeds.get(group)
            if feed is None or member not in feed.members:
                return
            feed.members.discard(member)
            if not feed.members:
                del self.feeds[group]
                await feed.close()


# Process state: one hub per event loop and channel layer (closed loops are dropped).
_hubs: dict[tuple[asyncio.AbstractEventLoop, BaseChannelLayer], Hub] = {}


def _hub() -> Hub | None:
    layer = get_channel_layer()
    if layer is None:
        return None
    loop = asyncio.get_running_loop()
    hub = _hubs.get((loop, layer))
    if hub is None:
        for key in [key for key in _hubs if key[0].is_closed()]:
            del _hubs[key]
        hub = _hubs[(loop, layer)] = Hub(layer)
    return hub


async def join(group: str, member: Member) -> Hub | None:
    """Subscribe `member` to `group`'s frames; returns the hub to leave, None without a channel layer."""
    hub = _hub()
    if hub is not None:
        await hub.join(group, member)
    return hub
