"""Ingest committed on a thread other than the server's → websocket messages, sent on the serving loop.

Channels' in-memory layer is not thread-safe: a send from the ingest writer thread (or any
thread that is not running the server's event loop: the deferred token work, the gRPC server)
must run on the loop that serves the websockets. The layer used here is that in-memory layer
refusing, instead of racing, to be used from a second event loop, so a send on the wrong loop
fails the test every time rather than now and then.
"""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer
from channels.testing import WebsocketCommunicator
from django.db import connections
from django.test import Client

from config.asgi import application
from pipeline.ingest.write.store import store_spans
from pipeline.ingest.write.writer_threads import stop_writer, writer
from pipeline.models import Conversation
from pipeline.ingest.decode.sdk import span_record
from tests.agent_traces import record_turns

pytestmark = [pytest.mark.anyio, pytest.mark.django_db(transaction=True)]


class OneLoopChannelLayer(InMemoryChannelLayer):
    """The in-memory layer, bound to the first event loop that uses it."""

    home: asyncio.AbstractEventLoop | None = None

    def _on_home_loop(self) -> None:
        loop = asyncio.get_running_loop()
        self.home = self.home or loop
        if loop is not self.home:
            raise RuntimeError("in-memory channel layer used from a second event loop")

    async def group_add(self, group: str, channel: str) -> None:
        self._on_home_loop()
        await super().group_add(group, channel)

    async def group_send(self, group: str, message: dict) -> None:
        self._on_home_loop()
        await super().group_send(group, message)


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def one_loop_layer(settings) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": f"{__name__}.OneLoopChannelLayer"}}


@pytest.fixture
def session_cookie(alice) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(alice)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


@pytest.fixture
async def threads_done():
    """After the test: the writer's queued work (the deferred token counts) is done while the test
    may still use the database, and the thread that ran its sync ORM calls (the websocket's
    session lookup) closes its connection (kept for CONN_MAX_AGE), so PostgreSQL can drop the
    test database."""
    yield
    await asyncio.to_thread(stop_writer)
    await sync_to_async(connections.close_all)()


async def test_a_commit_on_the_ingest_writer_thread_reaches_websockets(
    one_loop_layer, session_cookie, threads_done
):
    communicator = WebsocketCommunicator(application, "/ws/live/",
                                         headers=[(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1"),
                                                  session_cookie])
    connected, _ = await communicator.connect()
    assert connected
    assert (await communicator.receive_json_from())["type"] == "hello"
    records = [span_record(s) for s in record_turns("conv-live-thread")]

    # The writer thread as the in-process exporter or the deferred token work use it: not
    # through sync_to_async, so the thread itself knows no event loop.
    result = await asyncio.to_thread(lambda: writer().submit(store_spans, records).result())

    assert result.accepted == len(records)
    message = await communicator.receive_json_from(timeout=3)
    conversation = await Conversation.objects.aget(external_id="conv-live-thread")
    assert message["type"] == "changes" and conversation.id in message["conversation_ids"]
    assert message["spans"] == len(records)
    await communicator.disconnect()
