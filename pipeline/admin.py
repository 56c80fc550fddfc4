"""Django admin for every record; artifacts and API keys get the operator's tools."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ChangeList
from django.db import router, transaction
from django.db.models import Model, QuerySet
from django.db.models.deletion import Collector, ProtectedError, RestrictedError
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.text import capfirst

from pipeline.artifacts.cleanup import cleanup_artifacts, delete_expired_artifacts
from pipeline.artifacts.store import ArtifactError, open_artifact
from pipeline.ingest.write import sql, tool_context
from pipeline.ingest.write.counters import recompute_counters
from pipeline.insight import finding_counts
from pipeline.retention import delete_conversations
from pipeline.rollups import track as rollups
from pipeline.signals import IngestChanges, empty_changes, ingest_committed
from pipeline.models import (
    ApiKey,
    Artifact,
    CompressionEvent,
    Conversation,
    LLMCall,
    Rollup,
    Round,
    SkillActivation,
    Span,
    SpanLog,
    ToolCall,
    ToolRequest,
    ToolResultCarry,
)

logger = logging.getLogger(__name__)

PREVIEW_BYTES = 4096


class DeletedMeanwhile(Exception):
    """The row an admin edit saves was deleted after the edit read it (on PostgreSQL, by another
    operator, a `prune` batch or ingest replacing its span, committed meanwhile)."""


class ChangeListWithoutBulk(ChangeList):
    """A change list that leaves out its model admin's `list_defer` columns."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: list[str] | None = None) -> QuerySet:
        return super().get_queryset(request, exclude_parameters).defer(*self.model_admin.list_defer)


class ListsWithoutBulk:
    """Change lists leave out the columns that hold a row's bulk and that no list column shows
    (messages, observations, raw attributes: megabytes, perhaps, per row): a page of 100 LLM
    calls read and decoded every message of each. Searching and filtering still use them."""

    list_defer: tuple[str, ...] = ()

    def get_changelist(self, request: HttpRequest, **kwargs: object) -> type[ChangeList]:
        return ChangeListWithoutBulk


class CountsWhatCascades:
    """The delete page and the delete action list the rows chosen, and count by kind the rows under
    them that go too, where Django's admin linked every one, read whole: for a conversation of
    2,000 turns, 8 s and 2.2 MB of page, every message read, and all of it again on confirming.
    The rows under them are read by id (Django's delete collector), or only counted."""

    def get_deleted_objects(self, objs: Iterable[Model], request: HttpRequest
                            ) -> tuple[list[str], dict[str, int], set[str], list[str]]:
        objs = list(objs)
        collector = Collector(using=router.db_for_write(self.model))  # type: ignore[attr-defined]
        try:
            collector.collect(objs)
        except (ProtectedError, RestrictedError):  # Django's page names what protects them (no model here does)
            return super().get_deleted_objects(objs, request)  # type: ignore[misc]
        # by id: the fast deletes overlap (a round's tool calls are its conversation's too)
        ids: dict[type[Model], set[Any]] = defaultdict(set)
        for model, rows in collector.data.items():
            ids[model].update(row.pk for row in rows)
        for queryset in collector.fast_deletes:  # unordered: a model's ordering would scan its index
            ids[queryset.model].update(queryset.order_by().values_list("pk", flat=True))
        site = self.admin_site  # type: ignore[attr-defined]
        perms_needed = {model._meta.verbose_name for model, pks in ids.items() if pks and site.is_registered(model)
                        and not site.get_model_admin(model).has_delete_permission(request)}
        return ([self._linked(row) for row in objs],
                {model._meta.verbose_name_plural: len(pks) for model, pks in ids.items() if pks}, perms_needed, [])

    def _linked(self, row: Model) -> str:
        """`row`, of this admin's model, linked to its change page as Django's list links it."""
        opts = row._meta
        url = reverse(f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_change",  # type: ignore[attr-defined]
                      args=[quote(row.pk)])
        return format_html('{}: <a href="{}">{}</a>', capfirst(opts.verbose_name), url, row)


class DeletesStartAgainAfterDeadlock:
    """The delete page's transaction, started again when PostgreSQL ended a deadlock by aborting it."""

    def delete_view(self, request: HttpRequest, object_id: str, extra_context: dict | None = None) -> HttpResponse:
        view = super().delete_view  # type: ignore[misc]
        return sql.retrying_deadlocks(lambda: view(request, object_id, extra_context))


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
            super().save_model(request, obj, form, change)
            if model is LLMCall:  # what it carries follows its input, tokens, model and cost
                tool_context.update_for_calls([obj.pk])
            elif model is ToolCall:  # the carries of its id, old and new, may now be another tool call's
                tool_context.update_tool_context((), forced=tool_context.tool_keys([before, obj]))
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


