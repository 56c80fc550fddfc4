from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.conftest import free_port


def get_json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def test_healthz_is_ok_when_database_and_channel_layer_work(live_uvicorn):
    status, body = get_json(f"{live_uvicorn.url}/healthz")
    assert status == 200
    assert body == {"status": "ok", "database": "ok", "channel_layer": "ok"}


def test_healthz_is_503_when_the_database_is_unreachable(uvicorn_factory, tmp_path):
    server = uvicorn_factory({"DATABASE_URL": f"sqlite:///{tmp_path}/missing-dir/db.sqlite3"}, healthy=False)
    status, body = get_json(f"{server.url}/healthz")
    assert status == 503
    assert body["database"] == "error" and body["channel_layer"] == "ok"
    assert str(tmp_path) not in json.dumps(body)


def test_healthz_is_503_when_the_channel_layer_is_unreachable(uvicorn_factory):
    pytest.importorskip("channels_redis")
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"
    server = uvicorn_factory({"REDIS_URL": dead_redis}, healthy=False)
    status, body = get_json(f"{server.url}/healthz")
    assert status == 503
    assert body["channel_layer"] == "error" and body["database"] == "ok"


@pytest.mark.django_db
def test_healthz_answers_only_get(client):
    assert client.post("/healthz").status_code == 405
