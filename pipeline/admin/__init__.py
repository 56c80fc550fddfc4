"""Django admin for every record; artifacts and API keys get the operator's tools.

pages.py: lists and delete pages for rows holding bulk; figures.py: edits and deletes that keep
the figures derived from the rows right."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import FileResponse, Http404, HttpRequest
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from pipeline.admin.figures import FiguresFollowAdminChanges
from pipeline.admin.pages import CountsWhatCascades, DeletesStartAgainAfterDeadlock, KeptByIngest, ListsWithoutBulk
from pipeline.artifacts.cleanup import cleanup_artifacts, delete_expired_artifacts
from pipeline.artifacts.store import ArtifactError, open_artifact
from pipeline.ingest.write import sql
from pipeline.retention import delete_conversations
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

PREVIEW_BYTES = 4096


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
