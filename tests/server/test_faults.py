"""Faults under load: a server killed mid-export, a full artifact disk, a database restart.

Nothing is lost and nothing is stored twice: OTLP exporters retry what was not acknowledged,
ingest is idempotent on (trace_id, span_id), and every request is one transaction.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time

import httpx
import pytest
from asgiref.sync import SyncToAsync
from django.db import connection, connections
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from pipeline.models import ApiKey, Artifact, Conversation, LLMCall, Round, Span, ToolCall
from tests.agent_traces import record_turns, span_count
from tests.otlp_servers import namespace_prefix, start_uvicorn_on_small_disk

pytestmark = pytest.mark.django_db(transaction=True)


def row_counts() -> dict[str, int]:
    return {m.__name__: m.objects.count() for m in (Span, Conversation, Round, LLMCall, ToolCall, Artifact)}


def export_in_background(url: str, key: str, batches: list, results: list) -> threading.Thread:
    """The real OTel exporter sending batch after batch, with its own retries (60 s per batch)."""
    exporter = OTLPSpanExporter(endpoint=f"{url}/v1/traces", headers={"Authorization": f"Bearer {key}"},
                                timeout=60)

    def run() -> None:
        for batch in batches:
            results.append(exporter.export(batch))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def wait_for(condition, seconds: float = 30, step: float = 0.05) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(step)


def assert_each_span_once(conversations: int, turns_per_batch: int) -> None:
    expected = conversations * span_count(turns=turns_per_batch)
    assert Span.objects.count() == expected
    assert ToolCall.objects.count() == conversations * turns_per_batch * 2
    assert Round.objects.count() == conversations * turns_per_batch
    # Aggregates are not double counted by a re-sent batch either.
    for conversation in Conversation.objects.all():
        assert (conversation.round_count, conversation.tool_call_count) == (turns_per_batch, 2 * turns_per_batch)


def test_a_server_killed_mid_load_and_restarted_loses_and_duplicates_nothing(uvicorn_factory, artifact_dir):
    env = {"CTXLENS_ARTIFACT_DIR": str(artifact_dir)}
    server = uvicorn_factory(env)
    key = ApiKey.generate("agent", scope="ingest")[1]
    batches = [record_turns(f"load-{n}", turns=2) for n in range(30)]
    results: list = []

    thread = export_in_background(server.url, key, batches, results)
    wait_for(lambda: len(results) >= 5)  # well into the load
    server.process.send_signal(signal.SIGKILL)  # no goodbye: requests in flight are cut off
    server.process.wait()
    time.sleep(1)  # the exporter meets a closed port and backs off
    uvicorn_factory(env, port=server.port)  # the same endpoint comes back
    thread.join(timeout=240)

    assert not thread.is_alive()
    assert results == [SpanExportResult.SUCCESS] * len(batches)
    assert_each_span_once(conversations=len(batches), turns_per_batch=2)


def big_observation_request(observation: str, *, trace: str = "fa" * 16) -> bytes:
    """One turn: a root span and a tool span whose result is `observation`."""
    def attr(key: str, value: str) -> KeyValue:
        return KeyValue(key=key, value=AnyValue(string_value=value))

    start = time.time_ns() - 10**9
    root = OtlpSpan(trace_id=bytes.fromhex(trace), span_id=bytes.fromhex("01" * 8), name="invoke_agent bot",
                    start_time_unix_nano=start, end_time_unix_nano=start + 10**8,
                    attributes=[attr("gen_ai.operation.name", "invoke_agent"),
                                attr("gen_ai.conversation.id", f"disk-{trace[:6]}")])
    tool = OtlpSpan(trace_id=bytes.fromhex(trace), span_id=bytes.fromhex("02" * 8),
                    parent_span_id=bytes.fromhex("01" * 8), name="execute_tool fetch",
                    start_time_unix_nano=start + 10, end_time_unix_nano=start + 10**7,
                    attributes=[attr("gen_ai.operation.name", "execute_tool"), attr("gen_ai.tool.name", "fetch"),
                                attr("gen_ai.tool.call.id", "call_1"), attr("gen_ai.tool.call.result", observation)])
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[root, tool])])])
    return request.SerializeToString()


@pytest.fixture
def small_disk_server(transactional_db, tmp_path):
    prefix = namespace_prefix()
    if prefix is None:
        pytest.skip("cannot mount a small tmpfs here: neither root nor unprivileged user namespaces "
                    "(`unshare --user --map-root-user --mount`) are available")
    mount_point = tmp_path / "artifacts"
    mount_point.mkdir()
    server = start_uvicorn_on_small_disk(
        tmp_path, prefix, "256k", mount_point,
        {"CTXLENS_ARTIFACT_DIR": str(mount_point), "CTXLENS_ARTIFACT_THRESHOLD_BYTES": "16384"},
    )
    yield server, mount_point
    server.stop()


def test_a_full_artifact_disk_gives_a_clear_retryable_error_and_stores_nothing(small_disk_server):
    server, mount_point = small_disk_server
    key = ApiKey.generate("agent", scope="ingest")[1]
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/x-protobuf"}
    before = row_counts()

    reply = httpx.post(f"{server.url}/v1/traces", content=big_observation_request("x" * 400_000), headers=headers,
                       timeout=30)

    assert reply.status_code == 503  # retryable: the exporter tries again once there is space
    assert "Retry-After" in reply.headers
    message = status_pb2.Status.FromString(reply.content).message
    assert "artifact storage is full" in message
    assert str(mount_point) not in message and str(mount_point) not in server.log()
    assert row_counts() == before  # neither the tool call, nor its turn, nor an artifact row
    sandbox = f"/proc/{server.process.pid}/root{mount_point}"
    if os.access(sandbox, os.R_OK):  # the namespace's tmpfs, seen from outside
        assert os.listdir(sandbox) == []  # no half-written file either

    # An artifact that fits is stored as usual: the disk, not the server, was the problem.
    reply = httpx.post(f"{server.url}/v1/traces", content=big_observation_request("y" * 100_000, trace="fb" * 16),
                       headers=headers, timeout=30)
    assert reply.status_code == 200
    assert Artifact.objects.count() == 1 and ToolCall.objects.get().artifact is not None


def test_rest_ingest_on_a_full_artifact_disk_answers_503_and_stores_nothing(small_disk_server):
    server, _ = small_disk_server
    key = ApiKey.generate("service", scope="ingest")[1]
    events = [
        {"type": "round_start", "conversation_id": "rest-disk", "round_id": "t1",
         "timestamp": "2026-05-01T12:00:00Z", "user_message": "fetch it"},
        {"type": "tool_call", "conversation_id": "rest-disk", "round_id": "t1", "tool_name": "fetch",
         "tool_call_id": "call_1", "observation": "z" * 400_000, "started_at": "2026-05-01T12:00:01Z",
         "duration_ms": 5},
    ]
    before = row_counts()

    reply = httpx.post(f"{server.url}/api/ingest/", json={"schema_version": "1.0", "events": events},
                       headers={"Authorization": f"Bearer {key}"}, timeout=30)

    assert reply.status_code == 503 and int(reply.headers["Retry-After"]) > 0
    assert "artifact storage is full" in reply.json()["detail"]
    assert row_counts() == before


def pg_restart_command() -> list[str] | None:
    """The local cluster on DATABASE_URL's port; None when the database is on another host."""
    if connection.vendor != "postgresql":
        return None
    host = connection.settings_dict.get("HOST") or "localhost"
    if host not in ("localhost", "127.0.0.1", "::1") and not host.startswith("/"):  # "/…": a local socket
        return None
    clusters = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True) if shutil.which(
        "pg_lsclusters") else None
    if clusters is None or clusters.returncode != 0:
        return None
    port = str(connection.settings_dict.get("PORT") or 5432)
    for line in clusters.stdout.splitlines():
        version, name, cluster_port, status, *_ = line.split()
        if cluster_port == port and status == "online":
            return ["pg_ctlcluster", version, name, "restart", "-m", "fast"]
    return None


