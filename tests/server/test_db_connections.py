"""A server's PostgreSQL connections stay few however many requests it serves.

Under ASGI Django runs each request's sync code on a thread of its own; a connection kept past
the request (CONN_MAX_AGE) stays open in a thread that is gone, one per request, until
PostgreSQL refuses new clients ("too many clients already"). Only the threads of long-lived
pools (the ingest writers, the OTLP receivers' workers) keep theirs.
"""

from __future__ import annotations

import urllib.request

import pytest
from django.db import connection
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from pipeline.ingest.write.writer_threads import POSTGRES_WRITERS
from pipeline.models.apikeys import Scope
from pipeline.receivers import otlp_http
from tests.agent_traces import record_turns
from tests import conftest
from tests.otlp_support import auth, make_key

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="counts PostgreSQL's client connections")


def server_connections(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [name])
        return cursor.fetchone()[0]


def test_requests_leave_no_connection_behind(uvicorn_factory):
    name = "ctxlens-connection-count"
    server = uvicorn_factory({"DATABASE_URL": f"{conftest.test_database_url()}?application_name={name}"})
    key = make_key(Scope.ALL)
    for _ in range(30):
        with urllib.request.urlopen(urllib.request.Request(f"{server.url}/api/conversations/", headers=auth(key)),
                                    timeout=30) as reply:
            assert reply.status == 200
    assert server_connections(name) <= 3  # not one per request

    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers=auth(key))
    for i in range(20):
        assert exporter.export(record_turns(f"conversation-{i}")) == SpanExportResult.SUCCESS
    # Only the long-lived pools keep theirs: the writer threads and the threads that decode and
    # authenticate OTLP requests.
    assert server_connections(name) <= POSTGRES_WRITERS + otlp_http.WORKERS + 1
