"""OTel SDK span exporters for the pipeline's spans, by OTLP protocol.

    exporter = span_exporter("http://collector:4318", protocol="http/json", headers={...})

`http/protobuf` and `grpc` are the OpenTelemetry exporters themselves; `http/json` (which
the Python SDK does not offer) encodes with the SDK's own encoder and posts through
`pipeline.runtime.telemetry.otlp_client`, with the same retry rules.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from pipeline.runtime.telemetry.otlp_client import PROTOCOLS, OtlpClient, traces_url
from pipeline.runtime.telemetry.otlp_outcome import ExportError

logger = logging.getLogger(__name__)


class JsonSpanExporter(SpanExporter):
    """OTLP/HTTP JSON: hex ids, integer enums, camelCase keys (what collectors expect)."""

    def __init__(self, endpoint: str, headers: Mapping[str, str], compression: bool, timeout: float) -> None:
        self._client = OtlpClient(endpoint, protocol="http/json", headers=dict(headers), timeout=timeout,
                                  max_retries=3, compression=compression)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._client.send(encode_spans(spans))
        except ExportError as error:
            logger.warning("OTLP/JSON export of %d spans failed: %s", len(spans), error)
            return SpanExportResult.FAILURE
        if result.rejected:
            logger.warning("the OTLP endpoint rejected %d spans: %s", result.rejected, result.message)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._client.close()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def span_exporter(
    endpoint: str,
    *,
    protocol: str = "http/protobuf",
    headers: Mapping[str, str] | None = None,
    compression: str = "gzip",
    timeout: float = 10,
) -> SpanExporter:
    """A SpanExporter that sends to `endpoint` with `protocol` (http/protobuf, http/json or grpc)."""
    headers = dict(headers or {})
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http import Compression
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=traces_url(endpoint), headers=headers,
                                compression=Compression(compression), timeout=timeout)
    if protocol == "grpc":
        from grpc import Compression as GrpcCompression
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

        from pipeline.runtime.telemetry.otlp_grpc_client import grpc_target

        target, insecure = grpc_target(endpoint)
        grpc_compression = {"gzip": GrpcCompression.Gzip, "deflate": GrpcCompression.Deflate}.get(
            compression, GrpcCompression.NoCompression)
        return GrpcSpanExporter(endpoint=target, insecure=insecure, compression=grpc_compression, timeout=timeout,
                                headers={key.lower(): value for key, value in headers.items()})
    if protocol == "http/json":
        return JsonSpanExporter(endpoint, headers, compression != "none", timeout)
    raise ValueError(f"OTLP protocol must be one of {', '.join(PROTOCOLS)}, not {protocol!r}")
