"""Many browsers on one server: every one of them learns of every new conversation.

A real uvicorn, real websockets, spans POSTed through OTLP by several exporters at once. With a
channel-layer group per browser, each commit was one message into each browser's channel, and
a channel that held `capacity` of them dropped the rest: under load a browser missed
conversations. The process's hub (dashboard/hub.py) reads each group once and hands every
socket the same merged frame, so nothing is dropped however many sockets listen.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.test import Client
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult
from websockets.asyncio.client import connect

from pipeline.models import ApiKey, Conversation
from tests.agent_traces import record_turns

pytestmark = pytest.mark.django_db(transaction=True)

CLIENTS = 200  # 50 do not drop messages with the per-browser groups on this machine; 200 do
CONVERSATIONS = 400
SENDERS = 8


@pytest.fixture
def session_cookie(alice) -> str:
    client = Client()
    client.force_login(alice)
    return f"sessionid={client.cookies['sessionid'].value}"


def post_conversations(server, key: str, names: list[str]) -> None:
    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers={"Authorization": f"Bearer {key}"})
    for name in names:
        assert exporter.export(record_turns(name)) == SpanExportResult.SUCCESS


async def listen_all(server, cookie: str, ingest) -> list[set[int]]:
    """Open CLIENTS sockets, run `ingest` (blocking) on threads, and collect what each socket hears
    until the conversations it names are all heard of (or 60 s pass)."""
    headers = {"Cookie": cookie, "Origin": server.url}
    sockets = [await connect(f"{server.ws_url}/ws/live/", additional_headers=headers, open_timeout=30)
               for _ in range(CLIENTS)]
    heard: list[set[int]] = [set() for _ in sockets]
    try:
        for ws in sockets:
            assert json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] == "hello"

        async def collect(ws, into: set[int], done: asyncio.Event) -> None:
            while not done.is_set():
                try:
                    message = json.loads(await asyncio.wait_for(ws.recv(), 0.5))
                except TimeoutError:
                    continue
                assert not message.get("overflow")
                into.update(message.get("new_conversation_ids", []))

        done = asyncio.Event()
        collectors = [asyncio.create_task(collect(ws, into, done)) for ws, into in zip(sockets, heard)]
        expected = await asyncio.to_thread(ingest)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while loop.time() < deadline and not all(expected <= into for into in heard):
            await asyncio.sleep(0.2)
        done.set()
        await asyncio.gather(*collectors)
        return [expected - into for into in heard]
    finally:
        for ws in sockets:
            await ws.close()


def test_every_browser_learns_of_every_new_conversation(uvicorn_factory, session_cookie):
    server = uvicorn_factory()
    key = ApiKey.generate("agent", scope="ingest")[1]
    names = [f"fanout-{i}" for i in range(CONVERSATIONS)]

    def ingest() -> set[int]:
        with ThreadPoolExecutor(SENDERS) as pool:
            list(pool.map(lambda part: post_conversations(server, key, part),
                          [names[i::SENDERS] for i in range(SENDERS)]))
        return set(Conversation.objects.filter(external_id__in=names).values_list("pk", flat=True))

    missed = asyncio.run(listen_all(server, session_cookie, ingest))

    assert [len(m) for m in missed] == [0] * CLIENTS
