"""Websocket consumers: /ws/live/ (overview and lists) and /ws/conversations/<id>/.

Thin by design: authenticate through the session, join one group, and forward the
`live.changes` events that dashboard/live.py sends, merged so that a browser gets at most
one message per `CTXLENS_LIVE_INTERVAL_MS` however fast ingest commits. Pages fetch what
changed over HTTP (the same partials they render on first load).
"""

from __future__ import annotations

import asyncio
import time
from importlib import import_module

from channels.auth import get_user
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from dashboard.live import LIVE_GROUP, LiveChanges, LiveEvent, conversation_group, merge_changes
from pipeline.conf import ctxlens_config
from pipeline.models import Conversation

# Close codes the page's live socket understands (4000-4999 are for applications).
CLOSE_UNAUTHENTICATED = 4401  # go to the login page instead of reconnecting
CLOSE_NOT_FOUND = 4404  # the conversation does not exist


class ChangesConsumer(AsyncJsonWebsocketConsumer):
    """Join one group and forward its changes, coalesced."""

    group: str | None = None

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
        self.interval = ctxlens_config().live_interval_ms / 1000
        self.pending: LiveChanges | None = None
        self.flush_task: asyncio.Task | None = None
        self.last_sent = 0.0
        await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.send_json({"type": "hello", "interval_ms": round(self.interval * 1000)})

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if getattr(self, "flush_task", None) is not None:
            self.flush_task.cancel()

    async def receive_json(self, content: object, **kwargs: object) -> None:
        if isinstance(content, dict) and content.get("type") == "ping":
            # The page pings every 30 s: a socket whose session has ended (logged out in another
            # tab, expired, password changed) is closed, and the page goes to the login page.
            if not await _still_signed_in(self.scope):
                await self.close(code=CLOSE_UNAUTHENTICATED)
                return
            await self.send_json({"type": "pong"})

    async def live_changes(self, event: LiveEvent) -> None:
        changes = event["changes"]
        self.pending = changes if self.pending is None else merge_changes(self.pending, changes)
        if self.flush_task is None:
            self.flush_task = asyncio.create_task(self.flush())

    async def flush(self) -> None:
        """Send what is pending, no sooner than one interval after the last send."""
        wait = self.last_sent + self.interval - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        changes, self.pending, self.flush_task = self.pending, None, None
        self.last_sent = time.monotonic()
        if changes is not None:
            await self.send_json({"type": "changes", **changes})


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
