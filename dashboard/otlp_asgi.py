"""ASGI routing for the OTLP endpoints: a body limit before Django, and Django without middleware.

`OtlpIngestRouter` wraps the project's HTTP application. For POST /v1/traces and /v1/logs it
- reads the body itself and answers 413 as soon as the declared Content-Length or the bytes
  received pass CTXLENS_MAX_INGEST_BYTES (Django's handler would first spool the whole body);
- hands the request to a Django handler without the middleware stack. The views are still
  ordinary async Django views resolved through config/urls.py, but none of the session, auth,
  CSRF, messages or clickjacking middleware applies to a Bearer-key API, and in an async
  handler each of them costs two thread hops per request: measured here, about half the
  server time of an OTLP request went to them. The Host header is still checked
  (ALLOWED_HOSTS) by the view.
Everything else goes to the wrapped application unchanged.
"""

from __future__ import annotations

from typing import Any

from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response

from pipeline.conf import ctxlens_config
from pipeline.ingest import otlp

GUARDED_PATHS = frozenset({"/v1/traces", "/v1/logs"})
RESOURCE_EXHAUSTED = 8


class BareASGIHandler(ASGIHandler):
    """Django's ASGI handler with no middleware: URL resolution, the view, request signals."""

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        self._middleware_chain = convert_exception_to_response(self._get_response_async)


class OtlpIngestRouter:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.ingest_app = BareASGIHandler()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in GUARDED_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        limit = ctxlens_config().max_ingest_bytes
        content_type = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        declared = headers.get(b"content-length", b"").strip()
        if declared.isdigit() and int(declared) > limit:
            await self._too_large(send, content_type, limit)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await self._too_large(send, content_type, limit)
                return
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.ingest_app(scope, replay, send)

    @staticmethod
    async def _too_large(send: Any, content_type: str, limit: int) -> None:
        reply_type = otlp.PROTOBUF if content_type == otlp.PROTOBUF else otlp.JSON
        body = otlp.status_body(reply_type, RESOURCE_EXHAUSTED, f"body is larger than {limit} bytes")
        await send({
            "type": "http.response.start", "status": 413,
            "headers": [(b"content-type", reply_type.encode()), (b"content-length", str(len(body)).encode()),
                        (b"connection", b"close")],
        })
        await send({"type": "http.response.body", "body": body})
