"""Security defaults: DEBUG only when asked for, and cookies, proxy header and HSTS behind the
documented TLS proxy, checked on the settings module and on a real uvicorn server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import httpx
import pytest

from tests.conftest import ROOT

NAMES = ["DEBUG", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_PROXY_SSL_HEADER", "SECURE_HSTS_SECONDS"]


def settings_with(env: dict[str, str]) -> dict:
    """The named settings as config/settings.py computes them from `env` (in a fresh process)."""
    base = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "CTXLENS_BEHIND_TLS_PROXY", "SECURE_HSTS_SECONDS"}}
    code = ("import json; from django.conf import settings; "
            f"print(json.dumps({{n: getattr(settings, n) for n in {NAMES!r}}}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**base, "DJANGO_SETTINGS_MODULE": "config.settings", **env})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_debug_is_off_unless_asked_for():
    assert settings_with({})["DEBUG"] is False
    assert settings_with({"DEBUG": "1"})["DEBUG"] is True


def test_behind_the_tls_proxy_cookies_are_secure_and_the_forwarded_scheme_is_trusted():
    plain = settings_with({})
    assert plain["SESSION_COOKIE_SECURE"] is False and plain["SECURE_PROXY_SSL_HEADER"] is None
    proxied = settings_with({"CTXLENS_BEHIND_TLS_PROXY": "1", "SECURE_HSTS_SECONDS": "31536000"})
    assert proxied["SESSION_COOKIE_SECURE"] is True and proxied["CSRF_COOKIE_SECURE"] is True
    assert proxied["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert proxied["SECURE_HSTS_SECONDS"] == 31536000


@pytest.mark.django_db(transaction=True)
def test_the_server_shows_no_debug_page(live_uvicorn):
    reply = httpx.get(f"{live_uvicorn.url}/no-such-page/")
    assert reply.status_code == 404
    assert "URLconf" not in reply.text and "DEBUG = True" not in reply.text


def log_in_over_the_proxy(server, username: str, password: str) -> httpx.Response:
    """Log in as a browser would through the TLS proxy (X-Forwarded-Proto: https)."""
    origin = server.url.replace("http://", "https://", 1)
    with httpx.Client(base_url=server.url, headers={"X-Forwarded-Proto": "https", "Origin": origin}) as http:
        form = http.get("/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
        # httpx keeps Secure cookies off plain http: hand the CSRF cookie back explicitly.
        csrf = form.cookies.get("csrftoken") or re.search(r"csrftoken=([^;]+)", form.headers["set-cookie"]).group(1)
        reply = http.post("/login/", data={"username": username, "password": password, "csrfmiddlewaretoken": token},
                          headers={"Cookie": f"csrftoken={csrf}", "Referer": f"{origin}/login/"})
        return form, reply


@pytest.mark.django_db(transaction=True)
def test_behind_the_tls_proxy_the_server_sends_secure_cookies_and_hsts(uvicorn_factory, alice):
    server = uvicorn_factory({"CTXLENS_BEHIND_TLS_PROXY": "1", "SECURE_HSTS_SECONDS": "31536000"})
    form, reply = log_in_over_the_proxy(server, "alice", "alice-pass-123")
    assert form.headers["strict-transport-security"] == "max-age=31536000"
    assert "secure" in form.headers["set-cookie"].lower()
    assert reply.status_code == 302, reply.text
    session = next(c for c in reply.headers.get_list("set-cookie") if c.startswith("sessionid="))
    assert "secure" in session.lower() and "httponly" in session.lower()


@pytest.mark.django_db(transaction=True)
def test_without_the_proxy_setting_cookies_work_over_plain_http(live_uvicorn, alice):
    form = httpx.get(f"{live_uvicorn.url}/login/")
    assert "strict-transport-security" not in form.headers
    assert "secure" not in form.headers["set-cookie"].lower()
