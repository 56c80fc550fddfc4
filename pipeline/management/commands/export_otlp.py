"""Re-export stored traces to any OTLP endpoint, with their original ids and attributes.

    manage.py export_otlp --endpoint http://collector:4318 [--since 7d] [--conversation ID]
        [--header Authorization="Bearer …"] [--protocol http/protobuf|http/json|grpc] [--batch 500]
        [--no-logs | --logs-endpoint URL]

The spans go first (/v1/traces, TraceService), then the OTLP log records stored with their
traces — GenAI message events, where some instrumentations put an LLM call's messages —
(/v1/logs beside the traces URL or --logs-endpoint, LogsService; none with --no-logs).
Resumable: a checkpoint under the data dir, keyed by endpoint and filters, records the last
span and the last log record delivered; running the same command again continues from there
(and later picks up only new ones, and, with a filter, the earlier log records of a trace whose
spans came later). `--restart` starts over.
"""

from __future__ import annotations

import sys
import time

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from pipeline.export.encode import logs_to_request, spans_to_request
from pipeline.export.job import (
    Checkpoint,
    after,
    batches,
    find_conversation,
    log_batches,
    logs_of_joined_traces,
    parse_since,
    redact_url,
    select_logs,
    select_spans,
)
from pipeline.models import SpanLog
from pipeline.runtime.telemetry.otlp_client import PROTOCOLS, OtlpClient
from pipeline.runtime.telemetry.otlp_outcome import ExportError
from pipeline.runtime.telemetry.config import parse_header_options


class Command(BaseCommand):
    help = "Export stored spans and their log records to an OTLP endpoint (HTTP protobuf, JSON or gRPC), resumably."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--endpoint", required=True, help="e.g. http://collector:4318 or http://host:4317 for grpc")
        parser.add_argument("--since", help="only spans that started since: 1h, 7d, 30m, 2w or an ISO date/datetime")
        parser.add_argument("--conversation", help="only this conversation (external id or numeric id)")
        parser.add_argument("--header", action="append", default=[], metavar="KEY=VALUE",
                            help="extra request header / gRPC metadata, value percent-decoded "
                                 "(Bearer%%20ctx_…); repeat for several")
        parser.add_argument("--protocol", choices=PROTOCOLS, default="http/protobuf")
        parser.add_argument("--batch", type=int, default=500, help="spans or log records per request (default 500)")
        parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
        parser.add_argument("--retries", type=int, default=8, help="retries per request on transient errors")
        parser.add_argument("--no-compression", action="store_true", help="send uncompressed bodies")
        parser.add_argument("--restart", action="store_true", help="ignore the checkpoint and start over")
        parser.add_argument("--no-logs", action="store_true",
                            help="spans only: no log records (for an endpoint that takes no logs)")
        parser.add_argument("--logs-endpoint", default="",
                            help="http: where log records go, when not beside the endpoint (…/v1/traces → …/v1/logs)")
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")

    def handle(self, *args: object, **options: object) -> None:
        endpoint = str(options["endpoint"])
        batch_size = int(options["batch"])
        if batch_size < 1 or batch_size > 10_000:
            raise CommandError("--batch must be between 1 and 10000")
        since = None
        filters: dict[str, str] = {}
        if options["since"]:
            try:
                since = parse_since(str(options["since"]))
            except ValueError as error:
                raise CommandError(str(error)) from None
            filters["since"] = str(options["since"])
        conversation = None
        if options["conversation"]:
            conversation = find_conversation(str(options["conversation"]))
            if conversation is None:
                raise CommandError(f"no conversation {options['conversation']!r}")
            filters["conversation"] = conversation.external_id
        try:
            headers = parse_header_options(options["header"])  # type: ignore[arg-type]
        except ValueError as exc:
            raise CommandError(f"--header takes KEY=VALUE: {exc}") from None
        with_logs = not options["no_logs"]
        try:
            client = OtlpClient(
                endpoint, protocol=str(options["protocol"]), headers=headers, timeout=float(options["timeout"]),
                max_retries=int(options["retries"]), compression=not options["no_compression"],
                logs_endpoint=str(options["logs_endpoint"]),
            )
            if with_logs and options["protocol"] != "grpc":
                client.logs_url()  # before anything is sent
        except ExportError as error:
            hint = "; or --no-logs to export spans only" if "logs URL" in str(error) else ""
            raise CommandError(f"{error}{' (--logs-endpoint)' if hint else ''}{hint}") from None

        checkpoint = Checkpoint.for_job(endpoint, filters)
        if options["restart"]:
            checkpoint.reset()
        spans = select_spans(since, conversation)
        logs = select_logs(since, conversation) if with_logs else SpanLog.objects.none()
        joined = logs_of_joined_traces(spans, logs, checkpoint) if with_logs and filters else SpanLog.objects.none()
        resumed = checkpoint.position is not None or checkpoint.last_log_id > 0
        remaining = (after(spans, checkpoint.position).count() + logs.filter(pk__gt=checkpoint.last_log_id).count()
                     + joined.count())
        started, requests, rejected = time.monotonic(), 0, 0
        delivered = {"spans": 0, "log records": 0}
        progress = tqdm(total=remaining, unit="record", file=sys.stderr, disable=bool(options["no_progress"]),
                        desc="export")
        phases = [  # the spans first, then the log records of their traces (those that joined first)
            ("spans", batches(spans, checkpoint.position, batch_size), spans_to_request, checkpoint.advance),
            ("log records", log_batches(joined, 0, batch_size), logs_to_request, checkpoint.advance_logs),
            ("log records", log_batches(logs, checkpoint.last_log_id, batch_size), logs_to_request,
             checkpoint.advance_logs),
        ]
        try:
            for noun, pages, encode, advance in phases:
                for batch in pages:
                    try:
                        result = client.send(encode(batch))
                    except ExportError as error:
                        spans_only = " (an endpoint that takes no logs: --no-logs)" if noun == "log records" else ""
                        raise CommandError(
                            f"{error}{spans_only} — {delivered['spans']} spans and {delivered['log records']} log "
                            "records delivered in this run; run the same command again to resume"
                        ) from None
                    rejected += result.rejected
                    if result.rejected:
                        progress.write(f"the endpoint rejected {result.rejected} {noun}: {result.message}")
                    advance(batch[-1], len(batch))
                    delivered[noun] += len(batch)
                    requests += 1
                    progress.update(len(batch))
            if with_logs:
                checkpoint.logs_caught_up()
        finally:
            progress.close()
            client.close()
        seconds = time.monotonic() - started
        self.stdout.write(
            f"exported {delivered['spans']} spans and {delivered['log records']} log records in {requests} requests "
            f"to {redact_url(endpoint)} ({options['protocol']}) in {seconds:.1f} s; {rejected} rejected by the "
            f"endpoint; {'resumed from checkpoint, ' if resumed else ''}{checkpoint.exported} spans and "
            f"{checkpoint.logs_exported} log records exported in total"
        )
