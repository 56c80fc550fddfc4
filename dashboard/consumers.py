"""Websocket consumers: /ws/live/ (overview and lists) and /ws/conversations/<id>/.

Thin by design: authenticate through the session, join one group through the process's hub
(dashboard/hub.py), which merges the `live.changes` events that dashboard/live.py sends and
hands every socket of the group the same encoded frame, at most one per
`CTXLENS_LIVE_INTERVAL_MS` sustained however fast ingest commits. Pages fetch what
changed over HTTP (the same partials they render on first load), at most once per
`CTXLENS_LIVE_REFRESH_MS` (sent in "hello"; static/js/live.js paces them).

Every frame goes to every socket of its group, so what it costs per socket is the fan-out's
cost: frames go straight to the server's `send` (`with_server_send`), past Channels' session
middleware, whose `send` only acts on HTTP responses; and a socket that falls behind is found
when the next frame comes, not by a timer per frame (measured with 200 sockets under 1,000
spans/s of ingest: 7 % less server CPU).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from importlib import import_module

from channels.auth import get_user
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from dashboard import hub as live_hub
from dashboard.hub import Hub
from dashboard.live import LIVE_GROUP, conversation_group
from pipeline.conf import ctxlens_config
from pipeline.models import Conversation

# Close codes the page's live socket understands (4000-4999 are for applications).
CLOSE_UNAUTHENTICATED = 4401  # go to the login page instead of reconnecting
CLOSE_NOT_FOUND = 4404  # the conversation does not exist
CLOSE_TRY_AGAIN_LATER = 1013  # fell behind: the page reconnects and catches up

# A socket whose frame has waited this long when the next one comes, or that has more than this
# many frames waiting, is closed.
SEND_TIMEOUT_S = 5.0
MAX_BACKLOG = 20
SERVER_SEND = "ctxlens.server_send"  # scope entry: the ASGI server's own `send` for this socket

logger = logging.getLogger(__name__)


def with_server_send(app):
    """Wrap the websocket application (outside the origin check and Channels' auth stack) so that
    consumers find the server's `send` in the scope, under SERVER_SEND. A middleware added inside
    it that must see outgoing websocket messages would not see the frames."""

    async def application(scope: dict, receive, send) -> None:
        await app({**scope, SERVER_SEND: send}, receive, send)

    return application


class ChangesConsumer(AsyncJsonWebsocketConsumer):
    """Join one group through the process's hub (dashboard/hub.py) and send the frames it delivers."""

    group: str | None = None
    hub: Hub | None = None

    async def group_name(self) -> str | None:
        """The group to join, or None when the resource does not exist."""
        raise NotImplementedError

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            # Accept first so the browser sees the code (a refused handshake is only "1006").
            await self.accept()
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        group = await self.group_name()
        if group is None:
            await self.accept()
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.group = group
        self.outbox: deque[str] = deque()
        self.writer: asyncio.Task | None = None
        self.closer: asyncio.Task | None = None
        self.sending_since = 0.0  # the loop's clock when the frame being sent was handed over
        # Frames skip the middleware's `send` (see the module's docstring); without the wrapper
        # (another ASGI stack) they take the consumer's own.
        self.send_frame = self.scope.get(SERVER_SEND) or self.base_send
        self.greeted = False  # frames wait in the outbox until "hello" has gone out
        self.closing = False
        # Joined before accepting: nothing committed after the browser sees "hello" is missed.
        self.hub = await live_hub.join(group, self)
        try:
            await self.accept()
            config = ctxlens_config()
            await self.send_json({"type": "hello", "interval_ms": config.live_interval_ms,
                                  "refresh_ms": config.live_refresh_ms})
        except BaseException:  # the client went away mid-handshake: Channels calls no disconnect()
            await self._leave()
            raise
        self.greeted = True
        self._start_writer()

    async def disconnect(self, code: int) -> None:
        await self._leave()

    async def _leave(self) -> None:
        try:
            if self.hub is not None and self.group is not None:
                await self.hub.leave(self.group, self)
        finally:
            for task in (getattr(self, "writer", None), getattr(self, "closer", None)):
                if task is not None:
                    task.cancel()

    async def receive_json(self, content: object, **kwargs: object) -> None:
        if self.closing:
            return  # given up on (a pong would follow the close and fail)
        if isinstance(content, dict) and content.get("type") == "ping":
            # The page pings every 30 s: a socket whose session has ended (logged out in another
            # tab, expired, password changed) is closed, and the page goes to the login page.
            if not await _still_signed_in(self.scope):
                await self.close(code=CLOSE_UNAUTHENTICATED)
                return
            await self.send_json({"type": "pong"})

    def deliver(self, frame: str) -> None:
        """Called by the hub with one encoded "changes" frame; never waits: `_write` sends it.
        Gives up on the socket (`_give_up`) when more than MAX_BACKLOG frames wait, or when the
        frame being sent has waited more than SEND_TIMEOUT_S."""
        if self.closing:
            return  # the page reconnects and catches up
        self.outbox.append(frame)
        if len(self.outbox) > MAX_BACKLOG or (
            self.writer is not None and asyncio.get_running_loop().time() - self.sending_since > SEND_TIMEOUT_S
        ):
            self._give_up()
        else:
            self._start_writer()

    def _start_writer(self) -> None:
        if self.greeted and self.writer is None and self.outbox:
            self.sending_since = asyncio.get_running_loop().time()
            self.writer = asyncio.create_task(self._write())

    async def _write(self) -> None:
        """Send the outbox in order; a slow socket holds up only itself."""
        loop = asyncio.get_running_loop()
        try:
            while self.outbox and not self.closing:
                self.sending_since = loop.time()
                await self.send_frame({"type": "websocket.send", "text": self.outbox[0]})
                self.outbox.popleft()
        except Exception:  # the socket went away meanwhile; disconnect() leaves the hub
            self.closing = True
            self.outbox.clear()
        finally:
            self.writer = None

    def _give_up(self) -> None:
        """Stop sending to a socket that cannot keep up and close it: the page, reconnecting,
        fetches what it shows afresh (static/js/live.js onOpen). The socket leaves its group at
        once; the close goes out after the frames the server already holds for it, if the peer
        ever takes them (uvicorn's keepalive does not drop a peer whose buffers are full: the
        server keeps the connection until the peer reads or goes away)."""
        logger.info("live: closing a websocket that cannot keep up")
        self.closing = True
        self.outbox.clear()
        if self.writer is not None:
            self.writer.cancel()
        self.closer = asyncio.create_task(self._close_behind())

    async def _close_behind(self) -> None:
        if self.hub is not None and self.group is not None:
            await self.hub.leave(self.group, self)
        with contextlib.suppress(Exception):  # the socket went away meanwhile
            await self.close(code=CLOSE_TRY_AGAIN_LATER)


class LiveConsumer(ChangesConsumer):
    async def group_name(self) -> str | None:
        return LIVE_GROUP


class ConversationConsumer(ChangesConsumer):
    async def group_name(self) -> str | None:
        conversation_id = self.scope["url_route"]["kwargs"]["conversation_id"]
        if await _conversation_exists(conversation_id):
            return conversation_group(conversation_id)
        return None


async def _still_signed_in(scope: dict) -> bool:
    """Whether the session the socket opened with still signs in the same user (read afresh)."""
    key = getattr(scope.get("session"), "session_key", None)
    if key is None:
        return False
    engine = import_module(settings.SESSION_ENGINE)
    user = await get_user({"session": engine.SessionStore(key)})
    return user.is_authenticated and user.pk == scope["user"].pk


@database_sync_to_async
def _conversation_exists(conversation_id: int) -> bool:
    return Conversation.objects.filter(pk=conversation_id).exists()
