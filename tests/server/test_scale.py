"""The scale path: several ASGI workers share live updates and rate limits through Redis.

Two uvicorn processes on the same database: a browser's websocket on worker A hears about
spans ingested on worker B. Runs when REDIS_URL is set (CI's second pass sets it together
with a PostgreSQL DATABASE_URL); with the in-memory channel layer each process is an island,
which is the one-process default this path exists to go beyond.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from django.test import Client
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult
from websockets.sync.client import connect

from pipeline.ingest.ratelimit import MAX_RETRY_AFTER_SECONDS
from pipeline.models import ApiKey, Conversation
from tests.agent_traces import record_turns, span_count

pytestmark = [
    pytest.mark.scale,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not os.environ.get("REDIS_URL"),
        reason="needs REDIS_URL: without the Redis channel layer and cache, workers share no live updates "
        "or rate limits (run as .ci/run's second pass, DATABASE_URL=postgres://… REDIS_URL=redis://…)",
    ),
]


@pytest.fixture
def session_cookie(alice) -> str:
    client = Client()
    client.force_login(alice)
    return f"sessionid={client.cookies['sessionid'].value}"


def live_socket(server, path: str, cookie: str):
    return connect(f"{server.ws_url}{path}", additional_headers={"Cookie": cookie, "Origin": server.url},
                   open_timeout=10)


def changes_until(ws, wanted, timeout: float = 15) -> dict:
    """The first `changes` message for which `wanted(message)` holds. Others may share the Redis
    server (another test run's ingest then shows up on the same groups), so unrelated ones are skipped."""
    deadline = time.monotonic() + timeout
    while True:
        message = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
        if message["type"] == "changes" and wanted(message):
            return message


def send(server, key: str, conversation: str, turns: int = 1) -> None:
    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers={"Authorization": f"Bearer {key}"})
    assert exporter.export(record_turns(conversation, turns=turns)) == SpanExportResult.SUCCESS


def test_a_browser_on_worker_a_sees_spans_ingested_on_worker_b(uvicorn_factory, session_cookie):
    worker_a, worker_b = uvicorn_factory(), uvicorn_factory()
    key = ApiKey.generate("agent", scope="ingest")[1]

    with live_socket(worker_a, "/ws/live/", session_cookie) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "hello"
        send(worker_b, key, "across-workers", turns=2)
        conversation = Conversation.objects.get(external_id="across-workers")
        changes = changes_until(ws, lambda m: conversation.pk in m["new_conversation_ids"])

    assert changes["spans"] >= span_count(turns=2)


def test_a_conversation_page_on_worker_b_follows_ingest_on_worker_a(uvicorn_factory, session_cookie):
    worker_a, worker_b = uvicorn_factory(), uvicorn_factory()
    key = ApiKey.generate("agent", scope="ingest")[1]
    send(worker_a, key, "followed")
    conversation = Conversation.objects.get(external_id="followed")

    with live_socket(worker_b, f"/ws/conversations/{conversation.pk}/", session_cookie) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "hello"
        send(worker_a, key, "followed")  # a second turn of the same conversation
        changes = changes_until(ws, lambda m: True)  # this group hears only about this conversation

    assert changes["conversation_ids"] == [conversation.pk]
    assert len(changes["round_ids"]) == 1 and conversation.rounds.count() == 2


def test_workers_share_one_rate_limit_per_key(uvicorn_factory):
    import httpx

    env = {"CTXLENS_INGEST_RATE_LIMIT": "0.001", "CTXLENS_INGEST_RATE_WINDOW": "3600"}  # 3.6 spans an hour
    worker_a, worker_b = uvicorn_factory(env), uvicorn_factory(env)
    key = ApiKey.generate("agent", scope="ingest")[1]
    send(worker_a, key, "spends-the-budget")  # 6 spans: crosses the budget on worker A

    reply = httpx.post(f"{worker_b.url}/v1/traces", content=b"", timeout=10, headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/x-protobuf"})

    # Throttled, not failed: 429 with a Retry-After the OTel exporters wait out within their deadline.
    assert reply.status_code == 429, reply.text
    assert 1 <= int(reply.headers["Retry-After"]) <= MAX_RETRY_AFTER_SECONDS
