"""An OTLP request without a valid key is refused from its headers: its body is never buffered."""

from __future__ import annotations

import pytest
from google.rpc import status_pb2

from pipeline.models.apikeys import Scope
from tests.otlp_support import PROTOBUF, auth, make_key
from tests.receivers.http_wire import memory_kib, post_streaming

pytestmark = pytest.mark.django_db(transaction=True)

MiB = 1024 * 1024
BODY = 60 * MiB


def _refused_big_post(server, headers: dict[str, str]):
    """A 60 MiB POST; the reply, and the server's memory before and after, in KiB."""
    before = memory_kib(server.process.pid)
    reply = post_streaming(server.port, "/v1/traces", {"Content-Type": PROTOBUF, **headers}, BODY)
    after = memory_kib(server.process.pid)
    return reply, before, after


@pytest.mark.parametrize("key_scope, status, message", [
    (None, 401, "missing API key"),
    (Scope.READ, 403, "does not have the 'ingest' scope"),
], ids=["no-key", "read-only-key"])
def test_an_unauthorised_60_mib_post_is_answered_before_its_body_is_read(uvicorn_factory, key_scope, status,
                                                                         message):
    server = uvicorn_factory()
    headers = auth(make_key(key_scope)) if key_scope else {}
    warm_up = post_streaming(server.port, "/v1/traces", {"Content-Type": PROTOBUF, **headers}, 1024)
    assert warm_up.status == status  # code paths loaded: what follows is the body's cost alone

    reply, before, after = _refused_big_post(server, headers)

    print(f"\n{status}: answered after {reply.sent_when_answered / MiB:.1f} MiB of {BODY / MiB:.0f} MiB sent; "
          f"server VmRSS {before['VmRSS'] / 1024:.1f} -> {after['VmRSS'] / 1024:.1f} MiB, "
          f"VmHWM {before['VmHWM'] / 1024:.1f} -> {after['VmHWM'] / 1024:.1f} MiB")
    assert reply.status == status
    # The reply came while most of the body was still unsent: the server stopped reading after the
    # first socket buffers' worth. The old router read all 60 MiB first, then answered.
    assert reply.sent_when_answered < BODY // 4, reply.sent_when_answered
    # The server's peak memory did not grow by anything like the body (the old router's grew by
    # twice its size: the chunks, then the joined body).
    growth = (after["VmHWM"] - before["VmHWM"]) * 1024
    assert growth < BODY // 4, (before, after)
    assert message in status_pb2.Status.FromString(reply.body).message, reply


@pytest.mark.parametrize("key_scope, status, message", [
    (None, 401, "missing API key"),
    (Scope.READ, 403, "does not have the 'ingest' scope"),
], ids=["no-key", "read-only-key"])
def test_an_unauthorised_60_mib_rest_post_is_answered_before_its_body_is_read(uvicorn_factory, key_scope, status,
                                                                              message):
    """Django's ASGI handler reads a whole body before any view or DRF authentication runs (found
    in review): /api/ingest/ now goes through the same header-first check."""
    import json

    server = uvicorn_factory()
    headers = {"Content-Type": "application/json", **(auth(make_key(key_scope)) if key_scope else {})}
    warm_up = post_streaming(server.port, "/api/ingest/", headers, 1024)
    assert warm_up.status == status

    before = memory_kib(server.process.pid)
    reply = post_streaming(server.port, "/api/ingest/", headers, BODY)
    after = memory_kib(server.process.pid)

    assert reply.status == status
    assert reply.sent_when_answered < BODY // 4, reply.sent_when_answered
    assert (after["VmHWM"] - before["VmHWM"]) * 1024 < BODY // 4, (before, after)
    assert message in json.loads(reply.body)["detail"]
