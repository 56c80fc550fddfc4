"""The one ingest flow every receiver calls: authenticate → rate limit → size check → decode → store.

    outcome = ingest(IngestRequest(source="otlp", body=body, content_type=PROTOBUF, authorization=header))

The outcome is `Accepted` (everything stored), `Rejected` (items refused one by one, with their
count and why; the REST API, which stores a request whole or not at all, then stores nothing)
or `Failed` (a `Kind` — an HTTP-status-like code — and a message). Receivers only translate
their transport to and from this: OTLP/HTTP to a status code and a google.rpc.Status body,
OTLP/gRPC to a status code, REST to a DRF response. So a bad key, an oversized body, a
throttled key or a refused span read the same whichever way they came in.

A receiver that sees the headers before the body (the ASGI router in front of /v1/*) calls
`admit` first — key, rate budget, declared size — and `ingest(..., key=key)` once the body is
read, so an unauthorised client never gets its body buffered. Everything here is synchronous
and touches the database: OTLP/HTTP runs it on an ordinary worker thread with its
transactions on the ingest writer thread (pipeline.ingest.write.writer_threads), gRPC on its
worker threads, REST in its view.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, transaction
from rest_framework.utils import json as strict_json

from pipeline.artifacts.store import ArtifactStorageError
from pipeline.conf import ctxlens_config
from pipeline.ingest.auth import ApiKeyError, check_bearer_key
from pipeline.ingest.decode import otlp
from pipeline.ingest.decode.decompress import BodyTooLarge, CorruptBody, UnsupportedEncoding, decompress
from pipeline.ingest.ratelimit import check_ingest_rate
from pipeline.ingest.normalise.span import NormalisedSpan
from pipeline.ingest.records import LogRecord, SpanRecord
from pipeline.ingest.write.store import (
    IngestResult,
    PreparedBatch,
    prepare_spans,
    span_keys,
    store_prepared,
    store_prepared_together,
)
from pipeline.ingest.write.writer_threads import JoinableWork, outcome_of
from pipeline.models import ApiKey

logger = logging.getLogger(__name__)

INGEST_SCOPE = "ingest"
RETRY_BUSY_SECONDS = 1  # database locked, server busy: a moment
RETRY_STORAGE_SECONDS = 30  # artifact disk full: an operator has to act


class Kind(enum.Enum):
    """Why a request failed; the value is the HTTP status (the gRPC receiver maps it to a code)."""

    INVALID_ARGUMENT = 400
    UNAUTHENTICATED = 401
    PERMISSION_DENIED = 403
    TIMED_OUT = 408
    TOO_LARGE = 413
    UNSUPPORTED = 415  # content type or encoding
    THROTTLED = 429  # the key is over its rate: retry after `retry_after` seconds
    UNAVAILABLE = 503  # retry after `retry_after` seconds
    INTERNAL = 500  # the last resort: a fault of the server's, said without its internals


@dataclass(frozen=True)
class IngestRequest:
    source: str  # "otlp", "grpc" or "rest": the transport, stored on each span
    body: bytes
    content_type: str = otlp.PROTOBUF
    content_encoding: str = ""
    logs: bool = False  # OTLP logs instead of traces
    authorization: str | None = None  # the `Authorization` header or metadata


@dataclass
class Batch:
    """A decoded request: the items to store, the items refused while decoding, and what the
    receiver echoes back (REST: schema_version, event count, conversation ids)."""

    spans: list[SpanRecord] = field(default_factory=list)
    logs: list[LogRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    error_message: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Accepted:
    batch: Batch
    result: IngestResult  # accepted / duplicates


@dataclass
class Rejected:
    batch: Batch
    result: IngestResult
    rejected: int  # items refused (spans or log records)
    message: str  # "<n> span(s) rejected: <why>; <why>"


@dataclass
class Failed:
    kind: Kind
    message: str
    retry_after: int = 0  # seconds, for Kind.THROTTLED and Kind.UNAVAILABLE
    detail: Any = None  # structured field errors (REST validation), when there are some


Outcome = Accepted | Rejected | Failed


# ---- the messages every transport shares ----------------------------------------------------

def too_large(limit: int | None = None) -> Failed:
    limit = ctxlens_config().max_ingest_bytes if limit is None else limit
    return Failed(Kind.TOO_LARGE, f"request body is larger than {limit} bytes (CTXLENS_MAX_INGEST_BYTES)")


def throttled(retry_after: int) -> Failed:
    return Failed(Kind.THROTTLED, f"this API key is over its ingest rate limit; retry in {retry_after} s",
                  retry_after)


def server_busy() -> Failed:
    return Failed(Kind.UNAVAILABLE, "the server holds as many request bodies as it may "
                  f"(CTXLENS_MAX_INFLIGHT_BYTES); retry in {RETRY_BUSY_SECONDS} s", RETRY_BUSY_SECONDS)


def body_timed_out(seconds: float) -> Failed:
    return Failed(Kind.TIMED_OUT, f"no request body bytes arrived for {seconds:g} s")


# ---- at server start --------------------------------------------------------------------------

def load_ingest_data() -> None:
    """What ingest reads in its first requests, loaded while a server starts instead: the price
    table and the tokenizers (config/asgi.py, serve_otlp_grpc)."""
    from pipeline.insight.pricing import load_price_database
    from pipeline.tokens.encodings import preload_builtin

    load_price_database()
    preload_builtin()


# ---- the flow ---------------------------------------------------------------------------------

def authenticate(authorization: str | None) -> ApiKey | Failed:
    try:
        return check_bearer_key(authorization, INGEST_SCOPE)
    except ApiKeyError as error:
        kind = Kind.PERMISSION_DENIED if error.status == 403 else Kind.UNAUTHENTICATED
        return Failed(kind, error.message)


def admit(authorization: str | None, *, declared_length: int | None = None, key: ApiKey | None = None
          ) -> ApiKey | Failed:
    """What can be decided before the body is read: the key (unless `key` is already checked),
    whether it is over its rate budget, and the declared size."""
    return _guarded(lambda: _admit(authorization, declared_length, key))


def _admit(authorization: str | None, declared_length: int | None, key: ApiKey | None) -> ApiKey | Failed:
    if key is None:
        checked = authenticate(authorization)
        if isinstance(checked, Failed):
            return checked
        key = checked
    already = check_ingest_rate(key, 0)
    if not already.allowed:  # over the budget: do not even read the body
        return throttled(already.retry_after)
    if declared_length is not None and declared_length > ctxlens_config().max_ingest_bytes:
        return too_large()
    return key


def ingest(request: IngestRequest, *, key: ApiKey | None = None, run_store: RunStore | None = None) -> Outcome:
    """The whole flow. With `key`, `admit` already accepted the request (before its body was read).

    `run_store` runs each database transaction (default: here, inline); the OTLP/HTTP receiver
    runs the flow on an ordinary thread and passes the writer thread here, so decoding and
    normalising — CPU work that grows with the body — never hold the writer. A batch of more
    than CTXLENS_INGEST_CHUNK_SPANS spans is stored in transactions of that many, each queued
    behind the work other requests put on the writer meanwhile, so one huge request cannot
    stall the rest. Spans are still stored whole or not at all, and a request whose later
    chunk fails is answered UNAVAILABLE: its re-send stores the rest (stored spans are skipped).
    """
    if key is None:
        admitted = admit(request.authorization, declared_length=len(request.body))
        if isinstance(admitted, Failed):
            return admitted
        key = admitted
    return _guarded(lambda: _decode_and_store(request, key, run_store or _inline))


RunStore = Callable[[Callable[[], Any]], Any]
T = TypeVar("T")


def _inline(work: Callable[[], Any]) -> Any:
    return work()


def chunks_by_trace(spans: list[NormalisedSpan], size: int) -> list[list[NormalisedSpan]]:
    """`spans` in chunks of about `size`, cut only between traces (a trace larger than `size`
    alone is cut), so a trace's root and children commit together as in one request."""
    traces: dict[str, list[NormalisedSpan]] = {}
    for span in spans:
        traces.setdefault(span.record.trace_id, []).append(span)
    chunks: list[list[NormalisedSpan]] = [[]]
    for trace in traces.values():
        if chunks[-1] and len(chunks[-1]) + len(trace) > size:
            chunks.append([])
        for start in range(0, len(trace), size):
            if len(chunks[-1]) >= size:
                chunks.append([])
            chunks[-1].extend(trace[start:start + size])
    return chunks


