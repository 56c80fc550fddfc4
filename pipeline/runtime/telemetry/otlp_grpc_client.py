"""The gRPC half of OtlpClient: TraceService/Export and LogsService/Export with OTLP's retryable
status codes."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping

import grpc
from google.rpc.error_details_pb2 import RetryInfo
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2_grpc import LogsServiceStub
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

from pipeline.runtime.telemetry.otlp_outcome import ExportError, ExportResult, Retry, accepted_but

RETRYABLE_GRPC = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
RETRY_INFO_KEY = "google.rpc.retryinfo-bin"


def grpc_target(endpoint: str) -> tuple[str, bool]:
    """`http://host:4317` → ("host:4317", insecure); `https://…` → TLS; a bare `host:port` is insecure."""
    if "://" not in endpoint:
        return endpoint, True
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme not in ("http", "https", "grpc", "grpcs") or not parts.hostname:
        raise ExportError(f"the gRPC endpoint must look like http://host:4317, got {endpoint!r}")
    port = parts.port or 4317
    return f"{parts.hostname}:{port}", parts.scheme in ("http", "grpc")


def retry_delay(error: grpc.RpcError) -> float | None:
    """The server's RetryInfo delay from the trailing metadata, as the OTel exporter reads it."""
    try:
        metadata = dict(error.trailing_metadata() or ())
    except Exception:
        return None
    raw = metadata.get(RETRY_INFO_KEY)
    if raw is None:
        return None
    info = RetryInfo()
    info.ParseFromString(raw)
    return info.retry_delay.seconds + info.retry_delay.nanos / 1e9


class GrpcExportClient:
    def __init__(self, endpoint: str, headers: Mapping[str, str], timeout: float, compression: bool) -> None:
        target, insecure = grpc_target(endpoint)
        options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
        self._channel = (
            grpc.insecure_channel(target, options=options)
            if insecure
            else grpc.secure_channel(target, grpc.ssl_channel_credentials(), options=options)
        )
        self._exports = {ExportTraceServiceRequest: TraceServiceStub(self._channel).Export,
                         ExportLogsServiceRequest: LogsServiceStub(self._channel).Export}
        # gRPC metadata keys must be lower case.
        self._metadata = tuple((key.lower(), value) for key, value in headers.items())
        self._timeout = timeout
        self._compression = grpc.Compression.Gzip if compression else grpc.Compression.NoCompression

    def export(self, request: ExportTraceServiceRequest | ExportLogsServiceRequest) -> ExportResult:
        try:
            response = self._exports[type(request)](
                request, metadata=self._metadata, timeout=self._timeout, compression=self._compression
            )
        except grpc.RpcError as error:
            code = error.code()
            if code in RETRYABLE_GRPC:
                raise Retry(f"gRPC {code.name}", retry_delay(error)) from None
            raise ExportError(f"the endpoint answered gRPC {code.name}: {error.details()}") from None
        return accepted_but(response.partial_success)

    def close(self) -> None:
        self._channel.close()
