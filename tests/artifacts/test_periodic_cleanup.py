"""The server cleans artifacts by itself, at most once per CTXLENS_ARTIFACT_CLEANUP_INTERVAL_S, off
the request path; 0 turns it off (cron's `manage.py cleanup_artifacts` stays)."""

from __future__ import annotations

import logging
import os
import time
from datetime import timedelta

import httpx
import pytest
import time_machine
from django.test import Client
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from pipeline.artifacts.periodic import periodic_cleanup
from pipeline.models import ApiKey, Artifact
from tests.factories import make_artifact

EXPIRED = timedelta(hours=-1)


@pytest.fixture
def periodic():
    """The process's periodic cleanup, waited for after each request, and reset after the test."""
    periodic_cleanup.restart()
    yield periodic_cleanup
    periodic_cleanup.stop()
    periodic_cleanup.restart()


def request_and_wait(periodic) -> None:
    assert Client().get("/healthz").status_code == 200
    periodic.wait(30)  # for a run the request started, if any


@pytest.mark.django_db(transaction=True)
def test_a_request_runs_the_cleanup_at_most_once_per_interval(periodic, artifact_dir, settings, caplog):
    settings.CTXLENS_ARTIFACT_CLEANUP_INTERVAL_S = 3600
    caplog.set_level(logging.INFO, logger="pipeline.artifacts.periodic")
    with time_machine.travel("2026-06-01 12:00Z", tick=False) as clock:
        first = make_artifact(artifact_dir, b"old rows", expires_in=EXPIRED)
        kept = make_artifact(artifact_dir, b"fresh rows")
        request_and_wait(periodic)
        assert not Artifact.objects.filter(pk=first.pk).exists() and not (artifact_dir / first.artifact_id).exists()
        assert Artifact.objects.filter(pk=kept.pk).exists()
        assert "cleanup_artifacts: expired 1, evicted 0 (0 B), orphans 0, kept 1 (10 B) (periodic)" in caplog.text

        second = make_artifact(artifact_dir, b"more old rows", expires_in=EXPIRED)
        clock.shift(timedelta(minutes=59))
        request_and_wait(periodic)
        assert Artifact.objects.filter(pk=second.pk).exists()  # within the interval: not again

        clock.shift(timedelta(minutes=2))
        request_and_wait(periodic)
        assert not Artifact.objects.filter(pk=second.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_interval_zero_leaves_it_to_cron(periodic, artifact_dir, settings):
    settings.CTXLENS_ARTIFACT_CLEANUP_INTERVAL_S = 0
    old = make_artifact(artifact_dir, b"old rows", expires_in=EXPIRED)
    request_and_wait(periodic)
    assert Artifact.objects.filter(pk=old.pk).exists() and (artifact_dir / old.artifact_id).exists()


def test_the_served_app_cleans_without_cron(uvicorn_factory, artifact_dir):
    """uvicorn as `make run` serves it: any request starts the cleanup in the background."""
    old = make_artifact(artifact_dir, b"yesterday's export", expires_in=EXPIRED)
    orphan = artifact_dir / ("artifact_" + "ab" * 16)
    orphan.write_bytes(b"no row")
    ancient = time.time() - 3600
    os.utime(orphan, (ancient, ancient))
    server = uvicorn_factory({"CTXLENS_ARTIFACT_DIR": str(artifact_dir), "CTXLENS_ARTIFACT_CLEANUP_INTERVAL_S": "600"})
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    deadline = time.monotonic() + 30
    while Artifact.objects.filter(pk=old.pk).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Artifact.objects.filter(pk=old.pk).exists()
    while (orphan.exists() or "(periodic)" not in server.log()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not orphan.exists() and not (artifact_dir / old.artifact_id).exists()
    assert "cleanup_artifacts: expired 1, evicted 0 (0 B), orphans 1, kept 0 (0 B) (periodic)" in server.log()
    assert str(artifact_dir) not in server.log()


def test_an_otlp_export_alone_starts_it(uvicorn_factory, artifact_dir):
    """pipeline.receivers.otlp_router answers an export without Django's handler: it sends the
    `request_finished` that starts the run itself."""
    server = uvicorn_factory({"CTXLENS_ARTIFACT_DIR": str(artifact_dir), "CTXLENS_ARTIFACT_CLEANUP_INTERVAL_S": "1"})
    key = ApiKey.generate("agent", scope="ingest")[1]
    time.sleep(1.5)  # past the interval of the start-up health checks' run: the next request starts one
    old = make_artifact(artifact_dir, b"yesterday's export", expires_in=EXPIRED)
    reply = httpx.post(f"{server.url}/v1/traces", content=ExportTraceServiceRequest().SerializeToString(),
                       headers={"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {key}"})
    assert reply.status_code == 200
    deadline = time.monotonic() + 30
    while Artifact.objects.filter(pk=old.pk).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Artifact.objects.filter(pk=old.pk).exists()