class StoreChunk(JoinableWork):
    """One transaction's worth of a request. On the writer thread, chunks of other requests queued
    behind it join its transaction (group commit) when together they hold at most
    CTXLENS_INGEST_CHUNK_SPANS spans, share no span and carry no logs; each request still gets
    the counts it would have had alone, and all of them are stored or none."""

    def __init__(self, batch: PreparedBatch, source: str, logs: list[LogRecord] | None) -> None:
        self.batch, self.source, self.logs = batch, source, logs
        self.keys = span_keys(batch)  # computed here, on the request's thread, not on the writer's

    def __call__(self) -> IngestResult:
        return store_prepared(self.batch, source=self.source, logs=self.logs)

    def fits(self, group: list[StoreChunk]) -> bool:
        first = group[0]  # the others joined it, so they are like it: spans, no logs, its source
        if self.logs or not self.keys or first.logs or not first.keys or first.source != self.source:
            return False
        if len(self.keys) + sum(len(unit.keys) for unit in group) > ctxlens_config().ingest_chunk_spans:
            return False
        return all(self.keys.isdisjoint(unit.keys) for unit in group)

    @classmethod
    def run_together(cls, group: list[StoreChunk]) -> list[IngestResult | Exception]:
        try:
            return store_prepared_together([unit.batch for unit in group], source=group[0].source)
        except (OperationalError, InterfaceError) as error:  # the database's state, not a request's spans
            return [error] * len(group)
        except Exception:  # one request's spans may have failed the transaction: each on its own
            logger.info("a group commit failed; its %d requests are stored one by one", len(group), exc_info=True)
            return [outcome_of(unit) for unit in group]


