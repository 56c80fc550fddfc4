"""POST /v1/metrics: accepts OTLP metrics, so an agent can send spans and metrics to one endpoint.

The pipeline's runtime exports its metrics (pipeline.runtime.telemetry.metrics) to the same OTLP
endpoint as its spans. ctxlens does not store metrics: every figure they carry (tool calls,
errors, durations, tokens) the dashboard already computes from the stored spans, over any window.
This receiver checks them as it checks spans — the key (the router has usually admitted it from
the headers already), the size, the content type and encoding, that the body decodes — and
answers 200 with an ExportMetricsServiceResponse, so exporters neither retry nor log a failure
every interval. Send metrics to a metrics backend as well if you want them kept.
"""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from pipeline.conf import ctxlens_config
from pipeline.ingest import service
from pipeline.ingest.decode import otlp
from pipeline.ingest.decode.decompress import BodyTooLarge, CorruptBody, UnsupportedEncoding, decompress
from pipeline.ingest.service import Failed, Kind
from pipeline.models import ApiKey
from pipeline.receivers.otlp_http import Reply, failure_reply, http_response, off_the_loop, post_only

logger = logging.getLogger(__name__)


def data_points(request: ExportMetricsServiceRequest) -> int:
    total = 0
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                kind = metric.WhichOneof("data")
                total += len(getattr(metric, kind).data_points) if kind else 0
    return total


def _decode(body: bytes, content_type: str, content_encoding: str) -> ExportMetricsServiceRequest | Failed:
    if content_type not in (otlp.PROTOBUF, otlp.JSON):
        return Failed(Kind.UNSUPPORTED, "Content-Type must be application/x-protobuf or application/json")
    try:
        raw = decompress(body, content_encoding, ctxlens_config().max_ingest_bytes)
    except BodyTooLarge:
        return service.too_large()
    except UnsupportedEncoding as error:
        return Failed(Kind.UNSUPPORTED, str(error))
    except CorruptBody as error:
        return Failed(Kind.INVALID_ARGUMENT, str(error))
    request = ExportMetricsServiceRequest()
    try:
        if content_type == otlp.PROTOBUF:
            request.ParseFromString(raw)
        else:
            json_format.Parse(raw or b"{}", request, ignore_unknown_fields=True)
    except (DecodeError, json_format.ParseError, ValueError, RuntimeError, RecursionError):  # as the trace decoder
        return Failed(Kind.INVALID_ARGUMENT, "the body is not an OTLP ExportMetricsServiceRequest")
    return request


def accept_metrics(body: bytes, content_type: str, content_encoding: str, authorization: str | None,
                   key: ApiKey | None) -> Reply:
    admitted = service.admit(authorization, key=key)
    if isinstance(admitted, Failed):
        return failure_reply(admitted, content_type)
    decoded = _decode(body, content_type, content_encoding)
    if isinstance(decoded, Failed):
        return failure_reply(decoded, content_type)
    logger.debug("accepted %d metric data points (not stored)", data_points(decoded))
    reply = b"{}" if content_type == otlp.JSON else ExportMetricsServiceResponse().SerializeToString()
    return Reply(200, reply, content_type)


@csrf_exempt
async def otlp_metrics(request: HttpRequest) -> HttpResponse:
    request.get_host()  # ALLOWED_HOSTS, as the other OTLP views
    content_type = (request.content_type or "").strip().lower()
    if request.method != "POST":
        reply = post_only(content_type)
    else:
        reply = await off_the_loop(accept_metrics)(
            request.body, content_type, request.headers.get("Content-Encoding", ""),
            request.headers.get("Authorization"), None,
        )
    return http_response(reply)

