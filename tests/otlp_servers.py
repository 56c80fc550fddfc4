"""Real ctxlens processes for the export, gRPC and fault tests: a gRPC ingest server, and a
second ctxlens on its own migrated SQLite database, all as subprocesses of manage.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import SERVER_COMMANDS, ROOT, LiveServer, free_port, server_env, start_uvicorn, test_database_url

SMALL_DISK_SCRIPT = 'mount -t tmpfs -o size="$1" tmpfs "$2" && shift 2 && exec "$@"'


def manage(*args: str, database_url: str, extra_env: dict[str, str] | None = None, timeout: float = 120) -> str:
    """Run `manage.py ARGS` in a subprocess against `database_url`; its stdout, or an error with its output."""
    env = {**os.environ, "DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def create_key(database_url: str, scope: str = "ingest") -> str:
    return manage("create_api_key", f"test-{scope}", "--scope", scope, database_url=database_url).strip().splitlines()[-1]


def wait_for_port(port: int, process: subprocess.Popen, log_path: Path, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log_path.read_text(errors='replace')}")
        with socket.socket() as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"nothing listened on {port} in {seconds} s:\n{log_path.read_text(errors='replace')}")


def start_grpc(tmp_dir: Path, *, database_url: str | None = None, extra_env: dict[str, str] | None = None,
               port: int | None = None, args: tuple[str, ...] = ()) -> LiveServer:
    """`manage.py serve_otlp_grpc` on the test database (or `database_url`), listening when returned."""
    port = port or free_port()
    env = {**os.environ, "DATABASE_URL": database_url or test_database_url(), "PYTHONUNBUFFERED": "1"}
    env.update(extra_env or {})
    log_path = tmp_dir / f"grpc-{port}.log"
    process = subprocess.Popen(
        [sys.executable, "manage.py", "serve_otlp_grpc", "--port", str(port), *args],
        cwd=ROOT, env=env, stdout=log_path.open("wb"), stderr=subprocess.STDOUT,
    )
    wait_for_port(port, process, log_path)
    return LiveServer(url=f"http://127.0.0.1:{port}", port=port, process=process, log_path=log_path)


@dataclass
class SecondCtxlens:
    """Another ctxlens installation: its own SQLite database and artifact dir, its own servers."""

    database_url: str
    artifact_dir: Path
    tmp_dir: Path

    @property
    def env(self) -> dict[str, str]:
        return {"DATABASE_URL": self.database_url, "CTXLENS_ARTIFACT_DIR": str(self.artifact_dir)}

    def uvicorn(self, extra_env: dict[str, str] | None = None, port: int | None = None) -> LiveServer:
        return start_uvicorn(self.tmp_dir, {**self.env, **(extra_env or {})}, port)

    def grpc(self, extra_env: dict[str, str] | None = None) -> LiveServer:
        return start_grpc(self.tmp_dir, database_url=self.database_url, extra_env={**self.env, **(extra_env or {})})

    def key(self, scope: str = "ingest") -> str:
        return create_key(self.database_url, scope)

    def snapshot(self) -> dict:
        """Its stored records, as tests.snapshot.snapshot() gives them, read by a subprocess."""
        return self._read("tests.snapshot", "snapshot")

    def span_logs(self) -> list[dict]:
        """Its stored OTLP log records, as span_logs() gives them, read by a subprocess."""
        return self._read("tests.otlp_servers", "span_logs")

    def _read(self, module: str, function: str) -> Any:
        code = f"import django, json; django.setup(); from {module} import {function}; print(json.dumps({function}()))"
        env = {**os.environ, **self.env, "DJANGO_SETTINGS_MODULE": "config.settings"}
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        return json.loads(done.stdout.strip().splitlines()[-1])


def span_logs() -> list[dict]:
    """Every stored OTLP log record (SpanLog) by what the record carries, its digest included."""
    from pipeline.models import SpanLog

    return list(SpanLog.objects.order_by("digest").values(
        "trace_id", "span_id", "time_unix_nano", "event_name", "body", "attributes", "digest"))


def second_ctxlens(tmp_dir: Path, template: Path) -> SecondCtxlens:
    """A fresh second installation, copied from a migrated template database file."""
    db = tmp_dir / "second.sqlite3"
    db.write_bytes(template.read_bytes())
    artifacts = tmp_dir / "second-artifacts"
    artifacts.mkdir()
    return SecondCtxlens(database_url=f"sqlite:///{db}", artifact_dir=artifacts, tmp_dir=tmp_dir)


def migrated_template(directory: Path) -> Path:
    """A SQLite database migrated by `manage.py migrate` in a subprocess, to copy per test."""
    path = directory / "second-template.sqlite3"
    manage("migrate", "--no-input", database_url=f"sqlite:///{path}")
    return path


def namespace_prefix() -> list[str] | None:
    """`unshare` arguments that give a child its own mount namespace (as root, or as a normal user
    through a user namespace), or None when this machine allows neither."""
    candidates = [["unshare", "--mount", "--propagation", "private"]] if os.geteuid() == 0 else []
    candidates.append(["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"])
    for prefix in candidates:
        try:
            probe = subprocess.run([*prefix, "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt || "
                                    "mount -t tmpfs -o size=4k tmpfs /tmp"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return prefix
    return None


def start_uvicorn_on_small_disk(tmp_dir: Path, prefix: list[str], size: str, mount_point: Path,
                                extra_env: dict[str, str] | None = None) -> LiveServer:
    """uvicorn in its own mount namespace where `mount_point` is a real tmpfs of `size` (e.g. "256k").

    The mount exists only for that process and vanishes with it; writes past the size fail with
    ENOSPC, as on a full disk."""
    port = free_port()
    log_path = tmp_dir / f"uvicorn-small-disk-{port}.log"
    argv = [*prefix, "sh", "-c", SMALL_DISK_SCRIPT, "small-disk", size, str(mount_point), *SERVER_COMMANDS["uvicorn"](port)]
    process = subprocess.Popen(argv, cwd=ROOT, env=server_env(extra_env), stdout=log_path.open("wb"),
                               stderr=subprocess.STDOUT)
    wait_for_port(port, process, log_path)
    return LiveServer(url=f"http://127.0.0.1:{port}", port=port, process=process, log_path=log_path)
