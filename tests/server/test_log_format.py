"""CTXLENS_LOG_FORMAT: the server's log lines as text or as one JSON object per line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tests.conftest import ROOT

# The demo's agent in a process configured by the server's settings: its tool executor logs each
# failed attempt (a rate-limited search, a timeout) while the tool's span is current.
RUN_DEMO = """
import django
django.setup()
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pipeline.runtime.demo.scenario import run_demo
from pipeline.runtime.telemetry.config import ObservabilityConfig
from pipeline.runtime.telemetry.spans import Telemetry
spans = InMemorySpanExporter()
telemetry = Telemetry.from_config(ObservabilityConfig(), exporters=[spans], batch=False)
run_demo(telemetry)
print(json.dumps(sorted({format(s.context.trace_id, "032x") for s in spans.get_finished_spans()})))
"""


def run_with(tmp_path, log_format: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "PYTHONPATH": str(ROOT), "SECRET_KEY": "test",
        "CTXLENS_LOG_FORMAT": log_format, "CTXLENS_DATA_DIR": str(tmp_path),
    }
    env.pop("DATABASE_URL", None)
    return subprocess.run([sys.executable, "-c", "import json\n" + RUN_DEMO], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_json_log_lines_carry_level_logger_and_the_trace(tmp_path):
    done = run_with(tmp_path, "json")
    assert done.returncode == 0, done.stderr
    traces = set(json.loads(done.stdout.strip().splitlines()[-1]))
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert lines and len(lines) == len(done.stderr.splitlines())  # every line is a JSON object
    failed = [line for line in lines if "failed (rate_limit)" in line["message"]]
    assert failed, lines
    entry = failed[0]
    assert entry["level"] == "INFO" and entry["logger"] == "pipeline.runtime.executor"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", entry["time"])
    assert entry["trace_id"] in traces and re.fullmatch(r"[0-9a-f]{16}", entry["span_id"])  # leads to its trace


def test_text_is_the_default_and_a_bad_format_is_refused(tmp_path):
    done = run_with(tmp_path, "text")
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stderr.splitlines() if "failed (rate_limit)" in line)
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO pipeline\.runtime\.executor: tool web_search", line)

    bad = run_with(tmp_path, "xml")
    assert bad.returncode != 0 and "CTXLENS_LOG_FORMAT must be text or json, not 'xml'" in bad.stderr
