"""Shared fixtures: named users, an artifact sandbox per test, real servers run the way `make run`
runs them (uvicorn, DEBUG off, collected static files), daphne for its smoke test, and `settled`
for tests whose commits leave background work behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session", autouse=True)
def flush_started_again_after_a_deadlock() -> Iterator[None]:
    """Emptying the tables after a test (pytest-django's flush: one TRUNCATE of them all on
    PostgreSQL) can deadlock with a read a uvicorn the test served still runs in the background
    (its deferred or finding counts), which locks those tables in another order; PostgreSQL then
    aborts one of the two. The flush is tried again, as ingest's writers are, rather than failing
    a test that passed; a warning says so, as work a test left running may be worth waiting for."""
    from django.core.management.base import CommandError
    from django.core.management.commands import flush
    from django.db import OperationalError

    from pipeline.ingest.write import sql

    handle = flush.Command.handle

    def handle_again_after_a_deadlock(self: flush.Command, **options: object) -> object:
        for attempt in range(4):
            try:
                return handle(self, **options)
            except CommandError as error:  # what flush makes of the database's error
                cause = error.__cause__
                if not (isinstance(cause, OperationalError) and sql.is_deadlock(cause)):
                    raise
                warnings.warn("the flush after a test deadlocked with a background read; flushing again",
                              stacklevel=1)
                time.sleep(0.1 * (attempt + 1))
        return handle(self, **options)  # the fifth and last attempt: its error is the test's

    flush.Command.handle = handle_again_after_a_deadlock
    yield
    flush.Command.handle = handle


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup):
    """pytest-django's test databases; the finding counts refresh and the ingest writer threads
    stop and close their connections before the databases are dropped (PostgreSQL refuses to
    drop a database still in use, SQLite's in-memory one is gone for a refresh still waiting)."""
    yield
    from pipeline.ingest.write.writer_threads import stop_writer
    from pipeline.insight import finding_counts

    finding_counts.stop()  # before the writer: a refresh queues its write there
    stop_writer()


@pytest.fixture
def settled(transactional_db) -> Iterator[None]:
    """Afterwards, the token counts the commits left to the background are waited for and the finding
    counts refreshed here, so no background refresh has anything left to write: emptying the
    tables while one writes deadlocks on PostgreSQL."""
    yield
    from pipeline.insight import finding_counts
    from tests.otlp_support import wait_for_deferred_tokens

    wait_for_deferred_tokens()
    finding_counts.refresh_stale()


@pytest.fixture(scope="session", autouse=True)
def collected_static() -> None:
    """Static files collected as `make run` collects them (hashed, compressed, with a manifest):
    pages render `{% static %}` through the manifest, and live servers serve STATIC_ROOT."""
    from django.core.management import call_command

    call_command("collectstatic", "--no-input", verbosity=0)


@pytest.fixture(autouse=True)
def fresh_cache() -> None:
    """Every test starts with an empty Django cache. On the scale pass the cache is Redis, which
    outlives a run: without this, idempotency entries, rate-limit windows and the summariser's
    hourly cost budget would carry over from earlier tests and runs."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture(autouse=True)
def no_recent_calls() -> None:
    """Every test starts as a new process would: without the LLM spans earlier tests' batches
    showed the up-front tool counting (pipeline.ingest.write.precount.recent_calls)."""
    from pipeline.ingest.write.precount import recent_calls

    recent_calls.clear()


@pytest.fixture(autouse=True)
def no_periodic_artifact_cleanup(settings) -> None:
    """The server's periodic artifact cleanup (pipeline.artifacts.periodic) would delete, on a
    background thread, the expired artifacts and orphan files tests create on purpose: off unless
    a test turns it on."""
    settings.CTXLENS_ARTIFACT_CLEANUP_INTERVAL_S = 0


@pytest.fixture
def alice(django_user_model):
    """A superuser."""
    return django_user_model.objects.create_superuser("alice", "alice@example.com", "alice-pass-123")


@pytest.fixture
def bob(django_user_model):
    """A plain, non-staff user."""
    return django_user_model.objects.create_user("bob", "bob@example.com", "bob-pass-123")


@pytest.fixture
def artifact_dir(tmp_path, settings) -> Path:
    path = tmp_path / "artifacts"
    path.mkdir()
    settings.CTXLENS_ARTIFACT_DIR = path
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_database_url() -> str:
    """A DATABASE_URL that points another process at the test database of this run."""
    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    user = s.get("USER") or ""
    password = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
    host = s.get("HOST") or "127.0.0.1"
    port = s.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{s['NAME']}"


@dataclass
class LiveServer:
    url: str
    port: int
    process: subprocess.Popen
    log_path: Path

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://", 1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


SERVER_COMMANDS: dict[str, Callable[[int], list[str]]] = {
    # The flags of `make run`.
    "uvicorn": lambda port: [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1",
                             "--port", str(port), "--lifespan", "off", "--ws-per-message-deflate", "false",
                             "--log-level", "warning"],
    "daphne": lambda port: [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                            "config.asgi:application"],
}


def server_env(extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a server process on this run's test database, with DEBUG off as shipped
    (whatever the shell running the tests exports) unless `extra_env` sets it, and no read replica
    (a developer's would hold other data) unless `extra_env` names one."""
    inherited = {name: value for name, value in os.environ.items() if name not in ("DEBUG", "DATABASE_REPLICA_URL")}
    return {**inherited, "DATABASE_URL": test_database_url(), "PYTHONUNBUFFERED": "1",
            "CTXLENS_ARTIFACT_CLEANUP_INTERVAL_S": "0",  # as no_periodic_artifact_cleanup
            **(extra_env or {})}


def wait_healthy(server: LiveServer, *, healthy: bool = True, seconds: float = 30) -> LiveServer:
    """Wait until /healthz answers 200 (or, with healthy=False, answers at all)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"the server exited with {server.process.returncode}:\n{server.log()}")
        try:
            with urllib.request.urlopen(f"{server.url}/healthz", timeout=5) as reply:
                if reply.status == 200:
                    return server
        except urllib.error.HTTPError:
            if not healthy:
                return server
            time.sleep(0.1)
        except OSError:
            time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"the server did not become healthy in {seconds} s:\n{server.log()}")


def start_server(
    tmp_dir: Path, extra_env: dict[str, str] | None = None, port: int | None = None, *, healthy: bool = True,
    kind: str = "uvicorn",
) -> LiveServer:
    """Start `uvicorn config.asgi:application` as `make run` does (or daphne, kind="daphne") on the
    test database, and wait until /healthz answers."""
    port = port or free_port()
    log_path = tmp_dir / f"{kind}-{port}.log"
    process = subprocess.Popen(
        SERVER_COMMANDS[kind](port), cwd=ROOT, env=server_env(extra_env), stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
    )
    server = LiveServer(url=f"http://127.0.0.1:{port}", port=port, process=process, log_path=log_path)
    return wait_healthy(server, healthy=healthy)


def start_uvicorn(
    tmp_dir: Path, extra_env: dict[str, str] | None = None, port: int | None = None, *, healthy: bool = True
) -> LiveServer:
    return start_server(tmp_dir, extra_env, port, healthy=healthy, kind="uvicorn")


def start_daphne(
    tmp_dir: Path, extra_env: dict[str, str] | None = None, port: int | None = None, *, healthy: bool = True
) -> LiveServer:
    return start_server(tmp_dir, extra_env, port, healthy=healthy, kind="daphne")


@pytest.fixture
def uvicorn_factory(transactional_db, tmp_path) -> Iterator[Callable[..., LiveServer]]:
    """Start one or more uvicorn processes on the test database; all are stopped after the test."""
    servers: list[LiveServer] = []

    def factory(
        extra_env: dict[str, str] | None = None, port: int | None = None, *, healthy: bool = True
    ) -> LiveServer:
        server = start_uvicorn(tmp_path, extra_env, port, healthy=healthy)
        servers.append(server)
        return server

    yield factory
    for server in servers:
        server.stop()


@pytest.fixture
def live_uvicorn(uvicorn_factory, artifact_dir) -> LiveServer:
    """One uvicorn process serving the whole app on the test database, as `make run` serves it."""
    return uvicorn_factory({"CTXLENS_ARTIFACT_DIR": str(artifact_dir)})


@pytest.fixture(scope="module")
def otlp_uvicorn(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[LiveServer]:
    """A real uvicorn on the test database, shared by the tests of one module (start-up is slow)."""
    tmp = tmp_path_factory.mktemp("otlp-server")
    with django_db_blocker.unblock():
        server = start_uvicorn(tmp, {"CTXLENS_ARTIFACT_DIR": str(tmp / "artifacts")})
    yield server
    server.stop()


@pytest.fixture
def otlp_server(otlp_uvicorn, transactional_db) -> Iterator[LiveServer]:
    """The module's uvicorn, for one test. What the server writes is visible to the test, and every
    table is emptied after it, once the server has finished the token counts it fills in after
    its replies (emptying the tables while it writes them deadlocks on PostgreSQL)."""
    yield otlp_uvicorn
    from tests.otlp_support import wait_for_deferred_tokens

    wait_for_deferred_tokens()