def drop_dead_connections() -> None:
    """This process's connections died with the old server too: the main thread's, and the one of
    the thread async tests run their ORM calls on. Channels' test communicator turns off the
    close_old_connections() that, in a server, replaces a dead connection at the next use."""
    connections.close_all()
    SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=30)


def test_a_postgresql_restart_under_load_loses_and_duplicates_nothing(uvicorn_factory, artifact_dir):
    if connection.vendor != "postgresql":
        pytest.skip("runs on PostgreSQL only (DATABASE_URL=postgres://…): SQLite has no server to restart")
    if os.environ.get("CTXLENS_TEST_PG_RESTART") != "1":
        pytest.skip("restarting PostgreSQL drops every connection to the server, other people's included: "
                    "set CTXLENS_TEST_PG_RESTART=1 (as .ci/run does) on a server nothing else uses")
    command = pg_restart_command()
    if command is None or os.geteuid() != 0 and not os.access("/var/run/postgresql", os.W_OK):
        pytest.skip("pg_ctlcluster cannot restart the PostgreSQL cluster of DATABASE_URL from here")
    server = uvicorn_factory({"CTXLENS_ARTIFACT_DIR": str(artifact_dir)})
    key = ApiKey.generate("agent", scope="ingest")[1]
    batches = [record_turns(f"pg-load-{n}", turns=2) for n in range(30)]
    results: list = []

    thread = export_in_background(server.url, key, batches, results)
    wait_for(lambda: len(results) >= 5)
    in_flight = len(batches) - len(results)
    try:
        restart = subprocess.run(command, capture_output=True, text=True, timeout=120)
        thread.join(timeout=240)
    finally:
        drop_dead_connections()
    assert restart.returncode == 0, restart.stderr
    assert in_flight > 0  # the restart began in the middle of the load

    assert not thread.is_alive()
    assert results == [SpanExportResult.SUCCESS] * len(batches)
    assert_each_span_once(conversations=len(batches), turns_per_batch=2)