class KeptByIngest:
    """An admin of rows ingest keeps: they are viewed here, never added or edited."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Artifact)
class ArtifactAdmin(admin.ModelAdmin):
    list_display = ("artifact_id", "size", "short_sha256", "mime", "conversation", "created_at", "expires_at")
    list_filter = ("mime", "created_at", "expires_at")
    search_fields = ("artifact_id", "sha256", "summary", "conversation__external_id", "conversation__title")
    readonly_fields = (
        "artifact_id", "sha256", "size", "mime", "token_count", "conversation",
        "created_at", "last_accessed_at", "download", "preview",
    )
    fields = ("artifact_id", "sha256", "size", "mime", "token_count", "summary", "conversation",
              "created_at", "expires_at", "last_accessed_at", "download", "preview")
    actions = ["delete_expired", "apply_retention"]
    list_select_related = ("conversation",)

    @admin.display(description="sha256")
    def short_sha256(self, obj: Artifact) -> str:
        return obj.sha256[:12]

    @admin.display(description="Preview (first 4 KB)")
    def preview(self, obj: Artifact) -> str:
        try:
            with open_artifact(obj) as handle:  # never follows a link out of the sandbox
                text = handle.read(PREVIEW_BYTES).decode("utf-8", errors="replace")
        except ArtifactError:
            text = ""
        # format_html escapes the content: artifacts hold untrusted tool output.
        return format_html('<pre style="white-space: pre-wrap; max-height: 30em; overflow: auto">{}</pre>', text)

    @admin.display(description="Download")
    def download(self, obj: Artifact) -> str:
        url = reverse("admin:pipeline_artifact_download", args=[obj.pk])
        return format_html('<a href="{}">Download {}</a>', url, obj.artifact_id)

    def get_urls(self):
        custom = [
            path(
                "<int:pk>/download/",
                self.admin_site.admin_view(self.download_view),
                name="pipeline_artifact_download",
            )
        ]
        return custom + super().get_urls()

    def download_view(self, request, pk: int):
        artifact = self.get_object(request, str(pk))
        if artifact is None or not self.has_view_permission(request, artifact):
            raise Http404("No such artifact")
        try:
            handle = open_artifact(artifact)  # a valid id, a regular file in the sandbox, the row's content
        except ArtifactError:
            raise Http404("The artifact's content is gone") from None
        response = FileResponse(handle, as_attachment=True, filename=artifact.artifact_id,
                                content_type=artifact.mime or "application/octet-stream")
        # Tool output is untrusted: never let a browser render it as a page of this origin (the
        # same headers as the API's artifact content endpoint, dashboard/api/views.py).
        response["X-Content-Type-Options"] = "nosniff"
        response["Content-Security-Policy"] = "sandbox; default-src 'none'"
        return response

    @admin.action(description="Delete expired artifacts (all of them, not only the selected)")
    def delete_expired(self, request, queryset) -> None:
        count = delete_expired_artifacts().count
        self.message_user(request, f"Deleted {count} expired artifact rows and their files.", messages.SUCCESS)

    @admin.action(description="Apply retention now: TTL, size cap (LRU), orphan files (all artifacts)")
    def apply_retention(self, request, queryset) -> None:
        self.message_user(request, cleanup_artifacts().line(), messages.SUCCESS)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix", "scope", "created_at", "last_used_at", "revoked_at", "is_active")
    list_filter = ("scope", "revoked_at")
    search_fields = ("name", "prefix")
    readonly_fields = ("prefix", "created_by", "created_at", "last_used_at", "revoked_at")
    actions = ["revoke"]

    @admin.display(boolean=True, description="Active")
    def is_active(self, obj: ApiKey) -> bool:
        return obj.is_active

    def get_fields(self, request, obj=None):
        return ("name", "scope") if obj is None else ("name", "scope", *self.readonly_fields)

    def save_model(self, request, obj: ApiKey, form, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        key, raw_key = ApiKey.generate(name=obj.name, scope=obj.scope, created_by=request.user)
        obj.pk = key.pk
        obj.refresh_from_db()
        self.message_user(
            request,
            f"New API key '{key.name}': {raw_key} — copy it now, it is shown only this once.",
            messages.WARNING,
        )

    @admin.action(description="Revoke selected keys")
    def revoke(self, request, queryset) -> None:
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {count} keys.", messages.SUCCESS)


@admin.register(Conversation)
class ConversationAdmin(CountsWhatCascades, DeletesStartAgainAfterDeadlock, admin.ModelAdmin):
    list_display = ("__str__", "external_id", "model", "status", "round_count", "tool_call_count",
                    "input_tokens", "output_tokens", "last_activity_at")
    list_filter = ("status", "model")
    search_fields = ("external_id", "title", "agent_name", "user_id")
    date_hierarchy = "last_activity_at"

    # Deleted as prune's last step deletes them (retention.delete_conversations), locking in
    # ingest's order (Django's own delete writes the rollups first and locks the conversation
    # last); started again after a deadlock.
    def delete_model(self, request: HttpRequest, obj: Conversation) -> None:
        self.delete_queryset(request, Conversation.objects.filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        ids = list(queryset.values_list("pk", flat=True))
        sql.retrying_deadlocks(lambda: delete_conversations(ids))


@admin.register(Round)
class RoundAdmin(ListsWithoutBulk, FiguresFollowAdminChanges, admin.ModelAdmin):
    list_display = ("conversation", "key", "status", "started_at", "duration_ms", "llm_call_count", "tool_call_count")
    list_defer = ("user_message", "final_answer")
    list_filter = ("status",)
    search_fields = ("key", "trace_id", "user_message", "final_answer")
    raw_id_fields = ("conversation",)


@admin.register(LLMCall)
class LLMCallAdmin(ListsWithoutBulk, FiguresFollowAdminChanges, admin.ModelAdmin):
    list_display = ("model", "conversation", "input_tokens", "output_tokens", "context_tokens", "status", "started_at")
    list_defer = ("input_messages", "output_messages", "input_digest", "output_digest", "context_composition")
    list_filter = ("status", "model", "provider")
    search_fields = ("trace_id", "span_id", "model")
    raw_id_fields = ("conversation",)
    # The tool calls a call asks for are indexed from its output, by round (ToolRequest), and its
    # tools linked by them: an edit here would rewrite neither.
    readonly_fields = ("output_messages", "round")


@admin.register(ToolCall)
class ToolCallAdmin(ListsWithoutBulk, FiguresFollowAdminChanges, admin.ModelAdmin):
    list_display = ("tool_name", "tool_call_id", "conversation", "success", "error_type", "retry_count",
                    "duration_ms", "started_at")
    list_defer = ("arguments", "observation", "tokens_at_level")
    list_filter = ("success", "tool_name", "output_level", "error_type")
    search_fields = ("tool_name", "tool_call_id", "trace_id", "span_id")
    raw_id_fields = ("conversation", "round", "llm_call", "artifact")


@admin.register(CompressionEvent)
class CompressionEventAdmin(ListsWithoutBulk, FiguresFollowAdminChanges, admin.ModelAdmin):
    list_display = ("conversation", "strategy", "tokens_before", "tokens_after", "messages_before",
                    "messages_after", "occurred_at")
    list_defer = ("before_messages", "after_messages", "dropped", "summarised", "summary",
                  "tokens_before_by_category", "tokens_after_by_category", "estimated_costs")
    list_filter = ("strategy",)
    raw_id_fields = ("conversation", "round", "llm_call")


@admin.register(SkillActivation)
class SkillActivationAdmin(ListsWithoutBulk, FiguresFollowAdminChanges, admin.ModelAdmin):
    list_display = ("skill_name", "conversation", "load_level", "depth", "tokens", "status", "activated_at")
    list_defer = ("messages", "resources", "context_modifier", "chain", "error_message")
    list_filter = ("skill_name", "load_level", "status")
    raw_id_fields = ("conversation", "round")


@admin.register(Span)
class SpanAdmin(ListsWithoutBulk, admin.ModelAdmin):
    list_display = ("name", "kind", "trace_id", "span_id", "status_code", "duration_ms", "start_time", "source")
    list_defer = ("attributes", "events", "links", "resource")
    list_filter = ("kind", "status_code", "source")
    search_fields = ("trace_id", "span_id", "name")
    raw_id_fields = ("conversation",)


@admin.register(SpanLog)
class SpanLogAdmin(ListsWithoutBulk, admin.ModelAdmin):
    list_display = ("event_name", "trace_id", "span_id", "time_unix_nano", "received_at")
    list_defer = ("body", "attributes")
    list_filter = ("event_name",)
    search_fields = ("trace_id", "span_id", "event_name")


@admin.register(ToolResultCarry)
class ToolResultCarryAdmin(KeptByIngest, admin.ModelAdmin):
    """The ledger of which LLM call carried which tool result (pipeline.ingest.write.tool_context):
    kept by ingest, read-only here."""

    list_display = ("tool_call_id", "trace_id", "span_id", "started_at", "tokens", "cost_usd")
    search_fields = ("tool_call_id", "trace_id", "span_id")
    raw_id_fields = ("conversation",)


@admin.register(ToolRequest)
class ToolRequestAdmin(ListsWithoutBulk, KeptByIngest, admin.ModelAdmin):
    """Which LLM call asked for which tool call (pipeline.ingest.write.linking): kept by ingest
    with each call, read-only here."""

    list_display = ("tool_call_id", "name", "llm_call", "round")
    list_select_related = ("llm_call", "round")
    list_defer = ("llm_call__input_messages", "llm_call__output_messages", "llm_call__input_digest",
                  "llm_call__output_digest", "llm_call__context_composition", "round__user_message",
                  "round__final_answer")
    search_fields = ("tool_call_id", "name")
    raw_id_fields = ("llm_call", "round")


@admin.register(Rollup)
class RollupAdmin(KeptByIngest, admin.ModelAdmin):
    """Per-bucket sums kept by ingest (pipeline.rollups): read-only here; `manage.py rebuild_rollups`
    recomputes them from the rows."""

    list_display = ("kind", "name", "grain", "bucket_start", "calls")
    list_filter = ("kind", "grain")
    search_fields = ("name",)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # the figures would go wrong: prune and compact_rollups delete them
