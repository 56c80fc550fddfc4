"""Helpers for the OTLP tests: one daphne per test module, keys, spans built with the real SDK."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from pipeline.models import ApiKey, Conversation, LLMCall, Round, Span, ToolCall
from pipeline.models.apikeys import Scope
from tests.conftest import LiveServer, start_daphne

PROTOBUF, JSON = "application/x-protobuf", "application/json"


@pytest.fixture(scope="module")
def otlp_daphne(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[LiveServer]:
    """A real daphne on the test database, shared by the tests of one module (start-up is slow)."""
    tmp = tmp_path_factory.mktemp("otlp-server")
    with django_db_blocker.unblock():
        server = start_daphne(tmp, {"CTXLENS_ARTIFACT_DIR": str(tmp / "artifacts")})
    yield server
    server.stop()


@pytest.fixture
def otlp_server(otlp_daphne, transactional_db) -> Iterator[LiveServer]:
    """The module's daphne, for one test. What the server writes is visible to the test, and every
    table is emptied after it, once the server has finished the token counts it fills in after
    its replies (emptying the tables while it writes them deadlocks on PostgreSQL)."""
    yield otlp_daphne
    wait_for_deferred_tokens()


def wait_for_deferred_tokens(seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while LLMCall.objects.filter(tokens_pending=True).exists() or ToolCall.objects.filter(tokens_pending=True).exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"the server left token counts pending for {seconds} s")
        time.sleep(0.1)


def make_key(scope: str = Scope.INGEST) -> str:
    return ApiKey.generate("test", scope=scope)[1]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def row_counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in (Span, Conversation, Round, LLMCall, ToolCall)}
