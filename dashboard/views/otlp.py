"""POST /v1/traces and POST /v1/logs: the OTLP/HTTP receiver (protobuf or JSON, gzip/deflate).

Plain async views, not DRF: OTLP has its own error format (google.rpc.Status in the request's
encoding) and the hot path should stay short. The work — key check, inflate, decode, store —
runs in one `sync_to_async` call on the ingest writer thread (pipeline.ingest.writer). Replies
follow the OTLP spec: 200 with an Export*ServiceResponse (partial_success when some spans were
rejected), 400 malformed, 401/403 key, 413 too large, 415 content type or encoding, 503 +
Retry-After when the database is busy (exporters retry 503; they do not retry 500).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async
from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from pipeline.artifacts import ArtifactStorageError
from pipeline.conf import ctxlens_config
from pipeline.ingest import deferred, otlp
from pipeline.ingest.auth import ApiKeyError, check_bearer_key
from pipeline.ingest.decompress import BodyTooLarge, CorruptBody, UnsupportedEncoding, decompress
from pipeline.ingest.store import PreparedBatch, prepare_spans, store_prepared
from pipeline.ingest.writer import writer
from pipeline.ratelimit import check_ingest_rate

logger = logging.getLogger(__name__)

# gRPC status codes carried in google.rpc.Status.code
INVALID_ARGUMENT, PERMISSION_DENIED, RESOURCE_EXHAUSTED, UNIMPLEMENTED = 3, 7, 8, 12
UNAVAILABLE, UNAUTHENTICATED = 14, 16
RETRY_AFTER_SECONDS = "1"
GRPC_CODE = {400: INVALID_ARGUMENT, 401: UNAUTHENTICATED, 403: PERMISSION_DENIED, 405: UNIMPLEMENTED,
             413: RESOURCE_EXHAUSTED, 415: INVALID_ARGUMENT, 503: UNAVAILABLE}


@dataclass
class Reply:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)


def error_reply(status: int, content_type: str, message: str) -> Reply:
    """An OTLP failure: google.rpc.Status, protobuf for protobuf requests and JSON otherwise."""
    reply_type = otlp.PROTOBUF if content_type == otlp.PROTOBUF else otlp.JSON
    headers = {"Retry-After": RETRY_AFTER_SECONDS} if status == 503 else {}
    return Reply(status, otlp.status_body(reply_type, GRPC_CODE.get(status, 2), message), reply_type, headers)


def throttled(content_type: str, retry_after: int) -> Reply:
    reply = error_reply(503, content_type, f"this API key is over its ingest rate limit; retry in {retry_after} s")
    reply.headers["Retry-After"] = str(retry_after)
    return reply


@dataclass
class Decoded:
    """A request that passed every check and is decoded: what the writer thread stores."""

    content_type: str
    logs: bool
    decoded: otlp.Decoded
    batch: PreparedBatch


def _guarded(content_type: str, work: Callable[[], Reply | Decoded]) -> Reply | Decoded:
    """Run `work`, turning transient storage problems into 503 + Retry-After (never a 500)."""
    try:
        return work()
    except ArtifactStorageError as exc:  # a full artifact disk: nothing was stored, the client retries
        logger.error("OTLP ingest answered 503: %s", exc)
        return error_reply(503, content_type, str(exc))
    except (OperationalError, InterfaceError) as exc:  # locked / connection lost: the client retries
        logger.warning("OTLP ingest answered 503: %s", exc)
        return error_reply(503, content_type, "the database is busy; retry later")
    except DatabaseError:
        logger.exception("OTLP ingest failed")
        return error_reply(503, content_type, "the database could not store the batch; retry later")


def _decode(body: bytes, content_type: str, content_encoding: str, authorization: str | None,
            logs: bool) -> Reply | Decoded:
    """Key, rate limit, inflate, decode, normalise: everything before the transaction."""
    try:
        key = check_bearer_key(authorization, "ingest")
    except ApiKeyError as exc:
        return error_reply(exc.status, content_type, exc.message)
    already = check_ingest_rate(key, 0)
    if not already.allowed:  # over the key's budget: do not even decode
        return throttled(content_type, already.retry_after)
    if content_type not in (otlp.PROTOBUF, otlp.JSON):
        return error_reply(415, content_type, "Content-Type must be application/x-protobuf or application/json")
    limit = ctxlens_config().max_ingest_bytes
    try:
        raw = decompress(body, content_encoding, limit)
    except BodyTooLarge as exc:
        return error_reply(413, content_type, str(exc))
    except UnsupportedEncoding as exc:
        return error_reply(415, content_type, str(exc))
    except CorruptBody as exc:
        return error_reply(400, content_type, str(exc))
    decoders: dict[tuple[bool, str], Callable[[bytes], otlp.Decoded]] = {
        (False, otlp.PROTOBUF): otlp.decode_traces_protobuf, (False, otlp.JSON): otlp.decode_traces_json,
        (True, otlp.PROTOBUF): otlp.decode_logs_protobuf, (True, otlp.JSON): otlp.decode_logs_json,
    }
    try:
        decoded = decoders[(logs, content_type)](raw)
    except otlp.OtlpDecodeError as exc:
        return error_reply(400, content_type, str(exc))
    decision = check_ingest_rate(key, len(decoded.logs) if logs else len(decoded.spans))
    if not decision.allowed:
        return throttled(content_type, decision.retry_after)
    return Decoded(content_type, logs, decoded, prepare_spans(decoded.spans))


def _handle(body: bytes, content_type: str, content_encoding: str, authorization: str | None, logs: bool) -> Reply:
    """The whole request on the writer thread: decoding beside it on other threads was measured
    slower (the threads only trade the GIL), and a queue of one keeps SQLite's lock busy."""
    stage = _guarded(content_type, lambda: _decode(body, content_type, content_encoding, authorization, logs))
    return _guarded(content_type, lambda: _store(stage)) if isinstance(stage, Decoded) else stage


def _store(request: Decoded) -> Reply:
    """The transaction, on the writer thread."""
    result = store_prepared(request.batch, source="otlp", logs=request.decoded.logs)
    rejected = len(request.decoded.errors) + result.rejected
    message = ""
    if rejected:
        details = [request.decoded.error_message, result.error_message.partition(": ")[2]]
        noun = "log record(s)" if request.logs else "span(s)"
        message = f"{rejected} {noun} rejected: " + "; ".join(d for d in details if d)
    return Reply(200, otlp.export_response(request.content_type, rejected, message, logs=request.logs),
                 request.content_type)


async def _export(request: HttpRequest, logs: bool) -> HttpResponse:
    request.get_host()  # ALLOWED_HOSTS (these views are served without CommonMiddleware): 400 if not allowed
    content_type = (request.content_type or "").strip().lower()
    if request.method != "POST":
        reply = error_reply(405, content_type, "use POST")
        reply.headers["Allow"] = "POST"
    else:
        body, encoding = request.body, request.headers.get("Content-Encoding", "")
        authorization = request.headers.get("Authorization")
        reply = await sync_to_async(_handle, thread_sensitive=False, executor=writer())(
            body, content_type, encoding, authorization, logs
        )
    deferred.resume()  # once per process: token work an earlier process left unfinished
    response = HttpResponse(reply.body, status=reply.status, content_type=reply.content_type)
    for name, value in reply.headers.items():
        response[name] = value
    return response


@csrf_exempt
async def otlp_traces(request: HttpRequest) -> HttpResponse:
    return await _export(request, logs=False)


@csrf_exempt
async def otlp_logs(request: HttpRequest) -> HttpResponse:
    return await _export(request, logs=True)
