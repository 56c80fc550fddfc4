"""Helpers for the OTLP tests: one daphne per test module, keys, spans built with the real SDK."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pipeline.models import ApiKey, Conversation, LLMCall, Round, Span, ToolCall
from pipeline.models.apikeys import Scope
from tests.conftest import LiveServer, start_daphne

PROTOBUF, JSON = "application/x-protobuf", "application/json"


@pytest.fixture(scope="module")
def otlp_server(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[LiveServer]:
    """A real daphne on the test database, shared by the tests of one module (start-up is slow).

    Tests that use it take `transactional_db`, so what the server writes is visible to them and
    every table is emptied between tests.
    """
    tmp = tmp_path_factory.mktemp("otlp-server")
    with django_db_blocker.unblock():
        server = start_daphne(tmp, {"CTXLENS_ARTIFACT_DIR": str(tmp / "artifacts")})
    yield server
    server.stop()


def make_key(scope: str = Scope.INGEST) -> str:
    return ApiKey.generate("test", scope=scope)[1]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def row_counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in (Span, Conversation, Round, LLMCall, ToolCall)}
