"""The runtime's OpenTelemetry metrics: per-tool calls, errors, retries, durations and tokens,
read back through the SDK's in-memory reader and received over OTLP/HTTP by a real listener and
by a ctxlens server's /v1/metrics, exported every CTXLENS_METRICS_EXPORT_INTERVAL_S."""

from __future__ import annotations

import gzip
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult

from pipeline.models import ApiKey
from pipeline.runtime.demo.scenario import DemoReport, run_demo
from pipeline.runtime.telemetry.config import ObservabilityConfig
from pipeline.runtime.telemetry.metrics import metrics_url
from pipeline.runtime.telemetry.spans import Telemetry


def points(data, name: str) -> list:
    return [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics if m.name == name
            for p in m.data.data_points]


def run_with_reader(config: ObservabilityConfig) -> tuple[DemoReport, InMemoryMetricReader, Telemetry]:
    reader = InMemoryMetricReader()
    telemetry = Telemetry.from_config(config, metric_readers=[reader], batch=False)
    return run_demo(telemetry), reader, telemetry


def test_tool_and_token_metrics_count_what_the_agent_did():
    report, reader, telemetry = run_with_reader(ObservabilityConfig(sampling="never"))  # metrics ignore sampling
    data = reader.get_metrics_data()
    telemetry.shutdown()
    results = [t for r in report.rounds for t in r.tool_results]

    calls = Counter()
    for p in points(data, "ctxlens.tool.calls"):
        calls[p.attributes["gen_ai.tool.name"], p.attributes["ctxlens.tool.success"]] += p.value
    assert calls == Counter((t.tool_name, t.success) for t in results)
    errors = {(p.attributes["gen_ai.tool.name"], p.attributes["error.type"]): p.value
              for p in points(data, "ctxlens.tool.errors")}
    assert errors == {("web_search", "timeout"): 1, ("web_search", "permission_denied"): 1,
                      ("query_sales", "invalid_parameters"): 1}
    assert sum(p.value for p in points(data, "ctxlens.tool.retries")) == sum(t.retry_count for t in results) == 4

    durations = points(data, "ctxlens.tool.duration")
    assert sum(p.count for p in durations) == len(results)
    assert sum(p.sum for p in durations) == pytest.approx(sum(t.duration_ms for t in results) / 1000)

    usage = points(data, "gen_ai.client.token.usage")
    by_type = {kind: sum(p.sum for p in usage if p.attributes["gen_ai.token.type"] == kind) for kind in ("input", "output")}
    assert by_type == {"input": sum(r.input_tokens for r in report.rounds),
                       "output": sum(r.output_tokens for r in report.rounds)}
    assert {p.attributes["gen_ai.request.model"] for p in usage} == {"gpt-4o-mini", "gpt-4"}


class Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that keeps what it is sent, by path."""

    received: dict[str, list[tuple[float, bytes]]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.received.setdefault(self.path, []).append((time.monotonic(), body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, dict]]:
    received: dict[str, list[tuple[float, bytes]]] = {}
    handler = type("Handler", (Receiver,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()
    server.server_close()


def test_metrics_go_over_otlp_next_to_the_spans_every_interval(receiver, monkeypatch):
    endpoint, received = receiver
    monkeypatch.setenv("CTXLENS_METRICS_EXPORT_INTERVAL_S", "0.2")
    monkeypatch.setenv("CTXLENS_METRICS_EXPORT_TIMEOUT_MS", "1500")
    from pipeline.runtime.settings import RuntimeSettings, use_settings_source

    previous = use_settings_source(RuntimeSettings.from_env)  # what an agent without a server reads
    try:
        config = ObservabilityConfig.from_settings(otlp_endpoint=endpoint, otlp_headers={"Authorization": "Bearer k"})
    finally:
        use_settings_source(previous)
    assert (config.metrics_export_interval_s, config.metrics_export_timeout_ms) == (0.2, 1500)

    telemetry = Telemetry.from_config(config)
    run_demo(telemetry)
    deadline = time.monotonic() + 30
    while len(received.get("/v1/metrics", [])) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # the periodic reader exports on its own, before any flush
    exported_before_shutdown = len(received.get("/v1/metrics", []))
    telemetry.shutdown()

    assert exported_before_shutdown >= 2 and received["/v1/traces"]  # spans and metrics, one endpoint
    last = ExportMetricsServiceRequest()
    last.ParseFromString(received["/v1/metrics"][-1][1])
    resource = last.resource_metrics[0]
    assert {a.key: a.value.string_value for a in resource.resource.attributes}["service.name"] == "ctxlens-agent"
    names = {m.name for sm in resource.scope_metrics for m in sm.metrics}
    assert {"ctxlens.tool.calls", "ctxlens.tool.errors", "ctxlens.tool.duration", "gen_ai.client.token.usage"} <= names
    calls = [p for sm in resource.scope_metrics for m in sm.metrics if m.name == "ctxlens.tool.calls"
             for p in m.sum.data_points]
    assert sum(p.as_int for p in calls) == 26  # cumulative: every tool call of the demo


def test_no_endpoint_or_metrics_off_exports_nothing(receiver):
    endpoint, received = receiver
    telemetry = Telemetry.from_config(ObservabilityConfig(otlp_endpoint=endpoint, enable_metrics=False))
    assert telemetry.meter_provider is not None
    run_demo(telemetry)
    telemetry.shutdown()
    assert received["/v1/traces"] and "/v1/metrics" not in received


def test_metrics_url_follows_the_traces_endpoint():
    assert metrics_url("http://collector:4318") == "http://collector:4318/v1/metrics"
    assert metrics_url("https://ctxlens.example/v1/traces") == "https://ctxlens.example/v1/metrics"
    assert metrics_url("http://collector:4318/custom") is None  # a hand-picked traces URL: no guessing


def test_a_custom_traces_path_sends_spans_there_and_no_metrics_to_it(receiver, caplog):
    endpoint, received = receiver
    telemetry = Telemetry.from_config(ObservabilityConfig(otlp_endpoint=f"{endpoint}/custom"))
    run_demo(telemetry)
    telemetry.shutdown()
    assert received["/custom"] and set(received) == {"/custom"}  # every request was a span export
    assert "metrics are not exported" in caplog.text


def test_a_ctxlens_server_accepts_the_runtimes_metrics(otlp_server):
    """/v1/metrics answers the real OTLP exporter: accepted with a key, refused without one."""
    _, key = ApiKey.generate("agent")
    _, reader, telemetry = run_with_reader(ObservabilityConfig())
    data = reader.get_metrics_data()
    telemetry.shutdown()
    url = f"{otlp_server.url}/v1/metrics"
    assert OTLPMetricExporter(endpoint=url, headers={"Authorization": f"Bearer {key}"}).export(data) \
        == MetricExportResult.SUCCESS
    assert OTLPMetricExporter(endpoint=url, headers={"Authorization": "Bearer ctx_nope"}).export(data) \
        == MetricExportResult.FAILURE

    auth = {"Authorization": f"Bearer {key}"}
    assert httpx.post(url, content=b"{}", headers={**auth, "Content-Type": "application/json"}).status_code == 200
    bad = httpx.post(url, content=b"\xff\x00garbage", headers={**auth, "Content-Type": "application/x-protobuf"})
    assert bad.status_code == 400
    assert httpx.post(url, content=b"x", headers={**auth, "Content-Type": "text/plain"}).status_code == 415
    assert httpx.post(url, content=b"{}", headers={"Content-Type": "application/json"}).status_code == 401
