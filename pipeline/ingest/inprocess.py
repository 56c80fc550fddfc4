"""The in-process way in: a SpanExporter that stores an agent's spans in this server's database.

For agents the server runs itself (`manage.py demo_agent`, benchmarks, tests); an agent in its
own process exports over OTLP to the receivers instead. Both end in the same store function.
Build a Telemetry with it through `pipeline.adapters.in_process_telemetry()`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.db import connections
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from pipeline.ingest.decode.sdk import span_record
from pipeline.ingest.write.store import store_spans

logger = logging.getLogger(__name__)


class StoreSpanExporter(SpanExporter):
    """SpanRecords straight into ctxlens's store (one transaction per batch).

    `own_thread=True` when a BatchSpanProcessor calls it on its worker thread: that thread's
    database connections are closed after each batch. Under a SimpleSpanProcessor it runs on the
    agent's own thread, whose connection (and open transaction) it must leave alone.
    """

    def __init__(self, *, own_thread: bool = True) -> None:
        self.own_thread = own_thread

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
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
