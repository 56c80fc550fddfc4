"""Static files from the uvicorn server as `make run` serves them: WhiteNoise, hashed names that
are cached for a year, compressed copies, and ES modules that import each other by hashed name."""

from __future__ import annotations

import re

import httpx
import pytest

pytestmark = pytest.mark.django_db(transaction=True)

YEAR = 365 * 24 * 3600


def asset_urls(html: str) -> list[str]:
    return re.findall(r'(?:href|src)="(/static/[^"]+)"', html)


def test_a_static_asset_is_served_with_a_hashed_name_and_a_far_future_cache(live_uvicorn):
    login = httpx.get(f"{live_uvicorn.url}/login/")
    assert login.status_code == 200
    css = next(url for url in asset_urls(login.text) if url.endswith(".css"))
    assert re.fullmatch(r"/static/css/ctxlens\.[0-9a-f]{12}\.css", css), css

    reply = httpx.get(f"{live_uvicorn.url}{css}", headers={"Accept-Encoding": "gzip"})
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/css")
    assert reply.headers["content-encoding"] == "gzip"
    max_age = int(re.search(r"max-age=(\d+)", reply.headers["cache-control"]).group(1))
    assert max_age >= YEAR and "immutable" in reply.headers["cache-control"]
    assert ".topbar" in reply.text

    # The unhashed name still answers, but is only cached briefly: it may change with a release.
    plain = httpx.get(f"{live_uvicorn.url}/static/css/ctxlens.css")
    assert plain.status_code == 200
    assert int(re.search(r"max-age=(\d+)", plain.headers["cache-control"]).group(1)) < 3600


def test_page_modules_import_each_other_by_hashed_name(live_uvicorn, client, alice):
    client.force_login(alice)
    cookie = {"sessionid": client.cookies["sessionid"].value}
    page = httpx.get(f"{live_uvicorn.url}/", cookies=cookie)
    assert page.status_code == 200
    script = next(url for url in asset_urls(page.text) if "/js/overview." in url)
    module = httpx.get(f"{live_uvicorn.url}{script}")
    assert module.status_code == 200 and "javascript" in module.headers["content-type"]
    imports = re.findall(r'from "\./([^"]+)"', module.text)
    assert imports and all(re.fullmatch(r"[a-z]+\.[0-9a-f]{12}\.js", name) for name in imports), imports
    for name in imports:
        assert httpx.get(f"{live_uvicorn.url}/static/js/{name}").status_code == 200


def test_a_missing_static_file_is_a_plain_404(live_uvicorn):
    reply = httpx.get(f"{live_uvicorn.url}/static/js/no-such-file.js")
    assert reply.status_code == 404
    assert "Traceback" not in reply.text and "URLconf" not in reply.text
