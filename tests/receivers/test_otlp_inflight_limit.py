"""CTXLENS_MAX_INFLIGHT_BYTES: over the process's cap on request bodies held, 503 + Retry-After; the
bytes are given back however a request ends, so the next one goes through."""

from __future__ import annotations

import time

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from google.rpc import status_pb2

from pipeline.models import Span
from tests.otlp_support import PROTOBUF, auth, make_key
from tests.receivers.http_wire import start_upload
from tests.receivers.test_otlp_errors import _request

pytestmark = pytest.mark.django_db(transaction=True)

LIMITS = {"CTXLENS_MAX_INGEST_BYTES": "100000", "CTXLENS_MAX_INFLIGHT_BYTES": "150000"}


def _post_bytes(server, headers: dict[str, str], body: bytes):
    import httpx

    reply = httpx.post(f"{server.url}/v1/traces", content=body, headers=headers, timeout=30)
    return reply.status_code, reply.headers, reply.content


def _until(condition, seconds: float = 15):
    """Poll a real server until `condition()` returns something true (the server works on its own time)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"not within {seconds} s")


@pytest.mark.parametrize("ending", ["disconnect", "complete"])
def test_over_the_inflight_cap_it_answers_503_and_releases_the_bytes_when_a_request_ends(uvicorn_factory, ending):
    server = uvicorn_factory(LIMITS)
    key = make_key()
    headers = {**auth(key), "Content-Type": PROTOBUF}
    holder = start_upload(server.port, "/v1/traces", headers, 90_000)  # holds 90 000 of the 150 000 bytes
    holder.send(1000)
    try:
        def refused():  # a 70 000-byte body does not fit beside it once the holder is admitted
            status, reply_headers, body = _post_bytes(server, headers, bytes(70_000))
            return (status, reply_headers, body) if status == 503 else None

        status, reply_headers, body = _until(refused)
        assert reply_headers["Retry-After"] == "1"
        assert "CTXLENS_MAX_INFLIGHT_BYTES" in status_pb2.Status.FromString(body).message
        assert status_pb2.Status.FromString(body).code == 14  # UNAVAILABLE: exporters retry it
    finally:
        if ending == "disconnect":
            holder.close()
    if ending == "complete":
        finished = holder.finish()  # 90 000 zero bytes: not a valid export request, refused with 400
        holder.close()
        assert finished.status == 400

    one_span = _request()  # the reservation was released: a following request goes through
    assert _until(lambda: _post_bytes(server, headers, one_span)[0] == 200)
    assert Span.objects.count() == 1


def test_a_chunked_body_is_held_as_it_arrives(uvicorn_factory):
    import httpx

    server = uvicorn_factory(LIMITS)
    headers = {**auth(make_key()), "Content-Type": PROTOBUF}

    def chunks():  # no Content-Length: the router counts the bytes as they come
        for _ in range(4):
            yield bytes(40_000)

    reply = httpx.post(f"{server.url}/v1/traces", content=chunks(), headers=headers, timeout=30)
    assert reply.status_code == 413  # 160 000 bytes: past the 100 000-byte body limit first

    one_span = _request()
    assert httpx.post(f"{server.url}/v1/traces", content=iter([one_span]), headers=headers,
                      timeout=30).status_code == 200


def test_the_cap_must_admit_a_body_of_the_largest_accepted_size(settings):
    settings.CTXLENS_MAX_INGEST_BYTES = 1000
    settings.CTXLENS_MAX_INFLIGHT_BYTES = 999
    with pytest.raises(SystemCheckError, match="pipeline.E064"):
        call_command("check")
    settings.CTXLENS_MAX_INFLIGHT_BYTES = 1000
    call_command("check")
