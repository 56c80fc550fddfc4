"""The websocket consumers, through the whole ASGI application (origin check, session auth)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import Client

from config.asgi import application
from dashboard import consumers
from dashboard import hub as live_hub
from dashboard.consumers import CLOSE_NOT_FOUND, CLOSE_TRY_AGAIN_LATER, CLOSE_UNAUTHENTICATED, MAX_BACKLOG
from dashboard.live import LIVE_GROUP
from dashboard.routing import websocket_urlpatterns
from pipeline.signals import IngestChanges, ingest_committed
from tests.dashboard_fixtures import make_conversation

pytestmark = [pytest.mark.anyio, pytest.mark.django_db(transaction=True)]
ORIGIN = (b"origin", b"http://127.0.0.1")
HOST = (b"host", b"127.0.0.1")  # the handshake's own site, which the Origin must match


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def session_cookie(alice) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(alice)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


def changes(conversation_id: int, round_id: int = 0, tool_calls: int = 0) -> IngestChanges:
    return IngestChanges(
        conversation_ids=[conversation_id], new_conversation_ids=[], round_ids=[round_id] if round_id else [],
        llm_call_ids=[], tool_call_ids=list(range(tool_calls)), compression_ids=[], input_tokens=10,
        output_tokens=5, span_count=1,
    )


async def connect(path: str, *headers: tuple[bytes, bytes]) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, path, headers=[ORIGIN, HOST, *headers])
    connected, _ = await communicator.connect()
    assert connected
    return communicator


class PageThatStopsReading(WebsocketCommunicator):
    """A socket whose page takes `window` messages and then none until it reads again (a frozen
    tab): the server's `send` waits, as uvicorn's does once the connection's buffers are full."""

    def __init__(self, path: str, *headers: tuple[bytes, bytes], window: int) -> None:
        super().__init__(application, path, headers=[ORIGIN, HOST, *headers])
        self.unread: asyncio.Queue | None = None
        self.window = window

    @property
    def output_queue(self) -> asyncio.Queue:
        if self.unread is None:
            self.unread = asyncio.Queue(maxsize=self.window)
        return self.unread


async def drain(communicator: WebsocketCommunicator, seconds: float) -> list[dict]:
    """Every message that arrives within `seconds` (a receive that times out would stop the app)."""
    return [message for _, message in await drain_timed(communicator, seconds)]


async def drain_timed(communicator: WebsocketCommunicator, seconds: float) -> list[tuple[float, dict]]:
    """Like drain, each message with the loop's clock when it arrived."""
    messages = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (left := deadline - loop.time()) > 0:
        if not await communicator.receive_nothing(timeout=left, interval=0.01):
            messages.append((loop.time(), await communicator.receive_json_from()))
    return messages


def websocket_paths() -> list[str]:
    """Every websocket route (a route added later is checked too), with 1 for each argument."""
    paths = []
    for route in websocket_urlpatterns:
        path = str(route.pattern)
        for name in route.pattern.regex.groupindex:
            path = re.sub(rf"<(\w+:)?{name}>", "1", path)
        paths.append(f"/{path}")
    return paths


async def test_it_refuses_an_anonymous_websocket_with_4401():
    paths = websocket_paths()
    assert {"/ws/live/", "/ws/conversations/1/"} <= set(paths)
    for path in paths:
        communicator = WebsocketCommunicator(application, path, headers=[ORIGIN, HOST])
        connected, _ = await communicator.connect()
        assert connected  # accepted only so that the browser learns why it is closed
        assert await communicator.receive_output() == {"type": "websocket.close", "code": CLOSE_UNAUTHENTICATED}


async def test_it_refuses_a_websocket_from_another_origin(session_cookie):
    communicator = WebsocketCommunicator(application, "/ws/live/",
                                         headers=[(b"origin", b"http://evil.example"), HOST, session_cookie])
    connected, _ = await communicator.connect()
    assert not connected