def _store_in_chunks(prepared: PreparedBatch, source: str, logs: list[LogRecord], run_store: RunStore) -> IngestResult:
    """Store `prepared` a chunk of spans per transaction; the logs go with the last chunk."""
    chunks = chunks_by_trace(prepared.spans, max(1, ctxlens_config().ingest_chunk_spans))
    result = prepared.result
    for number, spans in enumerate(chunks, 1):
        last = number == len(chunks)
        chunk = PreparedBatch(spans, IngestResult(), prepared.counts)
        stored = run_store(StoreChunk(chunk, source, logs if last else None))
        result.accepted += stored.accepted
        result.duplicates += stored.duplicates
    return result


def _decode_and_store(request: IngestRequest, key: ApiKey, run_store: RunStore) -> Outcome:
    limit = ctxlens_config().max_ingest_bytes
    if len(request.body) > limit:
        return too_large(limit)
    batch = _decode(request, limit)
    if isinstance(batch, Failed):
        return batch
    decision = check_ingest_rate(key, len(batch.logs) if request.logs else len(batch.spans))
    if not decision.allowed:
        return throttled(decision.retry_after)
    if request.source == "rest":
        return run_store(lambda: _store_whole(batch))
    prepared = prepare_spans(batch.spans)
    result = _store_in_chunks(prepared, request.source, batch.logs, run_store)
    return _outcome(batch, result, "log record(s)" if request.logs else "span(s)")


def _outcome(batch: Batch, result: IngestResult, noun: str) -> Accepted | Rejected:
    rejected = len(batch.errors) + result.rejected
    if not rejected:
        return Accepted(batch, result)
    details = [batch.error_message, result.error_message.partition(": ")[2]]
    return Rejected(batch, result, rejected, f"{rejected} {noun} rejected: " + "; ".join(d for d in details if d))


class _RollBack(Exception):
    def __init__(self, result: IngestResult) -> None:
        super().__init__(result.error_message)
        self.result = result


def _store_whole(batch: Batch) -> Accepted | Rejected:
    """REST: a request is stored whole or not at all (a turn's start and end are made one by the
    store, in either order: pipeline.ingest.write.open_spans)."""
    # Prepared (and tool observations counted) before the transaction takes SQLite's write lock.
    prepared = prepare_spans(batch.spans)
    try:
        with transaction.atomic():
            result = store_prepared(prepared, source="rest")
            if result.rejected:
                raise _RollBack(result)
    except _RollBack as refused:
        refused.result.accepted = 0
        return _outcome(batch, refused.result, "span(s)")
    return Accepted(batch, result)


