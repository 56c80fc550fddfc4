"""Live messages leave a process in the order of its commits, even over a channel layer whose
group_send awaits round trips (Redis)."""

from __future__ import annotations

import asyncio

import pytest
from channels.layers import InMemoryChannelLayer, get_channel_layer

from dashboard.live import LIVE_GROUP, on_ingest_committed

pytestmark = pytest.mark.anyio
SENDS = 10


class RoundTripChannelLayer(InMemoryChannelLayer):
    """The in-memory layer, whose group_send gives the loop away before it delivers, as a Redis
    one does while it waits for the server: the earlier a message, the longer its wait, so
    unordered sends would arrive last first."""

    async def group_send(self, group: str, message: dict) -> None:
        for _ in range(SENDS - message["changes"]["spans"]):
            await asyncio.sleep(0)
        await super().group_send(group, message)


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_sends_reach_the_live_group_in_commit_order(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": f"{__name__}.RoundTripChannelLayer"}}
    layer = get_channel_layer()
    assert isinstance(layer, RoundTripChannelLayer)
    channel = await layer.new_channel()
    await layer.group_add(LIVE_GROUP, channel)

    for n in range(SENDS):  # as successive commits on this loop (an async view) send them
        on_ingest_committed(sender=None, changes={"span_count": n, "conversation_ids": [n + 1]})
    received = [(await asyncio.wait_for(layer.receive(channel), 5))["changes"]["spans"] for _ in range(SENDS)]

    assert received == list(range(SENDS))
