"""A read replica (DATABASE_REPLICA_URL): the dashboard's trace data comes from it, and
everything else — ingest, API keys, logins — from the primary.

The replica here is a database of its own that holds other rows than the primary, so every
read shows which database it came from.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

from django.test import Client
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from pipeline.models import Conversation
from pipeline.models.apikeys import Scope
from tests.agent_traces import record_turns
from tests.conftest import ROOT, LiveServer, server_env
from tests.otlp_support import auth, make_key


def export(server: LiveServer, key: str, conversation_id: str) -> None:
    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers=auth(key))
    spans = record_turns(conversation_id, payload=conversation_id)  # the payload puts the id in the title
    assert exporter.export(spans) == SpanExportResult.SUCCESS


def get(server: LiveServer, path: str, headers: dict[str, str]) -> str:
    with urllib.request.urlopen(urllib.request.Request(f"{server.url}{path}", headers=headers), timeout=30) as reply:
        return reply.read().decode()


def manage(database_url: str, *args: str) -> str:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, check=True, capture_output=True, text=True,
                          env={**server_env(), "DATABASE_URL": database_url}).stdout


def test_the_read_api_reads_trace_data_from_the_replica_and_the_rest_from_the_primary(
        uvicorn_factory, tmp_path, alice):
    replica_url = f"sqlite:///{tmp_path / 'replica.sqlite3'}"
    manage(replica_url, "migrate", "--no-input")
    replica_key = manage(replica_url, "create_api_key", "replica").strip().splitlines()[-1]
    on_replica = uvicorn_factory({"DATABASE_URL": replica_url})
    export(on_replica, replica_key, "only-on-the-replica")
    on_replica.stop()

    server = uvicorn_factory({"DATABASE_REPLICA_URL": replica_url})
    key = make_key(Scope.ALL)  # on the primary only: keys are read there
    export(server, key, "only-on-the-primary")  # ingest writes, and reads, the primary
    assert list(Conversation.objects.values_list("external_id", flat=True)) == ["only-on-the-primary"]

    listed = json.loads(get(server, "/api/conversations/", auth(key)))
    assert [c["external_id"] for c in listed["results"]] == ["only-on-the-replica"]

    # Live fragments follow a websocket notice of a commit on the primary, so they read it there.
    browser = Client()
    browser.force_login(alice)  # the session lives on the primary
    rows = get(server, "/fragments/conversations/", {"Cookie": f"sessionid={browser.cookies['sessionid'].value}"})
    assert "only-on-the-primary" in rows and "only-on-the-replica" not in rows


def test_without_a_replica_the_dashboard_reads_the_primary(live_uvicorn):
    key = make_key(Scope.ALL)
    export(live_uvicorn, key, "on-the-primary")
    listed = json.loads(get(live_uvicorn, "/api/conversations/", auth(key)))
    assert [c["external_id"] for c in listed["results"]] == ["on-the-primary"]