def _guarded(work: Callable[[], T]) -> T | Failed:
    """Transient storage problems are a retryable UNAVAILABLE; anything else a plain INTERNAL
    outcome, so no transport ever answers with an HTML error page or a traceback."""
    try:
        return work()
    except ArtifactStorageError as error:  # a full artifact disk: nothing was stored
        logger.error("ingest answered UNAVAILABLE: %s", error)
        return Failed(Kind.UNAVAILABLE, str(error), RETRY_STORAGE_SECONDS)
    # Retry-After only for a lock (SQLite's one writer: a moment). A lost or refused connection
    # gets none, so the exporters back off exponentially (1, 2, 4, 8 … s) and ride out a
    # PostgreSQL restart; a fixed 1 s would spend their six tries in six seconds.
    except (OperationalError, InterfaceError) as error:  # locked, or the connection was lost
        logger.warning("ingest answered UNAVAILABLE: %s", error)
        locked = "locked" in str(error)
        return Failed(Kind.UNAVAILABLE, "the database is busy; retry later", RETRY_BUSY_SECONDS if locked else 0)
    except DatabaseError:
        logger.exception("ingest failed")
        return Failed(Kind.UNAVAILABLE, "the database could not store the batch; retry later")
    except Exception:  # the last resort: logged in full for the operator, said in one line to the client
        logger.exception("ingest failed with an unexpected error")
        return Failed(Kind.INTERNAL, "the server failed to store this request (nothing was stored); "
                      "its operator can find the error in the server log")


# ---- decoding -------------------------------------------------------------------------------

OTLP_DECODERS: dict[tuple[bool, str], Callable[[bytes], otlp.Decoded]] = {
    (False, otlp.PROTOBUF): otlp.decode_traces_protobuf, (False, otlp.JSON): otlp.decode_traces_json,
    (True, otlp.PROTOBUF): otlp.decode_logs_protobuf, (True, otlp.JSON): otlp.decode_logs_json,
}


def _decode(request: IngestRequest, limit: int) -> Batch | Failed:
    return _decode_rest(request) if request.source == "rest" else _decode_otlp(request, limit)


def _decode_otlp(request: IngestRequest, limit: int) -> Batch | Failed:
    decoder = OTLP_DECODERS.get((request.logs, request.content_type))
    if decoder is None:
        return Failed(Kind.UNSUPPORTED, "Content-Type must be application/x-protobuf or application/json")
    try:
        raw = decompress(request.body, request.content_encoding, limit)
        decoded = decoder(raw)
    except BodyTooLarge as error:
        return Failed(Kind.TOO_LARGE, str(error))
    except UnsupportedEncoding as error:
        return Failed(Kind.UNSUPPORTED, str(error))
    except (CorruptBody, otlp.OtlpDecodeError) as error:
        return Failed(Kind.INVALID_ARGUMENT, str(error))
    return Batch(decoded.spans, decoded.logs, decoded.errors, decoded.error_message)


REST_MAX_DEPTH = 64  # the events, their messages and tool arguments fit in far less


def _nesting(value: Any) -> int:
    """How many arrays and objects deep `value` goes (iteratively: no recursion to exhaust)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            depth += 1
            deepest = max(deepest, depth)
            if depth <= REST_MAX_DEPTH:
                stack.extend((child, depth) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _decode_rest(request: IngestRequest) -> Batch | Failed:
    """REST JSON events → span records; the messages are DRF's own, as its JSON parser gave them."""
    from pipeline.ingest.decode.rest import events_to_records
    from pipeline.ingest.decode.rest_schema import IngestRequestSerializer

    encoding = (request.content_encoding or "identity").strip().lower()
    if encoding != "identity":
        return Failed(Kind.UNSUPPORTED, f"Content-Encoding {encoding!r} is not supported here; send plain JSON.")
    media_type = request.content_type.split(";")[0].strip().lower()
    if not media_type:
        data: Any = {}  # as DRF does: no content type, no data
    elif media_type != "application/json":
        return Failed(Kind.UNSUPPORTED, f'Unsupported media type "{request.content_type}" in request.')
    else:
        try:
            data = strict_json.loads(request.body.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            return Failed(Kind.INVALID_ARGUMENT, f"JSON parse error - {error}")
        except RecursionError:  # an array inside an array ... thousands of levels deep
            return Failed(Kind.INVALID_ARGUMENT, "JSON parse error - the body is nested too deeply to read")
        if _nesting(data) > REST_MAX_DEPTH:
            return Failed(Kind.INVALID_ARGUMENT,
                          f"the body nests arrays and objects more than {REST_MAX_DEPTH} levels deep")
    serializer = IngestRequestSerializer(data=data)
    if not serializer.is_valid():
        return Failed(Kind.INVALID_ARGUMENT, "the events are not valid", detail=serializer.errors)
    events = serializer.validated_data["events"]
    meta = {"schema_version": serializer.validated_data["schema_version"], "events": len(events),
            "conversation_ids": {event["conversation_id"] for event in events}}
    return Batch(spans=events_to_records(events), meta=meta)