async def test_a_logged_in_browser_gets_hello_then_changes(session_cookie, settings):
    settings.CTXLENS_LIVE_INTERVAL_MS, settings.CTXLENS_LIVE_REFRESH_MS = 40, 300
    communicator = await connect("/ws/live/", session_cookie)
    assert await communicator.receive_json_from() == {"type": "hello", "interval_ms": 40, "refresh_ms": 300}
    await sync_to_async(ingest_committed.send)(sender=None, changes=changes(7, round_id=70, tool_calls=2))
    message = await communicator.receive_json_from(timeout=2)
    assert message["type"] == "changes"
    assert message["conversation_ids"] == [7] and message["round_ids"] == [70]
    assert message["tool_calls"] == 2 and message["input_tokens"] == 10 and not message["overflow"]
    await communicator.disconnect()


async def test_rows_removed_reach_the_browser_as_reload_everything(session_cookie):
    """An admin delete names no rows a page could patch in: the page reloads what it shows."""
    communicator = await connect("/ws/live/", session_cookie)
    await communicator.receive_json_from()  # hello
    removed = {**changes(7), "rows_removed": True}
    await sync_to_async(ingest_committed.send)(sender=None, changes=removed)
    message = await communicator.receive_json_from(timeout=2)
    assert message["conversation_ids"] == [7] and message["overflow"] is True
    await communicator.disconnect()


async def test_a_burst_of_ingest_is_coalesced_into_a_few_messages(session_cookie, settings):
    communicator = await connect("/ws/live/", session_cookie)
    await communicator.receive_json_from()
    started = asyncio.get_running_loop().time()
    for n in range(1, 91):  # 90 commits at once (the in-memory layer holds 100 per channel)
        ingest_committed.send(sender=None, changes=changes(n, tool_calls=1))
    timed = await drain_timed(communicator, 1.0)
    messages = [message for _, message in timed]
    # At most FRAME_BURST messages at once, then one per interval while the commits are being
    # delivered (a busy machine stretches that delivery, never the rule).
    interval = settings.CTXLENS_LIVE_INTERVAL_MS / 1000
    assert 1 <= len(messages) <= live_hub.FRAME_BURST + 1 + (timed[-1][0] - started) / interval, \
        [at - started for at, _ in timed]
    assert sorted(i for m in messages for i in m["conversation_ids"]) == list(range(1, 91))
    assert sum(m["tool_calls"] for m in messages) == 90
    await communicator.disconnect()


async def test_merged_messages_cap_their_id_lists_and_say_so(session_cookie, settings):
    settings.CTXLENS_LIVE_INTERVAL_MS = 1000  # the three sends below arrive within it, even on a slow Redis
    communicator = await connect("/ws/live/", session_cookie)
    await communicator.receive_json_from()
    for n in range(live_hub.FRAME_BURST):  # sent at once: the group's frame budget is spent
        await sync_to_async(ingest_committed.send)(sender=None, changes=changes(n))
        await communicator.receive_json_from(timeout=2)
    for first in (1000, 2000, 3000):  # pending while the interval runs: merged into one message
        big = changes(0)
        big["conversation_ids"] = list(range(first, first + 100))
        ingest_committed.send(sender=None, changes=big)
    (message,) = await drain(communicator, 2.5)
    assert message["overflow"] is True and message["conversation_ids"] == [*range(1000, 1100), *range(2000, 2100)]
    assert message["spans"] == 3
    await communicator.disconnect()


async def test_after_a_quiet_spell_a_few_changes_go_at_once_then_one_per_interval(session_cookie, settings):
    """The hub sends by its FrameBudget: a commit just after a frame is not held for an interval
    while the group is far from that rate; past FRAME_BURST frames back to back, it is."""
    settings.CTXLENS_LIVE_INTERVAL_MS = 2000
    communicator = await connect("/ws/live/", session_cookie)
    await communicator.receive_json_from()
    for n in range(1, live_hub.FRAME_BURST + 1):  # each delivered long before one interval
        await sync_to_async(ingest_committed.send)(sender=None, changes=changes(n))
        assert (await communicator.receive_json_from(timeout=1))["conversation_ids"] == [n]
    for n in (98, 99):  # the budget is spent: each waits for an interval
        await sync_to_async(ingest_committed.send)(sender=None, changes=changes(n))
        assert await communicator.receive_nothing(timeout=0.5)
        assert (await communicator.receive_json_from(timeout=4))["conversation_ids"] == [n]
    await communicator.disconnect()


