"""POST /v1/traces and POST /v1/logs: the OTLP/HTTP receiver (protobuf or JSON, gzip/deflate).

Plain async views, not DRF: OTLP has its own error format (google.rpc.Status in the request's
encoding) and the hot path should stay short. The flow — key, rate limit, size, inflate,
decode, store — is `pipeline.ingest.service.ingest`, run on an ordinary worker thread with
only its transactions queued on the ingest writer thread (pipeline.ingest.write.writer_threads),
so a request whose decoding takes seconds (tens of thousands of spans, a huge prompt) does not
hold the writer while the others wait, and a huge batch is stored a chunk per transaction.
Served through config.asgi (uvicorn, daphne), a POST never reaches these views: the ASGI router in front
(pipeline.receivers.otlp_router) checks the key before reading the body and runs
`export_reply` itself; the views serve the other methods, and Django's own handlers (the test
client, WSGI).

This module only translates an outcome into what OTLP clients expect: 200 with an
Export*ServiceResponse (partial_success when some items were rejected), 400 malformed, 401/403
key, 413 too large, 415 content type or encoding, 429 + Retry-After when the key is over its
rate, 503 when the database is busy or unreachable (+ Retry-After when it is locked or the
server holds too many bodies)
(exporters retry 429 and 503; they do
not retry 500).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from pipeline.ingest import service
from pipeline.ingest.decode import otlp
from pipeline.ingest.service import Failed, IngestRequest, Kind, Outcome, Rejected
from pipeline.ingest.write import deferred
from pipeline.ingest.write.writer_threads import keep_connections_on, writer
from pipeline.insight import finding_counts

if TYPE_CHECKING:
    from pipeline.models import ApiKey


# gRPC status codes carried in google.rpc.Status.code
T = TypeVar("T")

INVALID_ARGUMENT, DEADLINE_EXCEEDED, PERMISSION_DENIED, RESOURCE_EXHAUSTED = 3, 4, 7, 8
UNIMPLEMENTED, INTERNAL, UNAVAILABLE, UNAUTHENTICATED = 12, 13, 14, 16
STATUS_CODE = {Kind.INVALID_ARGUMENT: INVALID_ARGUMENT, Kind.UNAUTHENTICATED: UNAUTHENTICATED,
               Kind.PERMISSION_DENIED: PERMISSION_DENIED, Kind.TIMED_OUT: DEADLINE_EXCEEDED,
               Kind.TOO_LARGE: RESOURCE_EXHAUSTED, Kind.UNSUPPORTED: INVALID_ARGUMENT, Kind.UNAVAILABLE: UNAVAILABLE,
               Kind.THROTTLED: RESOURCE_EXHAUSTED, Kind.INTERNAL: INTERNAL}


@dataclass
class Reply:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)


def reply_type(content_type: str) -> str:
    """Errors and responses are protobuf for protobuf requests and JSON otherwise."""
    return otlp.PROTOBUF if content_type == otlp.PROTOBUF else otlp.JSON


def failure_reply(failed: Failed, content_type: str) -> Reply:
    """An OTLP failure: the HTTP status and a google.rpc.Status with the service's message."""
    encoding = reply_type(content_type)
    headers = {"Retry-After": str(failed.retry_after)} if failed.retry_after else {}
    body = otlp.status_body(encoding, STATUS_CODE[failed.kind], failed.message)
    return Reply(failed.kind.value, body, encoding, headers)


def outcome_reply(outcome: Outcome, content_type: str, logs: bool) -> Reply:
    if isinstance(outcome, Failed):
        return failure_reply(outcome, content_type)
    rejected, message = (outcome.rejected, outcome.message) if isinstance(outcome, Rejected) else (0, "")
    return Reply(200, otlp.export_response(content_type, rejected, message, logs=logs), content_type)


# The threads that decode and authenticate OTLP requests: a pool as large as asyncio's default
# executor, whose threads keep their database connection (pipeline.ingest.write.writer_threads).
THREAD_PREFIX = "ctxlens-otlp"
WORKERS = min(32, (os.cpu_count() or 1) + 4)
_workers = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix=THREAD_PREFIX)
keep_connections_on(THREAD_PREFIX)


def off_the_loop(work: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """`work` on a worker thread, with that thread's database connection checked before and
    released after as Django does around a request (CONN_HEALTH_CHECKS): a connection a database
    restart broke is replaced instead of failing every later request."""

    def run(*args: Any, **kwargs: Any) -> T:
        close_old_connections()
        try:
            return work(*args, **kwargs)
        finally:
            close_old_connections()

    return sync_to_async(run, thread_sensitive=False, executor=_workers)


def on_writer(work: Callable[[], Any]) -> Any:
    """Run one ingest transaction on the writer thread and wait for it (from a worker thread)."""
    return writer().submit(work).result()


def post_only(content_type: str) -> Reply:
    """405 for any method but POST, in the encoding the client sent."""
    encoding = reply_type(content_type)
    return Reply(405, otlp.status_body(encoding, UNIMPLEMENTED, "use POST"), encoding, {"Allow": "POST"})


def http_response(reply: Reply) -> HttpResponse:
    response = HttpResponse(reply.body, status=reply.status, content_type=reply.content_type)
    for name, value in reply.headers.items():
        response[name] = value
    return response


def export_reply(body: bytes, content_type: str, content_encoding: str, authorization: str | None,
                 key: ApiKey | None, logs: bool) -> Reply:
    """The export flow on a worker thread (`off_the_loop`): ingest, then the reply. With `key`,
    the key was checked already (otlp_router, before the body was read)."""
    ingest_request = IngestRequest(source="otlp", body=body, content_type=content_type, logs=logs,
                                   content_encoding=content_encoding, authorization=authorization)
    return outcome_reply(service.ingest(ingest_request, key=key, run_store=on_writer), content_type, logs)


def resume_background_work() -> None:
    """After an export: once per process, the token work an earlier process left unfinished, and
    the finding counts it left stale."""
    deferred.resume()
    finding_counts.resume()


async def _export(request: HttpRequest, logs: bool) -> HttpResponse:
    request.get_host()  # ALLOWED_HOSTS: 400 if not allowed (checked even where no middleware is)
    content_type = (request.content_type or "").strip().lower()
    if request.method != "POST":
        reply = post_only(content_type)
    else:
        reply = await off_the_loop(export_reply)(
            request.body, content_type, request.headers.get("Content-Encoding", ""),
            request.headers.get("Authorization"), None, logs,
        )
    resume_background_work()
    return http_response(reply)


@csrf_exempt
async def otlp_traces(request: HttpRequest) -> HttpResponse:
    return await _export(request, logs=False)


@csrf_exempt
async def otlp_logs(request: HttpRequest) -> HttpResponse:
    return await _export(request, logs=True)
