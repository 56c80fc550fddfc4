"""OTLP/gRPC ingest: TraceService/Export on its own port (4317 by default).

The same way in as POST /v1/traces: the body is decoded by `pipeline.ingest.otlp`, stored by
`store_spans` (one transaction per request, idempotent on trace and span id), and the caller
is an ApiKey with the ingest scope, sent as `authorization: Bearer <key>` metadata and checked
by the same `pipeline.ingest.auth.check_bearer_key` as HTTP.

Status codes follow the OTLP spec so exporters retry what is worth retrying: UNAUTHENTICATED
and PERMISSION_DENIED for keys, INVALID_ARGUMENT for bodies that cannot be decoded,
UNAVAILABLE + RetryInfo when the key is over its rate limit or the database is unreachable,
and a partial_success for spans refused one by one.
"""

from __future__ import annotations

import logging
from concurrent import futures

import grpc
from django.db import DatabaseError, close_old_connections
from google.protobuf.duration_pb2 import Duration
from google.rpc.error_details_pb2 import RetryInfo
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceResponse,
)

from pipeline.artifacts import ArtifactStorageError
from pipeline.conf import ctxlens_config
from pipeline.ingest.auth import ApiKeyError, check_bearer_key
from pipeline.ingest.otlp import OtlpDecodeError, decode_traces_protobuf
from pipeline.ingest.store import store_spans
from pipeline.models.apikeys import Scope
from pipeline.ratelimit import check_ingest_rate

logger = logging.getLogger(__name__)

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
DEFAULT_PORT = 4317
RETRY_INFO_KEY = "google.rpc.retryinfo-bin"
DATABASE_RETRY_SECONDS = 2


def _retry_metadata(seconds: int) -> tuple[tuple[str, bytes], ...]:
    return ((RETRY_INFO_KEY, RetryInfo(retry_delay=Duration(seconds=seconds)).SerializeToString()),)


def authorization(metadata: tuple[tuple[str, str | bytes], ...]) -> str | None:
    """The `authorization` metadata value (gRPC lower-cases keys), for pipeline.ingest.auth."""
    for name, value in metadata:
        if name.lower() == "authorization" and isinstance(value, str):
            return value
    return None


class TraceIngest:
    """The TraceService/Export handler. Requests arrive as raw bytes and are decoded once."""

    def export(self, body: bytes, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        close_old_connections()
        try:
            return self._export(body, context)
        except ArtifactStorageError as error:  # a full artifact disk: nothing stored, the client retries
            logger.error("OTLP/gRPC ingest answered UNAVAILABLE: %s", error)
            context.set_trailing_metadata(_retry_metadata(DATABASE_RETRY_SECONDS))
            context.abort(grpc.StatusCode.UNAVAILABLE, str(error))
        except DatabaseError:
            logger.exception("OTLP/gRPC ingest: database error")
            context.set_trailing_metadata(_retry_metadata(DATABASE_RETRY_SECONDS))
            context.abort(grpc.StatusCode.UNAVAILABLE, "the database is unavailable; retry later")
        finally:
            close_old_connections()

    def _export(self, body: bytes, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        try:
            key = check_bearer_key(authorization(tuple(context.invocation_metadata())), Scope.INGEST)
        except ApiKeyError as error:
            code = grpc.StatusCode.PERMISSION_DENIED if error.status == 403 else grpc.StatusCode.UNAUTHENTICATED
            context.abort(code, error.message)
        already = check_ingest_rate(key, 0)
        if not already.allowed:  # over the limit: do not even decode
            self._throttle(context, already.retry_after)
        try:
            decoded = decode_traces_protobuf(body)
        except OtlpDecodeError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        decision = check_ingest_rate(key, len(decoded.spans))
        if not decision.allowed:
            self._throttle(context, decision.retry_after)
        result = store_spans(decoded.spans, source="grpc")
        rejected = len(decoded.errors) + result.rejected
        if not rejected:
            return ExportTraceServiceResponse()
        message = "; ".join(part for part in (decoded.error_message, result.error_message) if part)
        return ExportTraceServiceResponse(
            partial_success=ExportTracePartialSuccess(rejected_spans=rejected, error_message=message)
        )

    @staticmethod
    def _throttle(context: grpc.ServicerContext, retry_after: int) -> None:
        context.set_trailing_metadata(_retry_metadata(retry_after))
        context.abort(grpc.StatusCode.UNAVAILABLE,
                      f"this API key is over its ingest rate limit; retry in {retry_after} s")


def build_server(host: str = "127.0.0.1", port: int | None = None, workers: int = 4) -> tuple[grpc.Server, int]:
    """A gRPC server, not yet started, and the port it bound (useful with port 0)."""
    max_bytes = ctxlens_config().max_ingest_bytes
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="otlp-grpc"),
        options=[
            ("grpc.max_receive_message_length", max_bytes),
            ("grpc.max_send_message_length", 4 * 1024 * 1024),
        ],
        maximum_concurrent_rpcs=workers * 16,
    )
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Export": grpc.unary_unary_rpc_method_handler(
                TraceIngest().export,
                request_deserializer=None,  # raw bytes: decode_traces_protobuf parses them once
                response_serializer=ExportTraceServiceResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    if port is None:
        port = ctxlens_config().otlp_grpc_port or DEFAULT_PORT
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"could not listen on {host}:{port}")
    return server, bound
