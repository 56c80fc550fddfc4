"""OTLP/gRPC ingest: TraceService/Export and LogsService/Export on its own port (4317 by default).

The same way in as POST /v1/traces and POST /v1/logs: `pipeline.ingest.service.admit` checks
the caller (an ApiKey with the ingest scope, sent as `authorization: Bearer <key>` metadata)
and its rate budget from the metadata, before the request message is received; then
`pipeline.ingest.service.ingest(..., key=key)` checks the size, decodes and stores the body
(one transaction per request, idempotent on trace and span id, and on a log record's content).
This module only translates the outcome into gRPC, with the service's messages; the replies
are the ones POST /v1/* gives in protobuf (`pipeline.ingest.decode.otlp.export_response`).

Export is a unary RPC, but it is registered here as request-streaming: grpcio's sync server
receives (and inflates, when compressed) a unary handler's message before the handler runs,
interceptors included, while a streaming handler's message is received only when the handler
asks for it. So a request without a valid key is refused without its message ever being
inflated (a few KB of gzip can inflate to CTXLENS_MAX_INGEST_BYTES). Nothing on the wire tells
the two apart: unary clients (every OTLP exporter) call it as before.

Status codes follow the OTLP spec so exporters retry what is worth retrying: UNAUTHENTICATED
and PERMISSION_DENIED for keys, INVALID_ARGUMENT for bodies that cannot be decoded,
RESOURCE_EXHAUSTED over the size limit, RESOURCE_EXHAUSTED + RetryInfo (retryable) when the key
is over its rate limit, UNAVAILABLE + RetryInfo when the database is unreachable, INTERNAL for a
fault of the server's own, and a partial_success for spans (or log records) refused one by one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent import futures

import grpc
from django.db import close_old_connections
from google.protobuf.duration_pb2 import Duration
from google.rpc.error_details_pb2 import RetryInfo

from pipeline.conf import ctxlens_config
from pipeline.ingest import service
from pipeline.ingest.decode.otlp import PROTOBUF, export_response
from pipeline.ingest.service import Failed, IngestRequest, Kind, Rejected
from pipeline.ingest.write.writer_threads import keep_connections_on

logger = logging.getLogger(__name__)

THREAD_PREFIX = "otlp-grpc"
keep_connections_on(THREAD_PREFIX)  # the server's workers live as long as it does

TRACE_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"
DEFAULT_PORT = 4317
RETRY_INFO_KEY = "google.rpc.retryinfo-bin"
# gRPC itself refuses messages past max_receive_message_length, with its own text, before the
# handler runs. It is set this much above CTXLENS_MAX_INGEST_BYTES so that a body a little too
# large reaches the service and is refused with the message every transport gives.
RECEIVE_SLACK_BYTES = 1024 * 1024
STATUS_CODE = {Kind.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
               Kind.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
               Kind.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
               Kind.TIMED_OUT: grpc.StatusCode.DEADLINE_EXCEEDED,
               Kind.TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
               Kind.UNSUPPORTED: grpc.StatusCode.INVALID_ARGUMENT,
               Kind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
               Kind.THROTTLED: grpc.StatusCode.RESOURCE_EXHAUSTED,  # with RetryInfo: retryable (OTLP spec)
               Kind.INTERNAL: grpc.StatusCode.INTERNAL}


def _retry_metadata(seconds: int) -> tuple[tuple[str, bytes], ...]:
    return ((RETRY_INFO_KEY, RetryInfo(retry_delay=Duration(seconds=seconds)).SerializeToString()),)


def authorization(metadata: tuple[tuple[str, str | bytes], ...]) -> str | None:
    """The `authorization` metadata value (gRPC lower-cases keys), for pipeline.ingest.auth."""
    for name, value in metadata:
        if name.lower() == "authorization" and isinstance(value, str):
            return value
    return None


class OtlpIngest:
    """The Export handler of TraceService, or of LogsService with `logs`. Requests arrive as raw
    bytes and are decoded once; replies leave as bytes."""

    def __init__(self, service_name: str, *, logs: bool = False) -> None:
        self.method, self.logs = f"/{service_name}/Export", logs

    def export(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        close_old_connections()
        try:
            outcome = self._ingest(requests, context)
        finally:
            close_old_connections()
        if isinstance(outcome, Failed):
            if outcome.retry_after:
                context.set_trailing_metadata(_retry_metadata(outcome.retry_after))
            context.abort(STATUS_CODE[outcome.kind], outcome.message)
        rejected, message = (outcome.rejected, outcome.message) if isinstance(outcome, Rejected) else (0, "")
        return export_response(PROTOBUF, rejected, message, logs=self.logs)

    def _ingest(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> service.Outcome:
        """The key and its rate budget from the metadata, then (only if they pass) the message."""
        header = authorization(tuple(context.invocation_metadata()))
        key = service.admit(header)
        if isinstance(key, Failed):
            return key  # the message is never received, so never inflated
        body = next(requests, None)  # the one message of a unary call; grpcio receives it now
        if body is None:  # what grpcio answers a unary method called without a message
            context.abort(grpc.StatusCode.UNIMPLEMENTED, f'"{self.method}" requires exactly one request message.')
        return service.ingest(IngestRequest(source="grpc", body=body, authorization=header, logs=self.logs), key=key)


def build_server(
    host: str = "127.0.0.1", port: int | None = None, workers: int = 4, *, tls: tuple[bytes, bytes] | None = None
) -> tuple[grpc.Server, int]:
    """A gRPC server, not yet started, and the port it bound (useful with port 0).

    `tls` = (certificate chain PEM, private key PEM) serves TLS: API keys travel in metadata, so
    anything but a loopback address should only ever be served that way.
    """
    max_bytes = ctxlens_config().max_ingest_bytes
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=THREAD_PREFIX),
        options=[
            ("grpc.max_receive_message_length", max_bytes + RECEIVE_SLACK_BYTES),
            ("grpc.max_send_message_length", 4 * 1024 * 1024),
        ],
        maximum_concurrent_rpcs=workers * 16,
    )
    # Request-streaming so that the key is checked before the message is received (module
    # docstring); unary clients see a unary method. Raw bytes both ways: decode_*_protobuf parses
    # the request once, export_response gives the reply serialised.
    handlers = [
        grpc.method_handlers_generic_handler(name, {"Export": grpc.stream_unary_rpc_method_handler(
            OtlpIngest(name, logs=logs).export, request_deserializer=None, response_serializer=None)})
        for name, logs in ((TRACE_SERVICE, False), (LOGS_SERVICE, True))
    ]
    server.add_generic_rpc_handlers(handlers)
    if port is None:
        port = ctxlens_config().otlp_grpc_port or DEFAULT_PORT
    address = f"{host}:{port}"
    if tls is None:
        bound = server.add_insecure_port(address)
    else:
        certificate, key = tls
        bound = server.add_secure_port(address, grpc.ssl_server_credentials([(key, certificate)]))
    if bound == 0:
        raise OSError(f"could not listen on {host}:{port}")
    return server, bound
