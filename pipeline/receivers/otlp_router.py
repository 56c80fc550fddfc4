"""ASGI routing for the ingest endpoints: the key and the limits before the body, and Django without middleware.

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
- hands an OTLP request to a Django handler without the middleware stack (the REST API goes
  to the whole application, which checks the key again through DRF). The views are still
  ordinary async Django views resolved through config/urls.py, but none of the session, auth,
  CSRF, messages or clickjacking middleware applies to a Bearer-key API, and in an async
  handler each of them costs two thread hops per request: measured here, about half the
  server time of an OTLP request went to them. The Host header is still checked
  (ALLOWED_HOSTS) by the view.
Everything else goes to the wrapped application unchanged.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from django.core.handlers.exception import convert_exception_to_response

from pipeline.conf import ctxlens_config
from pipeline.ingest import service
from pipeline.receivers.asgi_handler import CycleFreeASGIHandler
from pipeline.receivers.otlp_http import ADMITTED_KEY, Reply, failure_reply, off_the_loop

GUARDED_PATHS = frozenset({"/v1/traces", "/v1/logs", "/v1/metrics"})
REST_PATH = "/api/ingest/"
REST = "rest"  # not a media type: the refusals of REST_PATH are DRF-style JSON
BODY_IDLE_SECONDS = 30.0


class BareASGIHandler(CycleFreeASGIHandler):
    """Django's ASGI handler with no middleware: URL resolution, the view, request signals."""

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        self._middleware_chain = convert_exception_to_response(self._get_response_async)


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
        self.ingest_app = BareASGIHandler()
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
            else:
                await self.ingest_app({**scope, ADMITTED_KEY: admitted}, _replay(body, receive), send)
        finally:
            reservation.release()


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


async def _send(send: Any, reply: Reply) -> None:
    """Answer and close the connection: the body that may follow is not read."""
    headers = [(b"content-type", reply.content_type.encode()), (b"content-length", str(len(reply.body)).encode()),
               (b"connection", b"close")]
    headers += [(name.lower().encode(), value.encode()) for name, value in reply.headers.items()]
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body})
