"""Bad OTLP requests: each gets its status code and a google.rpc.Status message, and stores nothing."""

from __future__ import annotations

import base64
import gzip
import json
import sqlite3
import time
import zlib

import httpx
import pytest
from django.db import connection
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from pipeline.models import ApiKey, Span
from pipeline.models.apikeys import Scope
from tests.otlp_support import JSON, PROTOBUF, auth, make_key, row_counts

pytestmark = pytest.mark.django_db(transaction=True)

TRACE, SPAN = bytes.fromhex("5b8efff798038103d269b633813fc60c"), bytes.fromhex("eee19b7ec3c1b174")


def _request(trace_id: bytes = TRACE, span_id: bytes = SPAN, name: str = "chat gpt-4o") -> bytes:
    request = trace_service_pb2.ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = trace_id, span_id, name
    span.start_time_unix_nano, span.end_time_unix_nano = time.time_ns() - 10**9, time.time_ns()
    attribute = span.attributes.add()
    attribute.key, attribute.value.string_value = "gen_ai.operation.name", "chat"
    return request.SerializeToString()


def _post(server, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/traces", content=body, headers=headers, timeout=60)


def _status(reply: httpx.Response) -> status_pb2.Status:
    if reply.headers["content-type"] == PROTOBUF:
        return status_pb2.Status.FromString(reply.content)
    data = reply.json()
    return status_pb2.Status(code=data.get("code", 0), message=data["message"])


def _assert_refused(server, body: bytes, headers: dict[str, str], status: int, message: str) -> status_pb2.Status:
    before = row_counts()
    reply = _post(server, body, headers)
    assert reply.status_code == status, reply.text
    refusal = _status(reply)
    assert message in refusal.message
    assert row_counts() == before
    return refusal


def test_it_rejects_truncated_protobuf(otlp_server):
    body = _request()
    refusal = _assert_refused(otlp_server, body[: len(body) // 2], {**auth(make_key()), "Content-Type": PROTOBUF},
                              400, "not a valid ExportTraceServiceRequest")
    assert refusal.code == 3  # INVALID_ARGUMENT


def test_it_rejects_malformed_json_with_a_json_status(otlp_server):
    reply = _post(otlp_server, b'{"resourceSpans": [', {**auth(make_key()), "Content-Type": JSON})
    assert (reply.status_code, reply.headers["content-type"]) == (400, JSON)
    assert "not valid JSON" in reply.json()["message"]


def test_it_rejects_other_content_types(otlp_server):
    _assert_refused(otlp_server, _request(), {**auth(make_key()), "Content-Type": "text/plain"},
                    415, "application/x-protobuf or application/json")


def test_it_rejects_unknown_content_encodings(otlp_server):
    _assert_refused(otlp_server, _request(), {**auth(make_key()), "Content-Type": PROTOBUF,
                                               "Content-Encoding": "br"}, 415, "not supported")


def test_it_rejects_corrupt_gzip(otlp_server):
    body = gzip.compress(_request())[:-12]
    _assert_refused(otlp_server, body, {**auth(make_key()), "Content-Type": PROTOBUF, "Content-Encoding": "gzip"},
                    400, "truncated")


def test_it_rejects_gzip_bomb(otlp_server):
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    zeros = bytes(1 << 20)
    bomb = b"".join(packer.compress(zeros) for _ in range(80)) + packer.flush()  # 80 MiB inflated
    assert len(bomb) < 200_000
    _assert_refused(otlp_server, bomb, {**auth(make_key()), "Content-Type": PROTOBUF, "Content-Encoding": "gzip"},
                    413, "inflates to more than 67108864 bytes")


def test_it_rejects_a_body_over_the_limit(uvicorn_factory):
    server = uvicorn_factory({"CTXLENS_MAX_INGEST_BYTES": "20000"})
    body = _request(name="x" * 30_000)
    _assert_refused(server, body, {**auth(make_key()), "Content-Type": PROTOBUF}, 413, "larger than 20000 bytes")


def test_it_rejects_spans_with_ids_of_the_wrong_length(otlp_server):
    key = make_key()
    body = _request(trace_id=TRACE[:8])
    before = row_counts()
    reply = _post(otlp_server, body, {**auth(key), "Content-Type": PROTOBUF})
    assert reply.status_code == 200
    partial = trace_service_pb2.ExportTraceServiceResponse.FromString(reply.content).partial_success
    assert partial.rejected_spans == 1
    assert "trace_id is 8 bytes, must be 16" in partial.error_message
    assert row_counts() == before

    mixed = trace_service_pb2.ExportTraceServiceRequest.FromString(_request(span_id=SPAN[:4]))
    mixed.MergeFrom(trace_service_pb2.ExportTraceServiceRequest.FromString(_request()))
    reply = _post(otlp_server, mixed.SerializeToString(), {**auth(key), "Content-Type": PROTOBUF})
    partial = trace_service_pb2.ExportTraceServiceResponse.FromString(reply.content).partial_success
    assert (partial.rejected_spans, "span_id is 4 bytes" in partial.error_message) == (1, True)
    assert list(Span.objects.values_list("span_id", flat=True)) == [SPAN.hex()]  # the good one is stored


def test_it_rejects_json_with_base64_ids(otlp_server):
    span = {"traceId": base64.b64encode(TRACE).decode(), "spanId": base64.b64encode(SPAN).decode(),
            "name": "chat", "startTimeUnixNano": str(time.time_ns())}
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()
    before = row_counts()
    reply = _post(otlp_server, body, {**auth(make_key()), "Content-Type": JSON})
    assert (reply.status_code, reply.headers["content-type"]) == (200, JSON)
    partial = reply.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1"
    assert "hex, not base64" in partial["errorMessage"]
    assert row_counts() == before


@pytest.mark.parametrize("path", ["/v1/traces", "/v1/logs", "/v1/metrics"])
@pytest.mark.parametrize("content_type", [PROTOBUF, JSON])
def test_it_refuses_a_host_it_does_not_serve_before_the_key(otlp_server, path, content_type):
    """ALLOWED_HOSTS, as Django checks it for every other page, with an OTLP status saying so; before
    the key is looked up (this request has none)."""
    before = row_counts()
    host = f"{path.rsplit('/', 1)[1]}.{content_type.rsplit('/', 1)[1]}.evil.example"
    reply = httpx.post(f"{otlp_server.url}{path}", content=_request() if content_type == PROTOBUF else b"{}",
                       timeout=60, headers={"Content-Type": content_type, "Host": host})
    assert reply.status_code == 400 and reply.headers["content-type"] == content_type
    assert _status(reply).message == "the Host header names a host this server does not serve"
    assert row_counts() == before
    assert f"Invalid HTTP_HOST header: '{host}'" in otlp_server.log()


def test_headers_django_cannot_read_are_a_400_before_the_key(otlp_server):
    reply = _post(otlp_server, _request(), {"Content-Type": f"{PROTOBUF}; charset*=bogus''x"})
    assert reply.status_code == 400
    assert _status(reply).message == "the request's headers cannot be read"


@pytest.mark.parametrize(("method", "path"), [("POST", "/api/ingest/"), ("GET", "/healthz"), ("GET", "/")])
def test_headers_django_cannot_read_are_a_400_on_every_page(otlp_server, method, path):
    """Django raised ValueError building such a request: a 500 for any page, REST ingest included."""
    reply = httpx.request(method, f"{otlp_server.url}{path}", content=b"{}", timeout=60, headers={
        **auth(make_key()), "Content-Type": "application/json; charset*=bogus''x"})
    assert reply.status_code == 400
    if path.startswith("/api/"):
        assert reply.json() == {"detail": "the request's headers cannot be read"}
    else:
        assert reply.headers["content-type"].startswith("text/plain")
        assert reply.text == "the request's headers cannot be read"


@pytest.mark.parametrize(("path", "expected"), [
    ("/api/conversations/", "application/json"), ("/conversations/", "text/plain")])
def test_a_page_for_a_host_it_does_not_serve_is_a_400_that_says_so(otlp_server, path, expected):
    reply = httpx.get(f"{otlp_server.url}{path}", timeout=60, headers={"Host": "page.evil.example"})
    assert reply.status_code == 400 and reply.headers["content-type"].startswith(expected)
    message = "the Host header names a host this server does not serve"
    assert reply.json() == {"detail": message} if path.startswith("/api/") else reply.text == message


def test_it_rejects_requests_without_a_key(otlp_server):
    _assert_refused(otlp_server, _request(), {"Content-Type": PROTOBUF}, 401, "missing API key")


def test_it_rejects_a_wrong_key(otlp_server):
    make_key()
    _assert_refused(otlp_server, _request(), {**auth("ctx_not-a-real-key"), "Content-Type": PROTOBUF},
                    401, "invalid or revoked API key")


def test_it_rejects_a_revoked_key(otlp_server):
    key, raw = ApiKey.generate("old", scope=Scope.INGEST)
    key.revoke()
    refusal = _assert_refused(otlp_server, _request(), {**auth(raw), "Content-Type": JSON}, 401,
                              "invalid or revoked API key")
    assert refusal.code == 16  # UNAUTHENTICATED


def test_it_rejects_a_read_only_key(otlp_server):
    refusal = _assert_refused(otlp_server, _request(), {**auth(make_key(Scope.READ)), "Content-Type": PROTOBUF},
                              403, "does not have the 'ingest' scope")
    assert refusal.code == 7  # PERMISSION_DENIED


def test_it_answers_503_with_retry_after_while_the_database_is_locked(uvicorn_factory):
    server = uvicorn_factory({"CTXLENS_SQLITE_BUSY_TIMEOUT": "1"})
    if connection.vendor != "sqlite":
        pytest.skip("holds SQLite's write lock")
    key = make_key()
    warm_up = _request(trace_id=bytes(15) + b"\1", name="warm-up")  # records the key's use: a write
    assert _post(server, warm_up, {**auth(key), "Content-Type": PROTOBUF}).status_code == 200
    blocker = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        reply = _post(server, _request(), {**auth(key), "Content-Type": PROTOBUF})
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert (reply.status_code, reply.headers["retry-after"]) == (503, "1")
    assert "retry later" in _status(reply).message
    assert not Span.objects.filter(trace_id=TRACE.hex()).exists()
    assert _post(server, _request(), {**auth(key), "Content-Type": PROTOBUF}).status_code == 200
    assert Span.objects.filter(trace_id=TRACE.hex()).count() == 1