async def test_a_conversation_socket_hears_only_its_conversation(session_cookie):
    demo = await sync_to_async(make_conversation)("conv-ws", rounds=1)
    other = await sync_to_async(make_conversation)("conv-ws-other", rounds=1)
    communicator = await connect(f"/ws/conversations/{demo.conversation.pk}/", session_cookie)
    assert (await communicator.receive_json_from())["type"] == "hello"
    await sync_to_async(ingest_committed.send)(sender=None, changes=changes(other.conversation.pk))
    assert await communicator.receive_nothing(timeout=0.5)
    await sync_to_async(ingest_committed.send)(
        sender=None, changes=changes(demo.conversation.pk, round_id=demo.rounds[0].pk))
    message = await communicator.receive_json_from(timeout=2)
    assert message["round_ids"] == [demo.rounds[0].pk]
    await communicator.disconnect()


async def test_it_closes_a_socket_for_an_unknown_conversation_with_4404(session_cookie):
    communicator = WebsocketCommunicator(application, "/ws/conversations/987654/", headers=[ORIGIN, HOST, session_cookie])
    connected, _ = await communicator.connect()
    assert connected
    assert await communicator.receive_output() == {"type": "websocket.close", "code": CLOSE_NOT_FOUND}


async def test_it_answers_a_ping(session_cookie):
    communicator = await connect("/ws/live/", session_cookie)
    await communicator.receive_json_from()
    await communicator.send_json_to({"type": "ping"})
    assert await communicator.receive_json_from() == {"type": "pong"}
    await communicator.disconnect()


async def test_a_socket_whose_session_ended_is_closed_at_its_next_ping(alice):
    browser = Client()
    await sync_to_async(browser.force_login)(alice)
    cookie = (b"cookie", f"sessionid={browser.cookies['sessionid'].value}".encode())
    communicator = await connect("/ws/live/", cookie)
    await communicator.receive_json_from()
    await communicator.send_json_to({"type": "ping"})
    assert await communicator.receive_json_from() == {"type": "pong"}
    await sync_to_async(browser.logout)()  # in another tab: the session is deleted
    await communicator.send_json_to({"type": "ping"})
    assert await communicator.receive_output() == {"type": "websocket.close", "code": CLOSE_UNAUTHENTICATED}


async def test_the_sockets_of_one_group_share_one_subscription_and_get_the_same_message(session_cookie):
    layer = get_channel_layer()
    if not isinstance(layer, InMemoryChannelLayer):
        pytest.skip("counts the in-memory layer's group members")
    # Earlier tests' event loops (closed, one per test) may have left their channels in the group.
    before = set(layer.groups.get(LIVE_GROUP, {}))
    communicators = [await connect("/ws/live/", session_cookie) for _ in range(3)]
    for communicator in communicators:
        await communicator.receive_json_from()
    assert len(set(layer.groups.get(LIVE_GROUP, {})) - before) == 1  # one channel for the process, not one per socket

    await sync_to_async(ingest_committed.send)(sender=None, changes=changes(5, round_id=50))
    messages = [await communicator.receive_json_from(timeout=2) for communicator in communicators]
    assert messages[0]["conversation_ids"] == [5] and messages.count(messages[0]) == 3

    for communicator in communicators:
        await communicator.disconnect()
    assert set(layer.groups.get(LIVE_GROUP, {})) == before  # the last socket to leave ends the subscription


