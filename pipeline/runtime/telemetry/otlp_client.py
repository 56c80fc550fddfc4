"""Send OTLP export requests (spans or log records) to any OTLP endpoint: HTTP protobuf, HTTP JSON or gRPC.

Retries follow the OTLP spec: HTTP 429/502/503/504 and dropped connections, gRPC
UNAVAILABLE/RESOURCE_EXHAUSTED/…, with exponential backoff and jitter, honouring
`Retry-After` (seconds or HTTP date) and gRPC RetryInfo. Anything else fails at once with
an ExportError that says what the endpoint answered.
"""

from __future__ import annotations

import email.utils
import gzip
import http.client
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from pipeline.runtime.telemetry.otlp_json import request_to_json
from pipeline.runtime.telemetry.otlp_outcome import ExportError, ExportResult, Retry, accepted_but

PROTOCOLS = ("http/protobuf", "http/json", "grpc")
RETRYABLE_HTTP = frozenset({429, 502, 503, 504})
MAX_BACKOFF_SECONDS = 60.0
ExportRequest = ExportTraceServiceRequest | ExportLogsServiceRequest
REPLIES: dict[type[Message], type[Message]] = {ExportTraceServiceRequest: ExportTraceServiceResponse,
                                               ExportLogsServiceRequest: ExportLogsServiceResponse}


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delay-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (now if now is not None else time.time()))


def traces_url(endpoint: str) -> str:
    """`http://host:4318` → `http://host:4318/v1/traces`; a URL with a path is used as given."""
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ExportError(f"the endpoint must be an http:// or https:// URL, got {endpoint!r}")
    if parts.path in ("", "/"):
        parts = parts._replace(path="/v1/traces")
    return urllib.parse.urlunsplit(parts)


def logs_url(endpoint: str) -> str:
    """Where log records go beside a traces endpoint: `http://host:4318`, `…/v1/traces` or
    `…/v1/logs` → `…/v1/logs`. A URL with any other path names where spans go only: ExportError."""
    parts = urllib.parse.urlsplit(traces_url(endpoint))
    path = parts.path.rstrip("/")
    if not path.endswith(("/v1/traces", "/v1/logs")):
        raise ExportError(f"no logs URL follows from {endpoint!r} (its path is not …/v1/traces): name it")
    return urllib.parse.urlunsplit(parts._replace(path=path.removesuffix("/v1/traces").removesuffix("/v1/logs")
                                                  + "/v1/logs"))


@dataclass
class OtlpClient:
    endpoint: str
    protocol: str = "http/protobuf"
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 30.0
    max_retries: int = 8
    compression: bool = True
    sleep: Callable[[float], None] = time.sleep
    logs_endpoint: str = ""  # HTTP: where log records go, when not beside `endpoint` (logs_url)

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ExportError(f"unknown protocol {self.protocol!r}; use one of {', '.join(PROTOCOLS)}")
        self._grpc = None
        if self.protocol == "grpc":
            from pipeline.runtime.telemetry.otlp_grpc_client import GrpcExportClient

            self._grpc = GrpcExportClient(self.endpoint, self.headers, self.timeout, self.compression)
        else:
            self._traces_url = traces_url(self.endpoint)

    def logs_url(self) -> str:
        """The URL log records are posted to: `logs_endpoint` as given (a bare host: its /v1/logs),
        else beside `endpoint`; ExportError when none follows from it."""
        if self.logs_endpoint and urllib.parse.urlsplit(self.logs_endpoint).path not in ("", "/"):
            return traces_url(self.logs_endpoint)  # checked as any endpoint is; a path is used as given
        return logs_url(self.logs_endpoint or self.endpoint)

    def close(self) -> None:
        if self._grpc is not None:
            self._grpc.close()

    def send(self, request: ExportRequest) -> ExportResult:
        """Deliver one request of spans or of log records, retrying transient failures; raises
        ExportError otherwise."""
        for attempt in range(self.max_retries + 1):
            try:
                result = self._grpc.export(request) if self._grpc else self._post(request)
                result.attempts = attempt + 1
                return result
            except Retry as retry:
                if attempt == self.max_retries:
                    raise ExportError(f"gave up after {attempt + 1} attempts: {retry.reason}") from None
                backoff = min(MAX_BACKOFF_SECONDS, 2**attempt * random.uniform(0.8, 1.2))
                self.sleep(min(MAX_BACKOFF_SECONDS, retry.delay) if retry.delay is not None else backoff)
        raise AssertionError("unreachable")

    def _post(self, request: ExportRequest) -> ExportResult:
        if self.protocol == "http/json":
            body, content_type = request_to_json(request), "application/json"
        else:
            body, content_type = request.SerializeToString(), "application/x-protobuf"
        headers = {**self.headers, "Content-Type": content_type, "User-Agent": "ctxlens-export"}
        if self.compression:
            body = gzip.compress(body, compresslevel=5)
            headers["Content-Encoding"] = "gzip"
        url = self.logs_url() if isinstance(request, ExportLogsServiceRequest) else self._traces_url
        http_request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(http_request, timeout=self.timeout) as reply:
                return _partial_success(type(request), reply.read(), reply.headers.get("Content-Type", ""))
        except urllib.error.HTTPError as error:
            detail = error.read()[:300].decode("utf-8", errors="replace")
            if error.code in RETRYABLE_HTTP:
                raise Retry(f"HTTP {error.code}", parse_retry_after(error.headers.get("Retry-After"))) from None
            raise ExportError(f"the endpoint answered HTTP {error.code}: {detail}") from None
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as error:
            reason = getattr(error, "reason", error)
            raise Retry(f"connection failed ({reason})") from None


def _partial_success(request_type: type[Message], body: bytes, content_type: str) -> ExportResult:
    response = REPLIES[request_type]()
    try:
        if "json" in content_type:
            from google.protobuf import json_format

            json_format.Parse(body or b"{}", response, ignore_unknown_fields=True)
        else:
            response.ParseFromString(body)
    except Exception:  # a 2xx with a body we cannot read is still a success (as the OTel SDK treats it)
        return ExportResult()
    return accepted_but(response.partial_success)
