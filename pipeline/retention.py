"""Retention: delete what is older than CTXLENS_RETENTION_DAYS, a little at a time.

What goes:
- conversations whose last activity is before the cutoff, with every row that belongs to
  them (rounds, LLM and tool calls, compressions, skill activations, spans, artifacts), except
  artifacts that tool calls of other conversations still use: those pass to their latest user;
- spans that belong to no conversation and started before the cutoff;
- artifacts past their expiry time (their files go when the deletion commits);
- OTLP log records (SpanLog) received before the cutoff.
A conversation that is still active keeps all its spans, however old, so its trace stays whole;
one that became active again while being pruned keeps what is left, with its counters and cost
sums recomputed from it: whole traces, as each trace's spans go with the rows made from them.

Every batch is its own short transaction of at most `batch_size` ids (or spans: a trace's rows go
together, a whole trace at least), so ingest and the dashboard never wait behind one long delete
(SQLite has one writer; PostgreSQL row locks).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from django.db import connection, models, transaction
from django.utils import timezone

from pipeline.artifacts.cleanup import delete_artifacts, delete_expired_artifacts
from pipeline.conf import ctxlens_config
from pipeline.ingest.write import sql
from pipeline.ingest.write.counters import recompute_counters
from pipeline.rollups.compact import compact_rollups
from pipeline.rollups import track as rollups
from pipeline.models import (
    Artifact,
    CompressionEvent,
    Conversation,
    LLMCall,
    Round,
    SkillActivation,
    Span,
    SpanLog,
    ToolCall,
    ToolResultCarry,
)

BATCH_SIZE = 1000
MAX_TRACES_PER_BATCH = 1000  # an advisory lock each (PostgreSQL's lock table holds a few thousand)
CONVERSATIONS_PER_STEP = 50


@dataclass
class PruneResult:
    cutoff: dt.datetime
    dry_run: bool = False
    conversations: int = 0
    spans: int = 0
    artifacts: int = 0
    other_rows: int = 0  # rounds, calls, compressions, skill activations, log records
    batches: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    rollups_compacted: int = 0  # minute and hour rollup rows past their age (pipeline.rollups.compact)

    def summary(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        return (
            f"prune: {verb} {self.conversations} conversations, {self.spans} spans, {self.artifacts} artifacts "
            f"and {self.other_rows} other rows older than {self.cutoff:%Y-%m-%d %H:%M} UTC"
            f"{'' if self.dry_run else f' in {self.batches} batches'}"
        )


def delete_in_batches(queryset: models.QuerySet, batch_size: int = BATCH_SIZE) -> tuple[int, int]:
    """Delete the rows of `queryset` by primary key, `batch_size` per transaction.

    Returns (rows of queryset's model deleted, batches). Cascades and delete receivers run as
    usual inside each batch.
    """
    deleted = batches = 0
    while (count := sql.retrying_deadlocks(lambda: _delete_batch(queryset, batch_size))) is not None:
        deleted += count
        batches += 1
    return deleted, batches


def _delete_batch(queryset: models.QuerySet, batch_size: int) -> int | None:
    """Delete up to `batch_size` rows of `queryset` in one transaction: how many went (0 when all
    came back to life or went meanwhile: still a batch), None when none was left. Locks are taken
    in ingest's order (the rows' conversations, the rows, the rollup rows last), as the admin's
    edits and deletes take them too; SQLite's one writer already holds its lock."""
    model = queryset.model
    with transaction.atomic(), rollups.batched():
        ids = list(queryset.order_by("pk").values_list("pk", flat=True)[:batch_size])
        if not ids:
            return None
        if connection.features.has_select_for_update:
            if any(field.name == "conversation" for field in model._meta.concrete_fields):
                sql.lock_rows(Conversation, set(model.objects.filter(pk__in=ids).exclude(conversation=None)
                                                .values_list("conversation_id", flat=True)))
            # again, now locked: a conversation may have come back to life, a row have gone meanwhile
            ids = list(queryset.filter(pk__in=ids).select_for_update(of=("self",)).order_by("pk")
                       .values_list("pk", flat=True))
        # The calls leave their rollups, those a round's delete cascades to included: one ingested
        # late, with a span that started long ago, after this conversation's calls went.
        _, per_model = rollups.collect_deletion(rollups.rows_to_delete(model.objects.filter(pk__in=ids))).delete()
    return per_model.get(model._meta.label, 0)