async def test_a_malformed_event_does_not_end_the_groups_updates(session_cookie):
    """A worker of another version (a rolling deploy on Redis) may send what this one cannot merge."""
    communicator = await connect("/ws/live/", session_cookie)
    await communicator.receive_json_from()  # hello
    await get_channel_layer().group_send(LIVE_GROUP, {"type": "live.changes", "changes": {"unknown": 1}})
    await get_channel_layer().group_send(LIVE_GROUP, {"type": "live.changes", "changes": {"unknown": 2}})
    await sync_to_async(ingest_committed.send)(sender=None, changes=changes(7, round_id=70))
    message = await communicator.receive_json_from(timeout=5)
    assert message["conversation_ids"] == [7]
    await communicator.disconnect()


async def test_a_socket_that_goes_away_mid_handshake_leaves_the_group(session_cookie):
    layer = get_channel_layer()
    if not isinstance(layer, InMemoryChannelLayer):
        pytest.skip("counts the in-memory layer's group members")
    before = set(layer.groups.get(LIVE_GROUP, {}))
    scope = {"type": "websocket", "path": "/ws/live/", "raw_path": b"/ws/live/", "query_string": b"",
             "headers": [ORIGIN, HOST, session_cookie], "subprotocols": [], "client": ("127.0.0.1", 50000),
             "server": ("testserver", 80)}
    inbox: asyncio.Queue = asyncio.Queue()
    await inbox.put({"type": "websocket.connect"})

    async def send(message: dict) -> None:
        if message["type"] == "websocket.accept":  # as uvicorn's send once the client dropped the connection
            raise ConnectionResetError("the client went away")

    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(application(scope, inbox.get, send), 10)
    # Channels calls no disconnect() for a socket it never accepted: the consumer left the hub itself
    assert set(layer.groups.get(LIVE_GROUP, {})) == before



def live_members() -> int:
    """How many sockets of this event loop the hub sends the live group's frames to."""
    return sum(len(hub.feeds[LIVE_GROUP].members) for (loop, _), hub in live_hub._hubs.items()
               if loop is asyncio.get_running_loop() and LIVE_GROUP in hub.feeds)


@pytest.mark.parametrize("falls_behind", ["frames pile up", "a frame waits too long"])
async def test_a_page_that_stops_reading_is_closed_and_holds_up_no_one(session_cookie, settings, monkeypatch,
                                                                        falls_behind):
    settings.CTXLENS_LIVE_INTERVAL_MS = 1
    reader = await connect("/ws/live/", session_cookie)
    stuck = PageThatStopsReading("/ws/live/", session_cookie, window=4)
    assert (await stuck.connect())[0]
    for communicator in (reader, stuck):
        assert (await communicator.receive_json_from())["type"] == "hello"
    assert live_members() == 2
    if falls_behind == "frames pile up":
        commits = list(range(1, MAX_BACKLOG + 11))
    else:  # a few frames, then one more after the one the page does not take has waited too long
        monkeypatch.setattr(consumers, "SEND_TIMEOUT_S", 0.3)
        commits = list(range(1, 7))
    heard = []
    for n in commits:
        if n == commits[-1] and falls_behind != "frames pile up":
            await asyncio.sleep(0.5)
        await sync_to_async(ingest_committed.send)(sender=None, changes=changes(n))
        while n not in heard:  # the page that reads hears of every commit at once
            heard.extend((await reader.receive_json_from(timeout=2))["conversation_ids"])
    assert heard == commits
    for _ in range(100):  # the frozen page's socket leaves the group at once
        if live_members() == 1:
            break
        await asyncio.sleep(0.01)
    assert live_members() == 1

    # The frozen page reads again, later than any timeout: the frames its connection held, then
    # the close (the page reconnects).
    await asyncio.sleep(1)
    taken = []
    while (message := await stuck.receive_output(timeout=2))["type"] == "websocket.send":
        taken.extend(json.loads(message["text"])["conversation_ids"])
    assert message == {"type": "websocket.close", "code": CLOSE_TRY_AGAIN_LATER}
    assert taken == commits[:len(taken)] and len(taken) < len(commits)
    for communicator in (reader, stuck):
        await communicator.disconnect()
