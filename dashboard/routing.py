"""Websocket routes (Channels)."""

from __future__ import annotations

from django.urls import path

from dashboard.consumers import ConversationConsumer, LiveConsumer

websocket_urlpatterns = [
    path("ws/live/", LiveConsumer.as_asgi()),
    path("ws/conversations/<int:conversation_id>/", ConversationConsumer.as_asgi()),
]
