"""Which stored spans and log records a re-export sends, in what order, and where it resumes.

Spans go out ordered by (received_at, id) in keyset-paginated batches, then the log records
(SpanLog: GenAI message events) of the same traces, ordered by id; after each batch the
endpoint accepted, the position is written to a checkpoint file under the data dir, keyed by
endpoint and filters, so an interrupted export (or a later run, for new spans and logs)
continues after the last span and the last log record delivered.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import urllib.parse
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from django.conf import settings
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from pipeline.models import Conversation, Span, SpanLog

_RELATIVE = re.compile(r"\A(\d+)\s*([smhdw])\Z")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(value: str, now: dt.datetime | None = None) -> dt.datetime:
    """`7d`, `1h`, `30m`, `2w`, an ISO date or an ISO datetime (UTC when no offset) → aware datetime."""
    value = value.strip()
    now = now or timezone.now()
    if match := _RELATIVE.match(value.lower()):
        return now - dt.timedelta(seconds=int(match[1]) * _UNIT_SECONDS[match[2]])
    try:
        when = parse_datetime(value)
        if when is None and (day := parse_date(value)) is not None:
            when = dt.datetime.combine(day, dt.time.min)
    except ValueError:
        when = None
    if when is None:
        raise ValueError(f"--since takes 1h, 7d, 30m, 2w or an ISO date/datetime, got {value!r}")
    return when if timezone.is_aware(when) else when.replace(tzinfo=dt.timezone.utc)


def find_conversation(ref: str) -> Conversation | None:
    """A conversation by its external id, else by its numeric id."""
    found = Conversation.objects.filter(external_id=ref).first()
    if found is None and ref.isdigit():
        found = Conversation.objects.filter(pk=int(ref)).first()
    return found


def select_spans(since: dt.datetime | None = None, conversation: Conversation | None = None) -> QuerySet[Span]:
    spans = Span.objects.all()
    if since is not None:
        spans = spans.filter(start_time__gte=since)
    if conversation is not None:
        # Also the spans of the conversation's traces that the normaliser left unattached.
        traces = Span.objects.filter(conversation=conversation).values("trace_id")
        spans = spans.filter(Q(conversation=conversation) | Q(trace_id__in=traces))
    return spans


def select_logs(since: dt.datetime | None = None, conversation: Conversation | None = None) -> QuerySet[SpanLog]:
    """The log records of the traces `select_spans` picks; with no filter, every one."""
    if since is None and conversation is None:
        return SpanLog.objects.all()
    return SpanLog.objects.filter(trace_id__in=select_spans(since, conversation).values("trace_id"))


def logs_of_joined_traces(spans: QuerySet[Span], logs: QuerySet[SpanLog], checkpoint: Checkpoint) -> QuerySet[SpanLog]:
    """For a filtered export (unfiltered, every log record goes by id), the log records up to the
    last one sent whose trace joined the selection
    since the logs last caught up with the spans (`checkpoint.logs_position`): a log record
    stored before any span of its trace was selected, which the position by id has passed.
    (Ingest takes a trace's logs before its spans as readily as after.)"""
    if not checkpoint.last_log_id:
        return SpanLog.objects.none()
    position, of_trace = checkpoint.logs_position, spans.filter(trace_id=OuterRef("trace_id"))
    # EXISTS probes by (trace_id, …) per record of the range: no set of every selected trace is built
    return logs.filter(Exists(after(of_trace, position)), ~Exists(up_to(of_trace, position)),
                       pk__lte=checkpoint.last_log_id)


def redact_url(url: str) -> str:
    """The endpoint without user:password, for output and checkpoint files."""
    parts = urllib.parse.urlsplit(url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    return url


@dataclass
class Checkpoint:
    """The last span delivered, (received_at, id), and the last log record's id. Stored as JSON;
    headers are never written. A file from before logs were exported reads as no log sent yet."""

    path: Path
    endpoint: str
    filters: dict[str, str]
    received_at: str = ""
    last_id: int = 0
    exported: int = 0
    last_log_id: int = 0
    logs_exported: int = 0
    # the span position (received_at, id) the log records last caught up with (logs_of_joined_traces)
    logs_received_at: str = ""
    logs_span_id: int = 0

    @classmethod
    def for_job(cls, endpoint: str, filters: dict[str, str], directory: Path | None = None) -> Checkpoint:
        directory = directory or Path(settings.DATA_DIR) / "export-checkpoints"
        key = json.dumps({"endpoint": endpoint, "filters": filters}, sort_keys=True)
        path = directory / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
        checkpoint = cls(path=path, endpoint=redact_url(endpoint), filters=filters)
        if path.exists():
            saved = json.loads(path.read_text())
            checkpoint.received_at = saved.get("received_at", "")
            checkpoint.last_id = int(saved.get("last_id", 0))
            checkpoint.exported = int(saved.get("exported", 0))
            checkpoint.last_log_id = int(saved.get("last_log_id", 0))
            checkpoint.logs_exported = int(saved.get("logs_exported", 0))
            checkpoint.logs_received_at = saved.get("logs_received_at", "")
            checkpoint.logs_span_id = int(saved.get("logs_span_id", 0))
        return checkpoint

    @property
    def position(self) -> tuple[dt.datetime, int] | None:
        return _position(self.received_at, self.last_id)

    def advance(self, span: Span, count: int) -> None:
        self.received_at = span.received_at.isoformat()
        self.last_id = span.pk
        self.exported += count
        self.save()

    @property
    def logs_position(self) -> tuple[dt.datetime, int] | None:
        return _position(self.logs_received_at, self.logs_span_id)

    def advance_logs(self, log: SpanLog, count: int) -> None:
        self.last_log_id = max(self.last_log_id, log.pk)  # a joined trace's earlier ones move it not
        self.logs_exported += count
        self.save()

    def logs_caught_up(self) -> None:
        """Every log record of the traces of the spans delivered so far is delivered too."""
        self.logs_received_at, self.logs_span_id = self.received_at, self.last_id
        self.save()

    def save(self) -> None:
        """Write a temp file and rename it over the old one: a crash leaves the old or the new, never half."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {key: value for key, value in asdict(self).items() if key != "path"}
        data["updated_at"] = timezone.now().isoformat()
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, self.path)

    def reset(self) -> None:
        self.received_at, self.last_id, self.exported = "", 0, 0
        self.last_log_id, self.logs_exported, self.logs_received_at, self.logs_span_id = 0, 0, "", 0
        self.path.unlink(missing_ok=True)


def _position(received_at: str, span_id: int) -> tuple[dt.datetime, int] | None:
    """A span position (received_at, id) as the checkpoint file keeps it; None: before the first."""
    return (dt.datetime.fromisoformat(received_at), span_id) if received_at else None


def after(spans: QuerySet[Span], position: tuple[dt.datetime, int] | None) -> QuerySet[Span]:
    if position is None:
        return spans
    received_at, last_id = position
    return spans.filter(Q(received_at__gt=received_at) | Q(received_at=received_at, pk__gt=last_id))


def up_to(spans: QuerySet[Span], position: tuple[dt.datetime, int] | None) -> QuerySet[Span]:
    """The spans `after` leaves out: those at or before `position`."""
    if position is None:
        return spans.none()
    received_at, last_id = position
    return spans.filter(Q(received_at__lt=received_at) | Q(received_at=received_at, pk__lte=last_id))


def batches(spans: QuerySet[Span], position: tuple[dt.datetime, int] | None, size: int) -> Iterator[list[Span]]:
    """Keyset pagination over (received_at, id): each query is short and an index range scan."""
    while True:
        batch = list(after(spans, position).order_by("received_at", "pk")[:size])
        if not batch:
            return
        yield batch
        position = (batch[-1].received_at, batch[-1].pk)


def log_batches(logs: QuerySet[SpanLog], last_id: int, size: int) -> Iterator[list[SpanLog]]:
    """Keyset pagination over the id (SpanLog rows are only ever inserted, each with a new id)."""
    while True:
        batch = list(logs.filter(pk__gt=last_id).order_by("pk")[:size])
        if not batch:
            return
        yield batch
        last_id = batch[-1].pk
