"""Helpers for the OTLP tests (their uvicorn is conftest's otlp_server): keys, row counts, waits."""

from __future__ import annotations

import time

from django.db.models import Q

from pipeline.models import ApiKey, Conversation, LLMCall, Round, Span, ToolCall
from pipeline.models.apikeys import Scope

PROTOBUF, JSON = "application/x-protobuf", "application/json"


def wait_for_deferred_tokens(seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while LLMCall.objects.filter(tokens_pending=True).exists() or ToolCall.objects.filter(
            Q(tokens_pending=True) | Q(levels_pending=True)).exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"the server left token counts pending for {seconds} s")
        time.sleep(0.1)


def make_key(scope: str = Scope.INGEST) -> str:
    return ApiKey.generate("test", scope=scope)[1]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def row_counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in (Span, Conversation, Round, LLMCall, ToolCall)}
