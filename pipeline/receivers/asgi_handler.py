"""Django's ASGI handler without the reference cycle it leaves behind every request.

Django 5.2's `ASGIHandler.handle` runs the view beside a task that waits for the client's
`http.disconnect`, which raises `RequestAborted` when it arrives (after every response, under
uvicorn). `handle` catches it, but the task keeps the exception, the exception's traceback keeps
`handle`'s frame, and that frame keeps the task list: a cycle holding the request, its body and
its response until the cyclic collector's next full pass (Django ticket #36700). Under the
standard OTLP load that was ~90 MB of request bodies waiting at any moment, when OTLP exports
still went through this handler (they no longer do: pipeline.receivers.otlp_router; REST ingest
bodies still do).

Here the listener returns instead of raising. In Django 5.2 that changes nothing else: `handle`
waits for the first task to finish, cancels the other and ignores `RequestAborted` anyway.
(Django 6.1 rewrites `handle` around a TaskGroup in which only a raising listener cancels the
view: pyproject pins Django below 5.3, and tests/receivers/test_asgi_handler.py fails if a
Django release changes `handle` under this class.)

It also answers 400, not 500, to a request whose headers Django cannot parse: a Content-Type
parameter in an encoding no codec knows (`charset*=bogus''x`) raised ValueError while Django
built the request, which its `create_request` lets through (it catches only bad UTF-8, which
uvicorn and daphne refuse before Django sees it). The 400 says what was wrong: in the API's JSON
under /api/, in plain text elsewhere; so does `handler400` (dashboard.views.errors) for the rest
Django refuses, such as a Host it does not serve.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.handlers.asgi import ASGIHandler
from django.http import HttpResponse, HttpResponseBadRequest, JsonResponse

logger = logging.getLogger("django.request")  # where Django logs the bad requests it catches itself
UNREADABLE_HEADERS = "the request's headers cannot be read"  # said by the OTLP router too
WRONG_HOST = "the Host header names a host this server does not serve"  # said by the OTLP router too


def bad_request(path: str, message: str) -> HttpResponse:
    """A 400 that says what was wrong: in the API's JSON under /api/, in plain text elsewhere."""
    if path.startswith("/api/"):  # the API's JSON error body, as DRF writes it
        return JsonResponse({"detail": message}, status=400)
    return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")


class CycleFreeASGIHandler(ASGIHandler):
    def create_request(self, scope: dict, body_file: Any) -> tuple[Any, Any]:
        try:
            return super().create_request(scope, body_file)
        except (ValueError, LookupError):
            path = scope.get("path", "")
            logger.warning("Bad Request (headers that cannot be parsed): %s", path)
            return None, bad_request(path, UNREADABLE_HEADERS)

    async def listen_for_disconnect(self, receive: Any) -> None:
        message = await receive()
        if message["type"] != "http.disconnect":  # as Django's own listener
            raise AssertionError(f"Invalid ASGI message after request body: {message['type']}")
