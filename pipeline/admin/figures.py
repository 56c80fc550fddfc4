"""Admin edits and deletes of rounds, calls, compressions and skill activations that keep the
figures derived from them right: the rollups, the tool context ledger, the counters, the token
counts and costs (pipeline.admin.counts)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from django.db import transaction
from django.db.models import Model, QuerySet
from django.db.models.deletion import Collector
from django.http import HttpRequest, HttpResponse

from pipeline.admin.counts import price_edited_call, recount_for_call, recount_for_tool
from pipeline.admin.pages import CountsWhatCascades, DeletesStartAgainAfterDeadlock
from pipeline.ingest.write import deferred, sql, tool_context
from pipeline.ingest.write.counters import recompute_counters
from pipeline.insight import finding_counts
from pipeline.models import Conversation, LLMCall, Round, ToolCall
from pipeline.rollups import track as rollups
from pipeline.signals import IngestChanges, empty_changes, ingest_committed

logger = logging.getLogger(__name__)


class DeletedMeanwhile(Exception):
    """The row an admin edit saves was deleted after the edit read it (on PostgreSQL, by another
    operator, a `prune` batch or ingest replacing its span, committed meanwhile)."""


class FiguresFollowAdminChanges(CountsWhatCascades, DeletesStartAgainAfterDeadlock):
    """Rounds, calls, compressions and skill activations edited or deleted here keep the derived
    figures right, in the change's transaction: the rollups follow (the ORM hooks for a save,
    `collect_deletion` with what cascades for a delete), so do the tool context ledger and sums,
    and the counters of the rounds and conversations concerned, before and after an edit; after
    it, finding counts refresh and open pages reload, as after an ingest.

    Locks are taken in ingest's order: the conversations (until the rows changed are all in
    conversations already locked: an ingest may fold a placeholder conversation into another
    meanwhile), then the row edited or the rows deleted, then the rollup rows, in one pass at the
    end (`batched`)."""

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> tuple[str, ...]:
        # The span a row was stored from: replacing an open span finds its rows, and the tool
        # context ledger its carries, by these; an edit would orphan both.
        names = {field.name for field in self.model._meta.fields}
        return (*(n for n in ("trace_id", "span_id") if n in names), *super().get_readonly_fields(request, obj))

    # Writers lock conversations, then rows, then rollup rows, but one that locks conversations a
    # second time (the deferred run, after a placeholder was folded meanwhile) may still deadlock
    # with one here: when PostgreSQL ends it by aborting this side, it starts again.
    def changeform_view(self, request: HttpRequest, object_id: str | None = None, form_url: str = "",
                        extra_context: dict | None = None) -> HttpResponse:
        view = super().changeform_view
        try:
            return sql.retrying_deadlocks(lambda: view(request, object_id, form_url, extra_context))
        except DeletedMeanwhile:  # its transaction rolled back: said as Django says it of a row gone before
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)

    def save_model(self, request: HttpRequest, obj: Model, form, change: bool) -> None:
        if change and not form.has_changed():  # nothing to write (the form would round times to seconds)
            return
        if not change:
            super().save_model(request, obj, form, change)
            return
        model = type(obj)
        with transaction.atomic(), rollups.batched():  # the rollup rows in one pass, at the end
            locked = _lock_conversations(lambda: {*model.objects.filter(pk=obj.pk).values_list(
                "conversation_id", flat=True), obj.conversation_id})
            # Locked: another writer's delete of it is waited for, and then it is gone. (Of itself
            # only, in id order: a round's ordering would join and lock its conversation too.)
            before = model.objects.select_for_update(of=("self",)).filter(pk=obj.pk).order_by("pk").first()
            if before is None:  # saved, it would come back without its figures
                raise DeletedMeanwhile
            # What this request's form did not change, as stored now: a call it pointed to when
            # the request read it may be gone. (A change made while the page was open is still
            # overwritten, as Django's admin does.)
            for field in model._meta.concrete_fields:
                if field.name not in form.changed_data:
                    setattr(obj, field.attname, getattr(before, field.attname))
            pending = False  # counts for the deferred run (pipeline.admin.counts)
            if model is LLMCall:
                price_edited_call(obj, form.changed_data)
            elif model is ToolCall:
                pending = recount_for_tool(before, obj, form.changed_data)
            super().save_model(request, obj, form, change)
            if model is LLMCall:  # what it carries follows its input, tokens, model and cost
                tool_context.update_for_calls([obj.pk])
                pending = recount_for_call(before, obj)
            elif model is ToolCall:  # the carries of its id, old and new, may now be another tool call's
                tool_context.update_tool_context((), forced=tool_context.tool_keys([before, obj]))
            if pending:
                transaction.on_commit(deferred.schedule)
            _recount(type(self), _round_ids([before, obj]), locked)

    def delete_model(self, request: HttpRequest, obj: Model) -> None:
        self.delete_queryset(request, type(obj).objects.filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        sql.retrying_deadlocks(lambda: self._delete_queryset(queryset))  # the delete action: no outer transaction

    def _delete_queryset(self, queryset: QuerySet) -> None:
        model = queryset.model
        # what the locks, the recount and the delete need of a row: not its messages or observation
        needed = [field.name for field in model._meta.concrete_fields if field.name in ("conversation", "round")]
        with transaction.atomic():
            def rows_now() -> list[Model]:
                return list(rollups.rows_to_delete(model.objects.filter(pk__in=queryset.values("pk")), *needed))

            locked = _lock_conversations(lambda: {row.conversation_id for row in rows_now()})
            rows = rows_now()
            round_ids = _round_ids(rows)
            with rollups.batched():
                collector = rollups.collect_deletion(rows)
                carriers, results = _llm_call_spans(collector), _tool_keys(collector)
                collector.delete()
                # what the deleted calls carried costs that much less; a tool call left sharing an
                # id with a deleted one now owns the carries that one had
                tool_context.forget_carriers(carriers, results)
            _recount(type(self), set(Round.objects.filter(pk__in=round_ids).values_list("pk", flat=True)), locked)


def _lock_conversations(conversation_ids: Callable[[], set[int]]) -> set[int]:
    """Lock the conversations `conversation_ids()` names, again until it names no other (an ingest
    may have moved the rows meanwhile); the ids locked."""
    locked: set[int] = set()
    while not (wanted := conversation_ids()) <= locked:
        sql.lock_rows(Conversation, wanted - locked)
        locked |= wanted
    return locked


def _round_ids(rows: Iterable[Model]) -> set[int]:
    return {row.pk if isinstance(row, Round) else getattr(row, "round_id", None) for row in rows} - {None}


def _recount(sender: type, round_ids: set[int], conversation_ids: set[int]) -> None:
    """Counters aggregated again, findings to recount, and open pages told to reload once the
    change commits (a figure may have gone down: pages that add what ingest sends cannot follow)."""
    recompute_counters(round_ids, conversation_ids)
    finding_counts.mark_stale(conversation_ids)
    changes = empty_changes()
    changes.update(conversation_ids=sorted(conversation_ids), rows_removed=True)
    transaction.on_commit(lambda: _announce(sender, changes))


def _llm_call_spans(collector: Collector) -> set[tuple[str, str]]:
    """(trace_id, span_id) of the LLM calls a delete removes, cascade included (never fast-deleted:
    their tool calls are set to null, so the collector holds them)."""
    ids = sorted(call.pk for call in collector.data.get(LLMCall, ()))
    spans: set[tuple[str, str]] = set()
    for chunk in sql.chunked(ids):
        spans.update(LLMCall.objects.filter(pk__in=chunk).values_list("trace_id", "span_id"))
    return spans


def _tool_keys(collector: Collector) -> set[tuple[int, str]]:
    """(conversation_id, tool_call_id) of the tool calls a delete removes (fast-deleted in a
    round's cascade: they have no dependants)."""
    ids = sorted(tool.pk for tool in collector.data.get(ToolCall, ()))
    querysets = [*(q for q in collector.fast_deletes if q.model is ToolCall),
                 *(ToolCall.objects.filter(pk__in=chunk) for chunk in sql.chunked(ids))]
    return {key for queryset in querysets
            for key in queryset.exclude(tool_call_id="").order_by().values_list("conversation_id", "tool_call_id")}


def _announce(sender: type, changes: IngestChanges) -> None:
    for receiver, error in ingest_committed.send_robust(sender=sender, changes=changes):
        if isinstance(error, Exception):
            logger.error("ingest_committed receiver %r failed: %r", receiver, error)
