"""Where the pipeline's spans go: ObservabilityConfig from the runtime settings, sampling, and a
TracerProvider with one processor per destination: the OTLP endpoint, if one is configured, and
every SpanExporter you pass.

    provider = build_tracer_provider(ObservabilityConfig.from_settings(otlp_endpoint="http://ctxlens:8000"))

An agent reaches a ctxlens server over OTLP (endpoint + `Authorization=Bearer <ingest key>`
header); a server running agents in its own process passes its in-process exporter instead.
The global TracerProvider is never set: each pipeline.runtime.telemetry.spans.Telemetry owns its provider.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, Sampler, TraceIdRatioBased

from pipeline.runtime.settings import runtime_settings

logger = logging.getLogger(__name__)

SCOPE_NAME = "ctxlens.pipeline"
SCOPE_VERSION = "1.0.0"
SAMPLING_RATES = {"always": 1.0, "high": 0.5, "medium": 0.1, "low": 0.01, "never": 0.0}


def _header(item: str) -> tuple[str, str]:
    """`key=value` → (key, value), the value percent-decoded (a literal % is %25)."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"{item!r} is not key=value")
    return key.strip(), unquote(value.strip())


def parse_headers(text: str) -> dict[str, str]:
    """`k1=v1,k2=v2` (OTEL_EXPORTER_OTLP_HEADERS format, values percent-decoded) → dict."""
    return dict(_header(item) for item in filter(None, (part.strip() for part in (text or "").split(","))))


def parse_header_options(items: list[str]) -> dict[str, str]:
    """Repeated `--header KEY=VALUE` options: one header each (a comma stays in its value), values
    percent-decoded like OTEL_EXPORTER_OTLP_HEADERS (`Authorization=Bearer%20ctx_…`)."""
    return dict(_header(item) for item in items)


@dataclass(frozen=True)
class ObservabilityConfig:
    sampling: str = "always"
    otlp_endpoint: str = ""
    otlp_headers: Mapping[str, str] = field(default_factory=dict)
    otlp_compression: str = "gzip"
    otlp_protocol: str = "http/protobuf"  # or http/json, grpc (pipeline.runtime.telemetry.exporters)
    service_name: str = "ctxlens-agent"
    environment: str = "development"
    capture_content: bool = True  # messages, arguments and results on spans
    # Metrics (pipeline.runtime.telemetry.metrics), exported to otlp_endpoint; the seeds' defaults.
    enable_metrics: bool = True
    metrics_export_interval_s: float = 60.0
    metrics_export_timeout_ms: int = 3000

    @classmethod
    def from_settings(cls, **overrides: Any) -> ObservabilityConfig:
        config = runtime_settings()
        base = cls(
            sampling=config.sampling,
            otlp_endpoint=config.otlp_endpoint,
            otlp_headers=parse_headers(config.otlp_headers),
            otlp_compression=config.otlp_compression,
            otlp_protocol=config.otlp_protocol,
            service_name=config.service_name,
            environment=config.environment,
            enable_metrics=config.metrics_enabled,
            metrics_export_interval_s=config.metrics_export_interval_s,
            metrics_export_timeout_ms=config.metrics_export_timeout_ms,
        )
        return replace(base, **overrides)

    @property
    def sampling_rate(self) -> float:
        try:
            return SAMPLING_RATES[self.sampling]
        except KeyError:
            raise ValueError(f"sampling must be one of {', '.join(SAMPLING_RATES)}, not {self.sampling!r}") from None


def _sampler(rate: float) -> Sampler:
    if rate >= 1:
        return ALWAYS_ON
    if rate <= 0:
        return ALWAYS_OFF
    return ParentBased(TraceIdRatioBased(rate))


def otlp_exporter(config: ObservabilityConfig) -> SpanExporter:
    from pipeline.runtime.telemetry.exporters import span_exporter

    return span_exporter(
        config.otlp_endpoint,
        protocol=config.otlp_protocol,
        headers=config.otlp_headers,
        compression=config.otlp_compression,
        timeout=10,
    )


def build_resource(config: ObservabilityConfig) -> Resource:
    return Resource.create(
        {
            "service.name": config.service_name,
            "deployment.environment.name": config.environment,
            "telemetry.sdk.name": "opentelemetry",
        }
    )


def build_tracer_provider(
    config: ObservabilityConfig, *, exporters: Sequence[SpanExporter] = (), batch: bool = True
) -> TracerProvider:
    """A TracerProvider for one use: resource, sampler, and a processor per destination."""
    resource = build_resource(config)
    provider = TracerProvider(resource=resource, sampler=_sampler(config.sampling_rate))
    destinations: list[SpanExporter] = []
    if config.otlp_endpoint:
        destinations.append(otlp_exporter(config))
    destinations.extend(exporters)
    for exporter in destinations:
        processor = BatchSpanProcessor(exporter, schedule_delay_millis=500) if batch else SimpleSpanProcessor(exporter)
        provider.add_span_processor(processor)
    return provider
