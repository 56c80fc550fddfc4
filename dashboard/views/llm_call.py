"""One LLM call: the messages the model saw, what it answered, and its context-window bar."""

from __future__ import annotations

from dataclasses import dataclass

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from dashboard.context_bars import context_bar
from dashboard.timeline import assistant_thoughts
from dashboard.views.common import page
from pipeline.ingest.normalise.messages import message_text
from pipeline.models import LLMCall

MAX_MESSAGE_CHARS = 50_000


@dataclass(frozen=True)
class MessageView:
    index: int
    role: str
    text: str
    length: int  # characters before clipping

    @property
    def clipped(self) -> bool:
        return self.length > len(self.text)


def message_views(messages: object) -> list[MessageView]:
    """Role and text of each message in the GenAI parts shape, long texts clipped."""
    views = []
    for index, message in enumerate(messages if isinstance(messages, list) else []):
        if not isinstance(message, dict):
            continue
        text = message_text(message)
        views.append(MessageView(index, str(message.get("role", "")), text[:MAX_MESSAGE_CHARS], len(text)))
    return views


@page
def llm_call_detail(request: HttpRequest, pk: int) -> HttpResponse:
    call = get_object_or_404(LLMCall.objects.select_related("conversation", "round"), pk=pk)
    context = {
        "nav": "conversations",
        "call": call,
        "conversation": call.conversation,
        "bar": context_bar(call),
        "thoughts": assistant_thoughts(call),
        "input_messages": message_views(call.input_messages),
        "output_messages": message_views(call.output_messages),
        "tool_calls": call.tool_calls.order_by("started_at"),
    }
    return render(request, "dashboard/llm_call.html", context)
