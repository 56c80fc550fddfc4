"""ASGI routing for the ingest endpoints: the key and the limits before the body, and OTLP answered without Django's handler.

`OtlpIngestRouter` wraps the project's HTTP application. For POST /v1/traces, /v1/logs, /v1/metrics and
/api/ingest/ (Django's own ASGI handler reads a whole body before any view or authentication
runs) it
- checks the key, the key's rate budget and the declared Content-Length from the headers
  (`pipeline.ingest.service.admit`, on a worker thread) before it reads a byte of the
  body: an unauthorised, throttled or oversized request is answered at once, and its body is
  never buffered (the server stops reading the socket once its small buffer is full);
- holds the bytes of every body it reads against CTXLENS_MAX_INFLIGHT_BYTES for the process,
  answering 503 + Retry-After (which exporters retry) when a body would pass it, and gives
  them back however the request ends (reply, error, disconnect);
- reads the body itself, answering 413 as soon as the bytes received pass
  CTXLENS_MAX_INGEST_BYTES and 408 when the client sends nothing for BODY_IDLE_SECONDS;
- answers an OTLP export itself: the Host header (ALLOWED_HOSTS, as Django checks it), then the
  flow of the OTLP views (pipeline.receivers.otlp_http, otlp_metrics) on one worker thread,
  which also sends `request_finished` as Django would. Not through Django's handler: for a
  Bearer-key API its request objects, body file, URL resolution and signals (two more thread
  hops) are all cost, ~1.3 ms of server CPU per request. Agents that export each turn as it
  ends send a few spans per request: measured with 3 (`bench/ingest.py --batch 3`), 0.78x the
  server CPU per span and 1.27x the throughput; with 100, within the noise. (Before that, the
  session, auth, CSRF, messages and clickjacking middleware had been about half the server time
  of a request.) The REST API goes to the whole application, which checks the key again
  through DRF.
Everything else, other methods of the OTLP paths included, goes to the wrapped application
unchanged (config/urls.py routes the OTLP paths to those views).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.core.signals import request_finished

from pipeline.conf import ctxlens_config
from pipeline.ingest import service
from pipeline.receivers.asgi_handler import UNREADABLE_HEADERS, WRONG_HOST
from pipeline.receivers.otlp_http import Reply, export_reply, failure_reply, off_the_loop, resume_background_work
from pipeline.receivers.otlp_metrics import accept_metrics

logger = logging.getLogger(__name__)
security_logger = logging.getLogger("django.security.DisallowedHost")  # where Django logs it

LOGS_PATH, METRICS_PATH = "/v1/logs", "/v1/metrics"
GUARDED_PATHS = frozenset({"/v1/traces", LOGS_PATH, METRICS_PATH})
REST_PATH = "/api/ingest/"
REST = "rest"  # not a media type: the refusals of REST_PATH are DRF-style JSON
BODY_IDLE_SECONDS = 30.0


class InflightBytes:
    """Request-body bytes this process holds, against CTXLENS_MAX_INFLIGHT_BYTES. Only the event
    loop's thread touches it, so it needs no lock; each ASGI process has its own."""

    def __init__(self) -> None:
        self.held = 0

    def reservation(self) -> Reservation:
        return Reservation(self)


class Reservation:
    """One request's share of the in-flight bytes: grows as its body arrives, released once."""

    def __init__(self, budget: InflightBytes) -> None:
        self.budget = budget
        self.held = 0

    def grow_to(self, size: int) -> bool:
        """Hold `size` bytes in all; False (and nothing more held) when that would pass the cap."""
        extra = size - self.held
        if extra <= 0:
            return True
        if self.budget.held + extra > ctxlens_config().max_inflight_bytes:
            return False
        self.budget.held += extra
        self.held = size
        return True

    def release(self) -> None:
        self.budget.held -= self.held
        self.held = 0


