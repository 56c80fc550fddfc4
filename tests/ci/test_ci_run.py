"""`.ci/run`: on CI, unreachable PostgreSQL or Redis fail the run; locally the scale pass is skipped.

The real script runs with a stand-in `make` on PATH (the suite itself is not run again) and
service URLs on ports where nothing listens."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import ROOT, free_port


@pytest.fixture
def fake_make(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "make-calls"
    make = bin_dir / "make"
    make.write_text(f'#!/bin/sh\necho "$@ DATABASE_URL=${{DATABASE_URL:-}}" >> {calls}\n')
    make.chmod(0o755)
    return bin_dir, calls


def run_ci(fake_make, **env: str) -> subprocess.CompletedProcess:
    bin_dir, _ = fake_make
    base = {k: v for k, v in os.environ.items() if k not in {"CI", "DATABASE_URL", "REDIS_URL"}}
    base["PATH"] = f"{bin_dir}:{base['PATH']}"
    base["CI_DATABASE_URL"] = f"postgres://postgres@127.0.0.1:{free_port()}/test"
    base["CI_REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"
    return subprocess.run([str(ROOT / ".ci" / "run")], cwd=ROOT, env={**base, **env}, capture_output=True,
                          text=True, timeout=60)


def test_on_ci_unreachable_services_fail_the_run_with_the_reason(fake_make):
    pytest.importorskip("psycopg")
    done = run_ci(fake_make, CI="true")
    assert done.returncode != 0
    assert "CI is set" in done.stderr and "PostgreSQL" in done.stderr and "unreachable" in done.stderr
    assert fake_make[1].read_text().splitlines() == ["test DATABASE_URL="]  # only the SQLite pass ran


def test_without_ci_the_scale_pass_is_skipped(fake_make):
    pytest.importorskip("psycopg")
    done = run_ci(fake_make)
    assert done.returncode == 0, done.stderr
    assert "skipped the PostgreSQL + Redis run" in done.stdout
    assert fake_make[1].read_text().splitlines() == ["test DATABASE_URL="]
