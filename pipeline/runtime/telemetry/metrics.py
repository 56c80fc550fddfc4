"""The pipeline's OpenTelemetry metrics (the seeds' ToolMetrics / MetricsCollector, as OTel instruments),
exported over OTLP next to the spans.

    provider = build_meter_provider(config)           # OTLP reader when config.otlp_endpoint is set
    metrics = PipelineMetrics(provider.get_meter(SCOPE_NAME, SCOPE_VERSION))

Instruments (attributes in brackets):
- `ctxlens.tool.calls` counter [gen_ai.tool.name, ctxlens.tool.success, ctxlens.tool.output_level]
- `ctxlens.tool.errors` counter [gen_ai.tool.name, error.type]
- `ctxlens.tool.retries` counter [gen_ai.tool.name]: attempts after the first
- `ctxlens.tool.duration` histogram, seconds [gen_ai.tool.name, ctxlens.tool.success]
- `ctxlens.tool.observation_tokens` histogram [gen_ai.tool.name]: what a result adds to the context
- `gen_ai.client.token.usage` histogram [gen_ai.token.type input|output, gen_ai.request.model,
  gen_ai.operation.name, gen_ai.provider.name]: the OTel GenAI metric, per model call

Durations are in seconds, as OpenTelemetry's conventions ask (the seeds count milliseconds).
Metrics are recorded whatever the trace sampling: a sampled-out turn still counts.
A PeriodicExportingMetricReader exports every `metrics_export_interval_s` (seeds: 60 s) with a
`metrics_export_timeout_ms` deadline (seeds: 3000 ms); `shutdown()` exports what is left.
The OTLP protocol is the spans' one, except that http/json sends metrics as http/protobuf: the
OTel Python SDK has no JSON metric exporter, and OTLP/HTTP receivers (ctxlens's, the Collector's)
take protobuf.
"""

from __future__ import annotations

import logging

from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from pipeline import semconv as sc

if TYPE_CHECKING:
    from pipeline.runtime.protocol import ToolExecutionResult
    from pipeline.runtime.telemetry.config import ObservabilityConfig

logger = logging.getLogger(__name__)
TOOL_SUCCESS = "ctxlens.tool.success"  # a metric attribute only: spans say it with their status

# OTel's advisory bucket boundaries for gen_ai.client.token.usage and for durations in seconds.
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)


def metrics_url(endpoint: str) -> str | None:
    """`http://host:4318` → `http://host:4318/v1/metrics`; `…/v1/traces` → `…/v1/metrics`.

    Any other path is a traces URL chosen by hand (CTXLENS_OTLP_ENDPOINT is then used as given
    for spans): where metrics belong cannot be guessed from it, so None (no metrics are sent,
    rather than protobuf metrics posted to a traces receiver every interval).
    """
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        return urlunsplit(parts._replace(path="/v1/metrics"))
    if parts.path.endswith("/v1/traces"):
        return urlunsplit(parts._replace(path=parts.path[: -len("traces")] + "metrics"))
    return None


def otlp_metric_exporter(config: ObservabilityConfig) -> MetricExporter:
    timeout = config.metrics_export_timeout_ms / 1000
    if config.otlp_protocol == "grpc":
        from grpc import Compression as GrpcCompression
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter

        from pipeline.runtime.telemetry.otlp_grpc_client import grpc_target

        target, insecure = grpc_target(config.otlp_endpoint)
        compression = {"gzip": GrpcCompression.Gzip, "deflate": GrpcCompression.Deflate}.get(
            config.otlp_compression, GrpcCompression.NoCompression)
        return GrpcMetricExporter(endpoint=target, insecure=insecure, compression=compression, timeout=timeout,
                                  headers={key.lower(): value for key, value in config.otlp_headers.items()})
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter(endpoint=metrics_url(config.otlp_endpoint) or "", headers=dict(config.otlp_headers),
                              compression=Compression(config.otlp_compression), timeout=timeout)


def build_meter_provider(
    config: ObservabilityConfig, resource: Resource, *, readers: Sequence[MetricReader] = ()
) -> MeterProvider:
    """A MeterProvider with a periodic OTLP reader (if metrics are on and an endpoint is set) and `readers`."""
    all_readers = list(readers)
    sendable = config.otlp_protocol == "grpc" or metrics_url(config.otlp_endpoint) is not None
    if config.enable_metrics and config.otlp_endpoint and not sendable:
        logger.warning("metrics are not exported: CTXLENS_OTLP_ENDPOINT has a path of its own, so where "
                       "/v1/metrics is cannot be told; give the server's base URL or one ending in /v1/traces")
    if config.enable_metrics and config.otlp_endpoint and sendable:
        all_readers.append(PeriodicExportingMetricReader(
            otlp_metric_exporter(config),
            export_interval_millis=config.metrics_export_interval_s * 1000,
            export_timeout_millis=config.metrics_export_timeout_ms,
        ))
    return MeterProvider(resource=resource, metric_readers=all_readers)


class PipelineMetrics:
    """The instruments one agent records into; with a no-op meter it records nothing."""

    def __init__(self, meter: Meter) -> None:
        self.tool_calls = meter.create_counter("ctxlens.tool.calls", unit="{call}", description="Tool calls")
        self.tool_errors = meter.create_counter("ctxlens.tool.errors", unit="{call}", description="Failed tool calls")
        self.tool_retries = meter.create_counter(
            "ctxlens.tool.retries", unit="{attempt}", description="Tool attempts after the first")
        self.tool_duration = meter.create_histogram(
            "ctxlens.tool.duration", unit="s", description="Tool call duration, retries included",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.observation_tokens = meter.create_histogram(
            "ctxlens.tool.observation_tokens", unit="{token}", description="Tokens a tool result adds to the context",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS)
        self.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Tokens per model call, by type",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS)

    def record_tool(self, result: ToolExecutionResult) -> None:
        name = {"gen_ai.tool.name": result.tool_name}
        outcome = {**name, TOOL_SUCCESS: result.success}
        self.tool_calls.add(1, {**outcome, sc.TOOL_OUTPUT_LEVEL: result.output_level.value})
        self.tool_duration.record(result.duration_ms / 1000, outcome)
        self.observation_tokens.record(result.observation_tokens, name)
        if result.retry_count:
            self.tool_retries.add(result.retry_count, name)
        if not result.success:
            self.tool_errors.add(1, {**name, "error.type": result.error_type.value if result.error_type else "error"})

    def record_tokens(self, *, model: str, provider: str, input_tokens: int, output_tokens: int) -> None:
        attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                      "gen_ai.provider.name": provider or "unknown"}
        self.token_usage.record(input_tokens, {**attributes, "gen_ai.token.type": "input"})
        self.token_usage.record(output_tokens, {**attributes, "gen_ai.token.type": "output"})