class OtlpIngestRouter:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.inflight = InflightBytes()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path")
        guarded = path in GUARDED_PATHS or path == REST_PATH
        if scope["type"] != "http" or scope.get("method") != "POST" or not guarded:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        media_type = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        content_type = REST if path == REST_PATH else media_type
        declared_header = headers.get(b"content-length", b"").strip()
        declared = int(declared_header) if declared_header.isdigit() and len(declared_header) <= 20 else None
        authorization = headers[b"authorization"].decode("latin-1") if b"authorization" in headers else None
        if path != REST_PATH and (refused := _host_refusal(scope)) is not None:
            await _send(send, _refusal(refused, content_type))
            return
        admitted = await off_the_loop(service.admit)(
            authorization, declared_length=declared
        )
        if isinstance(admitted, service.Failed):
            await _send(send, _refusal(admitted, content_type))
            return
        reservation = self.inflight.reservation()
        try:
            if declared is not None and not reservation.grow_to(declared):
                await _send(send, _refusal(service.server_busy(), content_type))
                return
            body = await _read_body(receive, send, content_type, reservation)
            if body is None:
                return
            if path == REST_PATH:  # DRF checks the key again; the full middleware stack applies
                await self.app(scope, _replay(body, receive), send)
                return
            encoding = headers.get(b"content-encoding", b"").decode("latin-1")
            if path == METRICS_PATH:
                work = partial(accept_metrics, body, media_type, encoding, authorization, admitted)
            else:
                work = partial(export_reply, body, media_type, encoding, authorization, admitted, logs=path == LOGS_PATH)
            reply = await off_the_loop(_as_request)(work, media_type)
            resume_background_work()
            await _send(send, reply, close=False)
        finally:
            reservation.release()


def _host_refusal(scope: dict) -> service.Failed | None:
    """None when Django would serve this request's Host (ALLOWED_HOSTS; X-Forwarded-Host as
    configured), else why not; also when Django could not even read its headers."""
    try:
        ASGIRequest(scope, io.BytesIO()).get_host()
    except DisallowedHost as error:
        security_logger.error("%s", error, extra={"status_code": 400})
        return service.Failed(service.Kind.INVALID_ARGUMENT, WRONG_HOST)
    except (ValueError, LookupError):  # e.g. a Content-Type charset no codec knows
        return service.Failed(service.Kind.INVALID_ARGUMENT, UNREADABLE_HEADERS)
    return None


def _as_request(work: Callable[[], Reply], content_type: str) -> Reply:
    """`work` as the end of a request on this worker thread: `request_finished` after it (what
    Django's handler sends: the periodic artifact cleanup listens), and an INTERNAL reply in the
    request's encoding, not a bare 500, should it fail."""
    try:
        return work()
    except Exception:
        logger.exception("an OTLP export failed")
        return failure_reply(service.Failed(service.Kind.INTERNAL, "the server failed to handle the request"),
                             content_type)
    finally:
        request_finished.send(sender=OtlpIngestRouter)


async def _read_body(receive: Any, send: Any, content_type: str, reservation: Reservation) -> bytes | None:
    """The body, or None once the request was answered (too large, over the in-flight cap, idle)
    or the client went away. Bytes past the declared length are reserved as they arrive."""
    limit = ctxlens_config().max_ingest_bytes
    chunks: list[bytes] = []
    size = 0
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(BODY_IDLE_SECONDS) as idle:
            while True:
                message = await receive()
                idle.reschedule(loop.time() + BODY_IDLE_SECONDS)
                if message["type"] == "http.disconnect":
                    return None
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    await _send(send, _refusal(service.too_large(limit), content_type))
                    return None
                if not reservation.grow_to(size):  # no Content-Length (chunked), or longer than declared
                    await _send(send, _refusal(service.server_busy(), content_type))
                    return None
                chunks.append(chunk)
                if not message.get("more_body"):
                    break
    except TimeoutError:
        await _send(send, _refusal(service.body_timed_out(BODY_IDLE_SECONDS), content_type))
        return None
    return b"".join(chunks)


def _refusal(failed: service.Failed, content_type: str) -> Reply:
    """The refusal in the form the endpoint's clients read: DRF's JSON for the REST API,
    a google.rpc.Status for OTLP."""
    if content_type != REST:
        return failure_reply(failed, content_type)
    headers = {"Retry-After": str(failed.retry_after)} if failed.retry_after else {}
    if failed.kind is service.Kind.UNAUTHENTICATED:
        headers["WWW-Authenticate"] = 'Bearer realm="ctxlens"'  # as pipeline.drf_auth answers
    return Reply(failed.kind.value, json.dumps({"detail": failed.message}).encode(), "application/json", headers)


def _replay(body: bytes, receive: Any) -> Any:
    """An ASGI `receive` that gives the view the body already read, then the client's messages."""
    replayed = False

    async def replay() -> dict:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _send(send: Any, reply: Reply, *, close: bool = True) -> None:
    """Answer; and close the connection unless the whole body was read (`close=False`): a body
    left unread would be taken for the next request."""
    headers = [(b"content-type", reply.content_type.encode()), (b"content-length", str(len(reply.body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    headers += [(name.lower().encode(), value.encode()) for name, value in reply.headers.items()]
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body})
