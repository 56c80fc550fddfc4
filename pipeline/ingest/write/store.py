"""store_spans: the one entry point that writes spans — OTLP, REST and the in-process exporter.

    result = store_spans(records, source="otlp", logs=log_records)

One transaction per call: all accepted spans are stored or none. Idempotent on
(trace_id, span_id): a span already stored is counted in `duplicates` and changes nothing
(first write wins), except that an unfinished span (end time 0, e.g. a REST round start)
is replaced by its finished version; a REST turn's start and end are made one, in either order
(pipeline.ingest.write.open_spans). After the commit, `pipeline.signals.ingest_committed`
is sent once with the IngestChanges, and token counts the spans did not carry are computed
in the background (`pipeline.ingest.write.deferred`), as are the touched conversations' finding
counts (`pipeline.insight.finding_counts`).

Invalid spans (ids of the wrong length, no start time, a time more than MAX_AHEAD_NS past the
server's clock) are rejected one by one and reported in `rejected` / `error_message`; the rest
of the batch is stored. A span from the future would sort its conversation first for as long
as the future lasts (a start in 2262: for good). An end before the start is not refused: it is
clamped to the start (pipeline.ingest.write.sanitise).

`store_spans` = `prepare_spans` (validate + normalise: CPU only, no database) followed by
`store_prepared` (the transaction); a caller may keep the first half out of its transaction.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.db import IntegrityError, OperationalError, connection, transaction

from pipeline.ingest.write import deferred
from pipeline.ingest.write import sql
from pipeline.ingest.write.precount import Precount, precount, without_logged_traces
from pipeline.ingest.write import tool_context
from pipeline.ingest.write.tool_levels import mark_pending
from pipeline.ingest.write.counters import add_new_rows, recompute_counters
from pipeline.ingest.write.linking import RoundRows, relink_stored
from pipeline.ingest.write.logs import apply_logs, rebuilt_conversations, save_logs
from pipeline.ingest.write.open_spans import complete_spans
from pipeline.ingest.normalise.span import NormalisedSpan, normalise
from pipeline.ingest.records import LogRecord, SpanRecord
from pipeline.ingest.write.rows import build_rows, delete_span_rows, encode_span_json, insert_rows
from pipeline.ingest.write.sanitise import INT64_MAX, clean_log, clean_record
from pipeline.ingest.write.sql import update_rows
from pipeline.ingest.write.conversations import (
    decide_conversations,
    fill_user_messages,
    resolve_conversations,
    resolve_rounds,
)
from pipeline.insight.finding_counts import mark_stale
from pipeline.rollups import track as rollups
from pipeline.models import Conversation, Round, Span, SpanLog
from pipeline.signals import IngestChanges, empty_changes, ingest_committed

logger = logging.getLogger(__name__)

TRACE_ID_RE = re.compile(r"\A[0-9a-f]{32}\Z")
SPAN_ID_RE = re.compile(r"\A[0-9a-f]{16}\Z")
MAX_ERRORS_REPORTED = 5
MAX_AHEAD_NS = 24 * 3600 * 10**9  # clock skew allowed to an exporter: a day
# PostgreSQL writers racing on the same new span, or deadlocked: the loser retries.
ATTEMPTS = 5


@dataclass
class IngestResult:
    accepted: int = 0  # spans stored by this call
    rejected: int = 0  # spans refused as invalid
    duplicates: int = 0  # spans already stored (or repeated in the batch): nothing changed
    error_message: str = ""  # why spans were rejected, for OTLP partial_success
    changes: IngestChanges = field(default_factory=empty_changes)


def validation_error(record: SpanRecord) -> str:
    if not TRACE_ID_RE.match(record.trace_id) or record.trace_id == "0" * 32:
        return f"span {record.span_id!r}: trace_id must be 16 bytes (32 hex characters), not all zero"
    if not SPAN_ID_RE.match(record.span_id) or record.span_id == "0" * 16:
        return f"span in trace {record.trace_id}: span_id must be 8 bytes (16 hex characters), not all zero"
    if record.parent_span_id and not SPAN_ID_RE.match(record.parent_span_id):
        return f"span {record.span_id}: parent_span_id must be 8 bytes (16 hex characters)"
    if record.start_time_unix_nano == 0:
        return f"span {record.span_id}: start time is missing"
    if record.start_time_unix_nano < 0:  # a REST time is a date, and 1969 is one
        return f"span {record.span_id}: time is before 1970 (the Unix epoch)"
    if max(record.start_time_unix_nano, record.end_time_unix_nano) > INT64_MAX:  # found by fuzzing
        return f"span {record.span_id}: time is past the year 2262 (more than 2**63 - 1 nanoseconds)"
    if max(record.start_time_unix_nano, record.end_time_unix_nano) > time.time_ns() + MAX_AHEAD_NS:
        return f"span {record.span_id}: time is more than a day ahead of the server's clock"
    return ""


@dataclass
class PreparedBatch:
    """Spans validated and normalised, ready for `store_prepared` (no database work done yet)."""

    spans: list[NormalisedSpan]
    result: IngestResult
    # tool observations counted up front (pipeline.ingest.write.precount), by (trace_id, span_id)
    counts: dict[tuple[str, str], Precount] = field(default_factory=dict)


def prepare_spans(records: Sequence[SpanRecord]) -> PreparedBatch:
    """Validate and normalise: the CPU half of storing, which needs no database and no lock."""
    result = IngestResult()
    errors: list[str] = []
    spans: list[NormalisedSpan] = []
    seen: set[tuple[str, str]] = set()
    resources: dict[int, tuple[dict, dict]] = {}
    for record in records:
        record = clean_record(record, resources)  # NUL, NaN, 2**70: storable, instead of failing the batch
        problem = validation_error(record)
        if problem:
            errors.append(problem)
            continue
        key = (record.trace_id, record.span_id)
        if key in seen:
            result.duplicates += 1
            continue
        seen.add(key)
        try:
            spans.append(normalise(record))
        except Exception:  # a span we cannot read must not cost the rest of the batch
            logger.exception("could not normalise span %s/%s", record.trace_id, record.span_id)
            errors.append(f"span {record.span_id}: could not be normalised")
    result.rejected = len(errors)
    if errors:
        more = f" (and {len(errors) - MAX_ERRORS_REPORTED} more)" if len(errors) > MAX_ERRORS_REPORTED else ""
        result.error_message = f"{len(errors)} span(s) rejected: " + "; ".join(errors[:MAX_ERRORS_REPORTED]) + more
    encode_span_json(spans)
    return PreparedBatch(spans, result, precount(spans))


def store_prepared(batch: PreparedBatch, *, source: str = "otlp", logs: Sequence[LogRecord] | None = None) -> IngestResult:
    """The database half: one transaction for the whole batch."""
    if not batch.spans and not logs:
        return batch.result
    changes, fresh = _in_transaction(batch.spans, source, [clean_log(log) for log in logs or ()], batch.counts)
    _account(batch, fresh, changes)
    return batch.result


def store_prepared_together(batches: Sequence[PreparedBatch], *, source: str = "otlp") -> list[IngestResult]:
    """Several requests' batches in one transaction (the writer's group commit): all are stored or
    none, and each gets the counts it would have had alone (`changes` are the transaction's). No
    span may be in two of them (a re-send racing its original is stored on its own, after it),
    and none carries logs. Tried once: a failure is for the caller to retry request by request."""
    spans = [s for batch in batches for s in batch.spans]
    counts = {key: count for batch in batches for key, count in batch.counts.items()}
    changes, fresh = _in_transaction(spans, source, [], counts, attempts=1)
    for batch in batches:
        _account(batch, fresh, changes)
    return [batch.result for batch in batches]


def span_keys(batch: PreparedBatch) -> set[tuple[str, str]]:
    return {(s.record.trace_id, s.record.span_id) for s in batch.spans}


def _in_transaction(
    spans: list[NormalisedSpan], source: str, logs: list[LogRecord], counts: dict[tuple[str, str], Precount],
    attempts: int = ATTEMPTS,
) -> tuple[IngestChanges, set[tuple[str, str]]]:
    for attempt in range(attempts):
        try:
            # the rollups' changes, written once at the end; one cursor for the statements of pipeline.ingest.write.sql
            with transaction.atomic(), sql.shared_cursor(), rollups.batched():
                changes, fresh, pending = _store(spans, source, logs, counts)
                transaction.on_commit(lambda: _committed(changes, pending))
            return changes, fresh
        except IntegrityError:  # a concurrent writer stored one of these spans first: look again
            if attempt == attempts - 1:
                raise
        except OperationalError as error:
            if attempt == attempts - 1 or not sql.is_deadlock(error):
                raise
            time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
    raise AssertionError("unreachable: the last attempt returns or raises")


def _account(batch: PreparedBatch, fresh: set[tuple[str, str]], changes: IngestChanges) -> None:
    """`batch.result` once its spans are stored: those not in `fresh` were stored already."""
    accepted = sum((s.record.trace_id, s.record.span_id) in fresh for s in batch.spans)
    batch.result.accepted = accepted
    batch.result.duplicates += len(batch.spans) - accepted
    batch.result.changes = changes


def store_spans(
    records: Sequence[SpanRecord], *, source: str = "otlp", logs: Sequence[LogRecord] | None = None
) -> IngestResult:
    return store_prepared(prepare_spans(records), source=source, logs=logs)


def _store(
    spans: list[NormalisedSpan], source: str, logs: list[LogRecord], counts: dict[tuple[str, str], Precount]
) -> tuple[IngestChanges, set[tuple[str, str]], bool]:
    """Store the batch; (changes, the keys of the spans stored, whether token work was left pending)."""
    changes = empty_changes()
    pending = bool(logs)
    # Requests that carry parts of one trace take turns from here on (PostgreSQL; SQLite has one writer).
    traces = {s.record.trace_id for s in spans} | {log.trace_id for log in logs if log.trace_id}
    sql.lock_traces(traces)
    # Traces with GenAI event logs, stored or in this request: their calls' messages are rebuilt
    # from the logs (apply_logs, below), and tools counted up front there wait for the deferred run.
    needs_logs = counts or logs or any(s.llm is not None for s in spans)
    logged = _logged_traces(traces, logs) if needs_logs else set()
    counts = without_logged_traces(counts, logged)
    stored = _stored_spans(spans)
    # a REST turn's start and end, whichever came second merged with the stored one
    spans, completed = complete_spans(spans, stored) if source == "rest" else (spans, set())
    finishing = {k for k, end in stored.items() if end == 0} | completed
    if completed:  # a merged tool's result may not be the one counted up front: the deferred run counts it
        counts = {k: c for k, c in counts.items() if k not in completed}
    fresh = [
        s for s in spans
        if (k := (s.record.trace_id, s.record.span_id)) not in stored
        or (k in finishing and s.record.end_time_unix_nano > 0)
    ]
    replaced = [s for s in fresh if (s.record.trace_id, s.record.span_id) in stored]
    # Traces with event logs whose stored calls are rebuilt from them (apply_logs, below).
    relogged: set[str] = set()
    if logs or any(s.llm is not None for s in fresh):
        relogged = ({s.record.trace_id for s in fresh} | {log.trace_id for log in logs if log.trace_id}) & logged
    # Every conversation the batch writes, locked in one pass before any other row is touched:
    # those of the replaced spans' rows, deleted next, among them (a trace's spans share one), and
    # those of the calls apply_logs rebuilds.
    also = rebuilt_conversations(relogged) if relogged and connection.features.has_select_for_update else set()
    if fresh:
        decided = decide_conversations(fresh, also)
    else:
        sql.lock_rows(Conversation, also)
    resum: set[tuple[str, str]] = set()  # (trace, tool_call_id) whose context cost the replaced rows counted in
    if replaced:
        keys = [(s.record.trace_id, s.record.span_id) for s in replaced]
        resum = tool_context.forget_replaced(keys, [key for key, s in zip(keys, replaced) if s.llm is None])
        delete_span_rows(keys)

    round_ids: set[int] = set()
    conversation_ids: set[int] = set()
    recount: set[int] = set()  # rounds whose stored rows changed: aggregated again, not added to
    folded: set[int] = set()  # rounds that took a placeholder's rows
    logged_rounds: set[int] = set()  # rounds whose calls' messages were rebuilt from event logs
    if fresh:
        conversations, created, merged, folded = resolve_conversations(fresh, decided)
        rounds, new_rounds = resolve_rounds(fresh, conversations)
        round_ids = {r.id for r in rounds.values()}
        stored_rounds = round_ids - new_rounds
        rows = build_rows(fresh, conversations, rounds, source)
        # Rounds whose stored rows moved (merged in) or went (a replaced open span) are read whole
        # and aggregated again; of the others, only what the new rows can change is read.
        recount |= round_ids if replaced else {r.id for r in rounds.values() if r.conversation_id in merged}
        links = RoundRows.around(stored_rounds, rows["llm"], rows["tool"], rows["compression"], whole=recount)
        insert_rows(fresh, rows, links, stored_rounds, counts)
        stated = {rounds[(conversations[s.record.trace_id].id, s.round_key)].id
                  for s in fresh if s.in_round and s.final_answer}
        update_rows(Round, links.fill_final_answers(rounds.values(), stated), ["final_answer"])
        unread = folded - round_ids  # the batch's rounds were read whole and relinked above
        if unread:  # rounds that took a placeholder's rows but have no span in the batch
            pending = relink_stored(unread, Round.objects.filter(id__in=unread).only("id", "final_answer")) or pending
            tool_context.update_for_rounds(unread)
            round_ids |= unread
            recount |= unread
        tool_context.update_tool_context(
            rows["llm"], tool_context.tool_keys([*rows["tool"], *links.changed_tools.values()]),
            forced={(conversations[trace_id].id, answer) for trace_id, answer in resum},
        )
        pending = mark_pending(rows["tool"]) or pending or any(
            row.tokens_pending for row in (*rows["llm"], *rows["tool"])
        ) or any(tool.tokens_pending or tool.levels_pending for tool in links.changed_tools.values())
        conversation_ids = {c.id for c in conversations.values()}
        changes["new_conversation_ids"] = sorted(created)
        changes["llm_call_ids"] = [c.id for c in rows["llm"]]
        changes["tool_call_ids"] = [t.id for t in rows["tool"]]
        changes["compression_ids"] = [c.id for c in rows["compression"]]
        changes["input_tokens"] = sum(c.input_tokens for c in rows["llm"])
        changes["output_tokens"] = sum(c.output_tokens for c in rows["llm"])
        changes["span_count"] = len(fresh)
    if logs:
        save_logs(logs)
    if relogged:
        logged_rounds, logged_conversations = apply_logs(relogged)
        if logged_rounds:
            to_relink = Round.objects.filter(id__in=logged_rounds).only("id", "final_answer")
            pending = relink_stored(logged_rounds, to_relink) or pending
            tool_context.update_for_rounds(logged_rounds)
        round_ids |= logged_rounds
        recount |= logged_rounds
        conversation_ids |= logged_conversations
    # rounds that may now hold a call with the user's message no span of theirs stated
    fill_user_messages(folded | logged_rounds)
    if fresh:
        add_new_rows([c.id for c in rows["llm"] if c.round_id not in recount],
                     [t.id for t in rows["tool"] if t.round_id not in recount])
    recompute_counters(recount, conversation_ids)
    mark_stale(conversation_ids)  # their finding counts are refreshed after the commit
    changes["round_ids"] = sorted(round_ids)
    changes["conversation_ids"] = sorted(conversation_ids)
    return changes, {(s.record.trace_id, s.record.span_id) for s in fresh}, pending


def _logged_traces(traces: set[str], logs: list[LogRecord]) -> set[str]:
    """Those of `traces` with event logs, in this request or stored."""
    logged = {log.trace_id for log in logs} & traces
    rest = sorted(traces - logged)
    for chunk in sql.chunked(rest):
        logged.update(t for (t,) in sql.fetch(
            f"SELECT DISTINCT trace_id FROM {sql.table(SpanLog)} WHERE trace_id IN ({sql.marks(chunk)})", chunk))
    return logged


def _stored_spans(spans: list[NormalisedSpan]) -> dict[tuple[str, str], int]:
    """{(trace_id, span_id): end_time_unix_nano} of the batch's spans that are already stored."""
    wanted = {(s.record.trace_id, s.record.span_id) for s in spans}
    return {(t, s): end for t, s, end in sql.by_spans(Span, ["end_time_unix_nano"], wanted)}


def _committed(changes: IngestChanges, pending: bool) -> None:
    # send_robust: a broken receiver must not turn a stored batch into an error.
    for receiver, error in ingest_committed.send_robust(sender=store_spans, changes=changes):
        if isinstance(error, Exception):
            logger.error("ingest_committed receiver %r failed: %r", receiver, error)
    if pending:
        deferred.schedule()