def delete_conversations(ids: list[int], **still: object) -> dict[str, int]:
    """Delete the conversations `ids` that still match `still` (lookups), with every row that is
    theirs, in one transaction; Django's counts by model. Locks are taken in ingest's order: the
    conversations (in id order, read again under the lock), then their rows, the rollup rows
    last (their pre_delete hook takes their calls out, written at the end)."""
    with transaction.atomic(), rollups.batched():
        locked = list(Conversation.objects.select_for_update().filter(pk__in=ids, **still)
                      .order_by("pk").values_list("pk", flat=True))
        return Conversation.objects.filter(pk__in=locked).delete()[1]


# The rows made from a trace's spans, with the spans: deleted together, a trace at a time.
_TRACE_ROWS: list[type[models.Model]] = [ToolResultCarry, ToolCall, CompressionEvent, SkillActivation, LLMCall, Span]


def delete_traces(conversation_ids: list[int], cutoff: dt.datetime, batch_size: int = BATCH_SIZE
                  ) -> tuple[dict[type[models.Model], int], int]:
    """Delete the traces of the conversations `conversation_ids` that are still older than
    `cutoff`: each trace's spans with every row made from them, in one transaction, about
    `batch_size` spans per transaction (a whole trace at least; at most MAX_TRACES_PER_BATCH
    traces, a lock each on PostgreSQL). A conversation that comes back to life meanwhile keeps
    whole traces, never spans whose calls are gone (ingest keeps the first write of a span, so a
    re-send could not make those again). Traces that arrive meanwhile are read in the next pass.
    Rows deleted by model, batches."""
    old = Span.objects.filter(conversation_id__in=conversation_ids, conversation__last_activity_at__lt=cutoff)
    deleted: dict[type[models.Model], int] = dict.fromkeys(_TRACE_ROWS, 0)
    batches = 0
    while sizes := list(old.values_list("trace_id").annotate(spans=models.Count("pk")).order_by("trace_id")):
        traces: list[str] = []
        spans = 0
        for trace_id, count in [*sizes, (None, 0)]:
            if traces and (trace_id is None or spans + count > batch_size or len(traces) == MAX_TRACES_PER_BATCH):
                for model, n in sql.retrying_deadlocks(lambda: _delete_trace_batch(traces, conversation_ids, cutoff)).items():
                    deleted[model] += n
                batches, traces, spans = batches + 1, [], 0
            if trace_id is not None:
                traces.append(trace_id)
                spans += count
    return deleted, batches


def _delete_trace_batch(traces: list[str], conversation_ids: list[int], cutoff: dt.datetime
                        ) -> dict[type[models.Model], int]:
    """One transaction of `delete_traces`. Locks in ingest's order: the traces, then the
    conversations still old (in id order, as delete_conversations; PostgreSQL checks the age again
    once it has the lock), the rows, the rollup rows last."""
    with transaction.atomic(), rollups.batched():
        sql.lock_traces(traces)
        still = list(Conversation.objects.select_for_update().filter(pk__in=conversation_ids, last_activity_at__lt=cutoff)
                     .order_by("pk").values_list("pk", flat=True))
        deleted = {}
        for model in _TRACE_ROWS:
            rows = model.objects.filter(trace_id__in=traces, conversation_id__in=still)
            _, per_model = rollups.collect_deletion(rollups.rows_to_delete(rows)).delete()
            deleted[model] = per_model.get(model._meta.label, 0)
        return deleted


# Children before parents, so each conversation's final delete finds nothing left to cascade
# (the rows of traces went with them: these take rows no stored span of the conversation made,
# and a trace that arrives after delete_traces' last pass).
_CONVERSATION_CHILDREN: list[tuple[type[models.Model], str]] = [
    (ToolResultCarry, "tool_result_carries"),
    (ToolCall, "tool_calls"),
    (CompressionEvent, "compressions"),
    (SkillActivation, "skill_activations"),
    (LLMCall, "llm_calls"),
    (Round, "rounds"),
    (Span, "spans"),
    (Artifact, "artifacts"),
]


