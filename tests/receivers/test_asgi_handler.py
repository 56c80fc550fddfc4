"""The ASGI handler ctxlens serves Django with (pipeline.receivers.asgi_handler): a finished
request leaves nothing for the cyclic garbage collector, and a client that goes away mid-request
still cancels the view, as with Django's own handler.

Measured without middleware: the handler's own cycle (the dashboard's middleware, the auth
middleware's `request.auser`, makes cycles of its own with the request)."""

from __future__ import annotations

import asyncio
import gc

import pytest
from django.core.handlers.asgi import ASGIHandler, ASGIRequest
from django.core.handlers.exception import convert_exception_to_response

from pipeline.receivers.asgi_handler import CycleFreeASGIHandler

SCOPE = {"type": "http", "method": "GET", "path": "/healthz", "query_string": b"", "headers": [],
         "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000), "scheme": "http", "root_path": ""}


async def serve_one(handler: ASGIHandler) -> list[dict]:
    """One request as uvicorn delivers it: the body, then `http.disconnect` once the response is sent."""
    sent: list[dict] = []
    answered = asyncio.Event()
    body = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict:
        if body:
            return body.pop()
        await answered.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            answered.set()

    await handler(dict(SCOPE), receive, send)
    return sent


def requests_left_in_cycles(handler: ASGIHandler) -> tuple[int, int]:
    """(response status, ASGIRequest objects only the cyclic collector would free) after one request."""
    gc.collect()
    gc.disable()
    try:
        sent = asyncio.run(serve_one(handler))
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = sum(isinstance(o, ASGIRequest) for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    return sent[0]["status"], left


def without_middleware(handler: ASGIHandler, is_async: bool = False) -> None:
    """A handler's load_middleware that loads none: the handler's own cycles, not the middleware's."""
    handler._view_middleware = []
    handler._template_response_middleware = []
    handler._exception_middleware = []
    handler._middleware_chain = convert_exception_to_response(handler._get_response_async)


class DjangoBare(ASGIHandler):
    load_middleware = without_middleware


class CycleFreeBare(CycleFreeASGIHandler):
    load_middleware = without_middleware


@pytest.mark.django_db(transaction=True)
def test_a_finished_request_is_freed_without_the_cyclic_collector():
    # Django 5.2's own handler keeps each request (and its body) in a cycle: the case this handler removes
    assert requests_left_in_cycles(DjangoBare()) == (200, 1)
    assert requests_left_in_cycles(CycleFreeBare()) == (200, 0)


class _Waiting:
    """A handler whose view waits until it is cancelled, recording that it was."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = False

    async def run_get_response(self, request: ASGIRequest) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


class WaitingDjango(_Waiting, ASGIHandler):
    def __init__(self) -> None:
        _Waiting.__init__(self)
        ASGIHandler.__init__(self)


class WaitingCycleFree(_Waiting, CycleFreeASGIHandler):
    def __init__(self) -> None:
        _Waiting.__init__(self)
        CycleFreeASGIHandler.__init__(self)


async def disconnect_mid_request(handler: _Waiting) -> bool:
    """The client sends its body, then goes away once the view is running."""
    body = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict:
        if body:
            return body.pop()
        await handler.started.wait()  # set by the view
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:  # pragma: no cover - nothing is sent to a client that left
        raise AssertionError(f"sent {message['type']} to a client that went away")

    await asyncio.wait_for(handler(dict(SCOPE), receive, send), 30)  # a hang fails, not a timing
    return handler.started.is_set() and handler.cancelled


@pytest.mark.parametrize("handler", [WaitingDjango, WaitingCycleFree], ids=["django", "cycle-free"])
@pytest.mark.django_db(transaction=True)
def test_a_client_that_goes_away_cancels_the_view(handler):
    assert asyncio.run(disconnect_mid_request(handler())) is True
