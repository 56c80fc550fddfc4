"""Cross-site websocket hijacking: a real websocket client (the `websockets` package) with the
user's session cookie against uvicorn, as `make run` serves it. Only pages of the site itself
(same scheme, host and port) or CSRF_TRUSTED_ORIGINS may open the live feed."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.conftest import free_port

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cookie(alice) -> str:
    client = Client()
    client.force_login(alice)
    return f"sessionid={client.cookies['sessionid'].value}"


def hello(server, cookie: str, origin: str | None, **headers: str) -> dict:
    """The first message of /ws/live/ opened with `origin`; InvalidStatus when the handshake is refused."""
    sent = {"Cookie": cookie, **headers, **({"Origin": origin} if origin else {})}
    with connect(f"{server.ws_url}/ws/live/", additional_headers=sent, open_timeout=10,
                 origin=None) as ws:
        return json.loads(ws.recv(timeout=10))


def refused(server, cookie: str, origin: str | None, **headers: str) -> bool:
    try:
        hello(server, cookie, origin, **headers)
    except InvalidStatus as error:
        assert error.response.status_code == 403
        return True
    return False


def test_a_page_of_the_same_origin_gets_the_live_feed(live_uvicorn, cookie):
    assert hello(live_uvicorn, cookie, live_uvicorn.url)["type"] == "hello"
    assert hello(live_uvicorn, cookie, f"http://localhost:{live_uvicorn.port}",
                 Host=f"localhost:{live_uvicorn.port}")["type"] == "hello"


def test_a_page_on_another_port_scheme_or_host_is_refused(live_uvicorn, cookie):
    assert refused(live_uvicorn, cookie, f"http://127.0.0.1:{free_port()}")  # the reported attack
    assert refused(live_uvicorn, cookie, "http://127.0.0.1")  # port 80
    assert refused(live_uvicorn, cookie, f"https://127.0.0.1:{live_uvicorn.port}")
    assert refused(live_uvicorn, cookie, f"http://localhost:{live_uvicorn.port}")  # Host says 127.0.0.1
    assert refused(live_uvicorn, cookie, "http://evil.example")
    assert refused(live_uvicorn, cookie, "null")
    assert refused(live_uvicorn, cookie, None)


def test_csrf_trusted_origins_and_the_tls_proxy_are_honoured(uvicorn_factory, cookie):
    elsewhere = free_port()
    server = uvicorn_factory({"CSRF_TRUSTED_ORIGINS": f"http://127.0.0.1:{elsewhere},https://*.example.com",
                              "CTXLENS_BEHIND_TLS_PROXY": "1"})
    assert hello(server, cookie, f"http://127.0.0.1:{elsewhere}")["type"] == "hello"
    assert hello(server, cookie, "https://ctxlens.example.com")["type"] == "hello"
    assert refused(server, cookie, "http://ctxlens.example.com")
    assert refused(server, cookie, "https://example.com.evil.test")
    # Through the proxy the page is https on the proxy's host and port.
    assert hello(server, cookie, f"https://127.0.0.1:{server.port}", **{"X-Forwarded-Proto": "https"})["type"] == "hello"
    assert refused(server, cookie, f"http://127.0.0.1:{server.port}", **{"X-Forwarded-Proto": "https"})
