"""daphne is supported beside uvicorn (`daphne config.asgi:application`): one smoke test of the
whole app on it — health, a hashed static file, ingest and a same-origin live websocket."""

from __future__ import annotations

import json

import httpx
import pytest
from django.test import Client
from websockets.sync.client import connect

from pipeline.models import ApiKey
from tests.conftest import start_daphne

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_app_serves_pages_static_files_ingest_and_websockets_on_daphne(tmp_path, artifact_dir, alice):
    server = start_daphne(tmp_path, {"CTXLENS_ARTIFACT_DIR": str(artifact_dir)})
    try:
        client = Client()
        client.force_login(alice)
        cookie = f"sessionid={client.cookies['sessionid'].value}"
        assert httpx.get(f"{server.url}/healthz").json()["status"] == "ok"
        page = httpx.get(f"{server.url}/", headers={"Cookie": cookie})
        assert page.status_code == 200
        css = page.text.split('href="/static/css/ctxlens.', 1)[1].split('"', 1)[0]
        asset = httpx.get(f"{server.url}/static/css/ctxlens.{css}")
        assert asset.status_code == 200 and "immutable" in asset.headers["cache-control"]
        with connect(f"{server.ws_url}/ws/live/", additional_headers={"Cookie": cookie, "Origin": server.url},
                     open_timeout=10) as ws:
            assert json.loads(ws.recv(timeout=10))["type"] == "hello"
            key = ApiKey.generate("daphne smoke")[1]
            reply = httpx.post(f"{server.url}/api/ingest/", headers={"Authorization": f"Bearer {key}"}, json={
                "schema_version": "1.0",
                "events": [{"type": "conversation", "conversation_id": "conv-daphne", "title": "on daphne"}]})
            assert reply.status_code in (200, 201, 202), reply.text
            assert json.loads(ws.recv(timeout=10))["type"] == "changes"
    finally:
        server.stop()