def prune(
    days: int | None = None,
    *,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
    now: dt.datetime | None = None,
) -> PruneResult:
    days = ctxlens_config().retention_days if days is None else days
    now = now or timezone.now()
    result = PruneResult(cutoff=now - dt.timedelta(days=days), dry_run=dry_run)
    old_conversations = Conversation.objects.filter(last_activity_at__lt=result.cutoff)
    orphan_spans = Span.objects.filter(conversation__isnull=True, start_time__lt=result.cutoff)
    old_logs = SpanLog.objects.filter(received_at__lt=result.cutoff)

    if dry_run:
        ids = old_conversations.values("pk")
        result.conversations = old_conversations.count()
        result.spans = Span.objects.filter(conversation__in=ids).count() + orphan_spans.count()
        result.artifacts = Artifact.objects.filter(
            models.Q(conversation__in=ids) | models.Q(expires_at__lte=now)
        ).unused(besides=ToolCall.objects.filter(conversation__in=ids)).count()
        result.other_rows = sum(
            model.objects.filter(conversation__in=ids).count()
            for model, _ in _CONVERSATION_CHILDREN
            if model not in (Span, Artifact)
        ) + old_logs.count()
        return result

    while True:
        conversation_ids = list(
            old_conversations.order_by("pk").values_list("pk", flat=True)[:CONVERSATIONS_PER_STEP]
        )
        if not conversation_ids:
            break
        by_model, batches = delete_traces(conversation_ids, result.cutoff, batch_size)
        for model, deleted in by_model.items():
            _count(result, model, deleted)
        result.batches += batches
        for model, _ in _CONVERSATION_CHILDREN:
            # The join re-checks the age in every batch: a conversation that comes back to life
            # while it is being pruned keeps the rest of its rows.
            rows = model.objects.filter(
                conversation_id__in=conversation_ids, conversation__last_activity_at__lt=result.cutoff
            )
            if model is Artifact:
                pks = list(rows.order_by("pk").values_list("pk", flat=True))
                deleted, _, batches = delete_artifacts(pks, batch_size=batch_size,
                                                       conversation__last_activity_at__lt=result.cutoff)
                batches += _hand_over_used_artifacts(conversation_ids, result.cutoff)
            else:
                deleted, batches = delete_in_batches(rows, batch_size)
            _count(result, model, deleted)
            result.batches += batches
        # Re-checked under the lock: a span ingested meanwhile makes the conversation current
        # again, and one being ingested now is waited for.
        per_model = sql.retrying_deadlocks(lambda: delete_conversations(
            conversation_ids, last_activity_at__lt=result.cutoff))
        result.batches += 1 + _recount_survivors(conversation_ids)
        result.conversations += per_model.get(Conversation._meta.label, 0)
        for label, count in per_model.items():
            if label != Conversation._meta.label:
                result.counts[label] = result.counts.get(label, 0) + count

    deleted, batches = delete_in_batches(orphan_spans, batch_size)
    result.spans += deleted
    result.batches += batches
    expired = delete_expired_artifacts(now, batch_size=batch_size)  # the same TTL step as cleanup_artifacts
    result.artifacts += expired.count
    result.batches += expired.batches
    deleted, batches = delete_in_batches(old_logs, batch_size)
    result.other_rows += deleted
    result.batches += batches
    result.rollups_compacted = compact_rollups(now)
    return result


def _recount_survivors(conversation_ids: list[int]) -> int:
    """Recompute the counters and cost sums of the conversations of a step that came back to life
    while it ran: rows of theirs already deleted (a batch chosen before the ingest that made them
    current) are no longer in the sums an ingest computed meanwhile. Returns the batches (0 or 1)."""
    survivors = set(Conversation.objects.filter(pk__in=conversation_ids).values_list("pk", flat=True))
    if not survivors:
        return 0
    with transaction.atomic():
        sql.lock_rows(Conversation, survivors)  # as an ingest transaction does, so the two queue
        rounds = set(Round.objects.filter(conversation_id__in=survivors).values_list("pk", flat=True))
        recompute_counters(rounds, survivors)
    return 1


def _hand_over_used_artifacts(conversation_ids: list[int], cutoff: dt.datetime) -> int:
    """Give the artifacts of the pruned conversations that tool calls still use (content-addressed,
    so a later conversation may link the one an older one stored) to the latest of their users,
    so they go when their users go instead of staying without an owner. Returns the batches."""
    latest_user = ToolCall.objects.filter(artifact_id=models.OuterRef("pk")).order_by("-started_at", "-pk")
    kept = Artifact.objects.filter(conversation_id__in=conversation_ids, conversation__last_activity_at__lt=cutoff)
    if not kept.exists():
        return 0
    with transaction.atomic():
        kept.update(conversation_id=models.Subquery(latest_user.values("conversation_id")[:1]))
    return 1


def _count(result: PruneResult, model: type[models.Model], deleted: int) -> None:
    if model is Span:
        result.spans += deleted
    elif model is Artifact:
        result.artifacts += deleted
    else:
        result.other_rows += deleted
    result.counts[model._meta.label] = result.counts.get(model._meta.label, 0) + deleted
