"""Where the pipeline's spans go: ObservabilityConfig from settings, sampling, and a TracerProvider
with one processor per destination (ctxlens's store in-process, any OTLP endpoint, or exporters you pass).

    provider = build_tracer_provider(ObservabilityConfig.from_settings(otlp_endpoint="http://collector:4318"))

The global TracerProvider is never set: each pipeline.telemetry.Telemetry owns its provider.
`span_record()` turns an SDK span into the SpanRecord every way into the store produces.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote

from django.db import connections
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, Sampler, TraceIdRatioBased

from pipeline.conf import ctxlens_config
from pipeline.ingest.records import SpanEvent, SpanRecord

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
    otlp_protocol: str = "http/protobuf"  # or http/json, grpc (pipeline.otlp_exporters)
    service_name: str = "ctxlens-agent"
    environment: str = "development"
    in_process: bool = True  # hand spans straight to ctxlens's store
    capture_content: bool = True  # messages, arguments and results on spans

    @classmethod
    def from_settings(cls, **overrides: Any) -> ObservabilityConfig:
        config = ctxlens_config()
        base = cls(
            sampling=config.sampling,
            otlp_endpoint=config.otlp_endpoint,
            otlp_headers=parse_headers(config.otlp_headers),
            otlp_compression=config.otlp_compression,
            otlp_protocol=config.otlp_protocol,
            service_name=config.service_name,
            environment=config.environment,
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
    from pipeline.otlp_exporters import span_exporter

    return span_exporter(
        config.otlp_endpoint,
        protocol=config.otlp_protocol,
        headers=config.otlp_headers,
        compression=config.otlp_compression,
        timeout=10,
    )


def build_tracer_provider(
    config: ObservabilityConfig, *, exporters: Sequence[SpanExporter] = (), batch: bool = True
) -> TracerProvider:
    """A TracerProvider for one use: resource, sampler, and a processor per destination."""
    resource = Resource.create(
        {
            "service.name": config.service_name,
            "deployment.environment.name": config.environment,
            "telemetry.sdk.name": "opentelemetry",
        }
    )
    provider = TracerProvider(resource=resource, sampler=_sampler(config.sampling_rate))
    destinations: list[SpanExporter] = []
    if config.in_process:
        destinations.append(StoreSpanExporter(own_thread=batch))
    if config.otlp_endpoint:
        destinations.append(otlp_exporter(config))
    destinations.extend(exporters)
    for exporter in destinations:
        processor = BatchSpanProcessor(exporter, schedule_delay_millis=500) if batch else SimpleSpanProcessor(exporter)
        provider.add_span_processor(processor)
    return provider


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def span_record(span: ReadableSpan) -> SpanRecord:
    """An SDK span as the internal SpanRecord that every way in produces."""
    ctx = span.get_span_context()
    return SpanRecord(
        trace_id=format(ctx.trace_id, "032x"),
        span_id=format(ctx.span_id, "016x"),
        parent_span_id=format(span.parent.span_id, "016x") if span.parent else "",
        name=span.name,
        start_time_unix_nano=span.start_time or 0,
        end_time_unix_nano=span.end_time or 0,
        kind=span.kind.value + 1,  # the SDK counts from INTERNAL = 0, OTLP from UNSPECIFIED = 0
        status_code=span.status.status_code.value,
        status_message=span.status.description or "",
        attributes={k: _plain(v) for k, v in (span.attributes or {}).items()},
        events=[SpanEvent(e.name, e.timestamp, {k: _plain(v) for k, v in (e.attributes or {}).items()}) for e in span.events],
        links=[
            {"trace_id": format(link.context.trace_id, "032x"), "span_id": format(link.context.span_id, "016x"),
             "attributes": dict(link.attributes or {})}
            for link in span.links
        ],
        resource={k: _plain(v) for k, v in span.resource.attributes.items()},
        scope_name=span.instrumentation_scope.name if span.instrumentation_scope else "",
        scope_version=(span.instrumentation_scope.version or "") if span.instrumentation_scope else "",
    )


class StoreSpanExporter(SpanExporter):
    """In-process destination: SpanRecords straight into ctxlens's store (one transaction per batch).

    `own_thread=True` when a BatchSpanProcessor calls it on its worker thread: that thread's
    database connections are closed after each batch. Under a SimpleSpanProcessor it runs on the
    agent's own thread, whose connection (and open transaction) it must leave alone.
    """

    def __init__(self, *, own_thread: bool = True) -> None:
        self.own_thread = own_thread

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        from pipeline.ingest.store import store_spans

        try:
            result = store_spans([span_record(s) for s in spans], source="pipeline")
            if result.rejected:
                logger.warning("ctxlens store rejected %d spans: %s", result.rejected, result.error_message)
            return SpanExportResult.SUCCESS
        except Exception:
            logger.exception("Storing %d spans failed", len(spans))
            return SpanExportResult.FAILURE
        finally:
            if self.own_thread:
                connections.close_all()  # the processor thread's own connections

    def shutdown(self) -> None:
        return None
