"""bench/ingest.py finds the team's load generator relative to the repository, not at a fixed path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tests.conftest import ROOT


def load_bench(monkeypatch):
    monkeypatch.delenv("CTXLENS_OTLP_LOAD", raising=False)
    spec = importlib.util.spec_from_file_location("bench_ingest", ROOT / "bench" / "ingest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_load_generator_is_found_beside_the_repository(monkeypatch, tmp_path):
    bench = load_bench(monkeypatch)
    assert bench.LOAD_SCRIPT == ROOT.parent / "shared" / "bench" / "otlp_load.py"
    assert bench.default_load_script(tmp_path / "checkout") == tmp_path / "shared" / "bench" / "otlp_load.py"


def test_the_benchmark_names_no_absolute_path():
    assert "/work/" not in (ROOT / "bench" / "ingest.py").read_text()


def test_ctxlens_otlp_load_overrides_it(monkeypatch, tmp_path):
    monkeypatch.setenv("CTXLENS_OTLP_LOAD", str(tmp_path / "load.py"))
    spec = importlib.util.spec_from_file_location("bench_ingest", ROOT / "bench" / "ingest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.LOAD_SCRIPT == Path(tmp_path / "load.py")
