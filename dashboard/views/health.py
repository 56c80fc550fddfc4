"""GET /healthz: is the database reachable, does the channel layer carry a message."""

from __future__ import annotations

import asyncio
import logging
import uuid

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import connection
from django.http import JsonResponse
from django.views.decorators.http import require_GET

logger = logging.getLogger(__name__)
CHECK_TIMEOUT_SECONDS = 2.0


def _database_ok() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return cursor.fetchone() == (1,)
    except Exception:
        logger.warning("healthz: database check failed", exc_info=True)
        return False


async def _channel_layer_ok() -> bool:
    layer = get_channel_layer()
    if layer is None:
        return False
    try:
        channel = await layer.new_channel()
        token = uuid.uuid4().hex
        await layer.send(channel, {"type": "health.ping", "token": token})
        message = await asyncio.wait_for(layer.receive(channel), timeout=CHECK_TIMEOUT_SECONDS)
        return message.get("token") == token
    except Exception:
        logger.warning("healthz: channel layer check failed", exc_info=True)
        return False


@require_GET
async def healthz(request):
    database = await sync_to_async(_database_ok)()
    channel_layer = await _channel_layer_ok()
    healthy = database and channel_layer
    body = {
        "status": "ok" if healthy else "error",
        "database": "ok" if database else "error",
        "channel_layer": "ok" if channel_layer else "error",
    }
    return JsonResponse(body, status=200 if healthy else 503)
