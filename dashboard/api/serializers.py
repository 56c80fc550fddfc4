"""Read API serializers: what the REST API shows of conversations, calls, compressions, artifacts."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from pipeline.models import (
    Artifact,
    CompressionEvent,
    Conversation,
    LLMCall,
    Round,
    SkillActivation,
    Status,
    ToolCall,
)
from pipeline.models.events import CompressionStrategy
from pipeline.stats import parse_window

TIMING = ["started_at", "ended_at", "duration_ms", "status", "error_type", "error_message"]


class ConversationSerializer(serializers.ModelSerializer):
    class Meta:
        model = Conversation
        fields = [
            "id", "external_id", "title", "agent_name", "user_id", "service_name", "model", "status",
            "started_at", "last_activity_at", "round_count", "llm_call_count", "tool_call_count",
            "error_count", "input_tokens", "output_tokens", "compression_count", "skill_activation_count",
            "unique_skill_count", "retried_call_count", "message_count",
        ]


class LLMCallSerializer(serializers.ModelSerializer):
    approximate = serializers.BooleanField(
        source="tokens_approximate", read_only=True,
        help_text="Token counts ctxlens computed with a tokenizer that only approximates the model's")

    class Meta:
        model = LLMCall
        fields = [
            "id", "trace_id", "span_id", "step", "model", "request_model", "response_model", "provider",
            "operation", *TIMING, "input_tokens", "output_tokens", "total_tokens", "cache_read_tokens",
            "cache_write_tokens", "reasoning_tokens", "context_window", "context_tokens",
            "context_composition", "input_messages", "output_messages", "finish_reason", "tokens_estimated",
            "approximate",
        ]


class ToolCallSerializer(serializers.ModelSerializer):
    artifact_id = serializers.SlugRelatedField(source="artifact", slug_field="artifact_id", read_only=True)
    approximate = serializers.BooleanField(
        source="tokens_approximate", read_only=True,
        help_text="observation_tokens counted with a tokenizer that only approximates the model's")
    error_class = serializers.CharField(
        read_only=True, help_text="The error type's class: retryable, permanent or needs_human; empty when unknown."
    )

    class Meta:
        model = ToolCall
        fields = [
            "id", "trace_id", "span_id", "llm_call", "tool_name", "tool_call_id", "arguments", "observation",
            "observation_tokens", "input_tokens", "tokens_estimated", "output_level", "success", *TIMING, "error_class",
            "error_code", "retry_count", "cache_hit", "artifact_id", "approximate",
        ]


class CompressionSummarySerializer(serializers.ModelSerializer):
    tokens_saved = serializers.IntegerField(read_only=True)

    class Meta:
        model = CompressionEvent
        fields = [
            "id", "conversation", "round", "llm_call", "strategy", "occurred_at", "messages_before",
            "messages_after", "tokens_before", "tokens_after", "tokens_saved", "context_window",
        ]


class CompressionDetailSerializer(CompressionSummarySerializer):
    class Meta(CompressionSummarySerializer.Meta):
        fields = [
            *CompressionSummarySerializer.Meta.fields, "tokens_before_by_category", "tokens_after_by_category",
            "before_messages", "after_messages", "dropped", "summarised", "summary", "estimated_costs", "selection",
        ]


class SkillActivationSerializer(serializers.ModelSerializer):
    class Meta:
        model = SkillActivation
        fields = ["id", "skill_name", "load_level", "chain", "depth", "context_modifier", "tokens", "resources",
                  "messages", "status", "error_message", "activated_at"]


class RoundSerializer(serializers.ModelSerializer):
    llm_calls = LLMCallSerializer(many=True, read_only=True)
    tool_calls = ToolCallSerializer(many=True, read_only=True)
    compressions = CompressionSummarySerializer(many=True, read_only=True)
    skill_activations = SkillActivationSerializer(many=True, read_only=True)

    class Meta:
        model = Round
        fields = [
            "id", "key", "trace_id", "status", "started_at", "ended_at", "duration_ms", "user_message",
            "final_answer", "llm_call_count", "tool_call_count", "error_count", "input_tokens", "output_tokens",
            "llm_calls", "tool_calls", "compressions", "skill_activations",
        ]


class ConversationTotalsSerializer(serializers.Serializer):
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    llm_calls = serializers.IntegerField()
    tool_calls = serializers.IntegerField()
    errors = serializers.IntegerField(help_text="Failed tool calls plus LLM calls with status error.")


class ConversationDetailSerializer(ConversationSerializer):
    """The conversation with one page of its rounds (the view puts the page in the context)."""

    totals = serializers.SerializerMethodField()
    rounds_total = serializers.SerializerMethodField(help_text="How many rounds the conversation has.")
    rounds_next = serializers.SerializerMethodField(help_text="The URL of the next page of rounds, or null.")
    rounds = serializers.SerializerMethodField(help_text="Oldest first; at most rounds_limit of them.")

    class Meta(ConversationSerializer.Meta):
        fields = [*ConversationSerializer.Meta.fields, "totals", "rounds_total", "rounds_next", "rounds"]

    @extend_schema_field(ConversationTotalsSerializer)
    def get_totals(self, conversation: Conversation) -> dict[str, int]:
        return self.context["totals"]

    def get_rounds_total(self, conversation: Conversation) -> int:
        return self.context["rounds_total"]

    @extend_schema_field(serializers.URLField(allow_null=True))
    def get_rounds_next(self, conversation: Conversation) -> str | None:
        return self.context["rounds_next"]

    @extend_schema_field(RoundSerializer(many=True))
    def get_rounds(self, conversation: Conversation) -> list[dict[str, Any]]:
        return RoundSerializer(self.context["rounds"], many=True, context=self.context).data


class ArtifactSerializer(serializers.ModelSerializer):
    content_url = serializers.SerializerMethodField()
    expired = serializers.BooleanField(source="is_expired", read_only=True)

    class Meta:
        model = Artifact
        fields = ["artifact_id", "sha256", "size", "mime", "summary", "token_count", "conversation",
                  "created_at", "expires_at", "last_accessed_at", "expired", "content_url"]

    def get_content_url(self, artifact: Artifact) -> str:
        return reverse("api:artifact-content", args=[artifact.artifact_id])


class ToolStatsSerializer(serializers.Serializer):
    tool_name = serializers.CharField()
    calls = serializers.IntegerField()
    successes = serializers.IntegerField()
    failures = serializers.IntegerField()
    success_rate = serializers.FloatField(help_text="successes / calls, from 0 to 1.")
    retries = serializers.IntegerField(help_text="Sum of retry_count.")
    cache_hits = serializers.IntegerField(help_text="Calls answered from the tool-result cache (the tool did not run).")
    cache_hit_rate = serializers.FloatField(help_text="cache_hits / calls, from 0 to 1.")
    avg_duration_ms = serializers.FloatField(allow_null=True)
    p50_duration_ms = serializers.FloatField(allow_null=True, help_text="Median, linear interpolation.")
    p95_duration_ms = serializers.FloatField(allow_null=True, help_text="95th percentile, linear interpolation.")
    avg_observation_tokens = serializers.FloatField()
    total_observation_tokens = serializers.IntegerField()


# --- query parameters ------------------------------------------------------------------


class TimeRangeQuery(serializers.Serializer):
    since = serializers.DateTimeField(required=False, help_text="ISO 8601; inclusive.")
    until = serializers.DateTimeField(required=False, help_text="ISO 8601; exclusive.")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("since") and attrs.get("until") and attrs["since"] >= attrs["until"]:
            raise serializers.ValidationError({"until": ["until must be after since."]})
        return attrs


class ConversationQuery(TimeRangeQuery):
    model = serializers.CharField(required=False, max_length=255, help_text="Conversations that used this model.")
    status = serializers.ChoiceField(choices=Status.choices, required=False)
    search = serializers.CharField(required=False, max_length=255,
                                   help_text="Part of the external id, title or agent name.")


class RoundPageQuery(serializers.Serializer):
    rounds_offset = serializers.IntegerField(required=False, default=0, min_value=0, max_value=2**31 - 1,
                                             help_text="Skip this many rounds, oldest first.")
    rounds_limit = serializers.IntegerField(required=False, default=100, min_value=1, max_value=500,
                                            help_text="At most this many rounds (100 unless given, 500 at most).")


def object_id(**kwargs: Any) -> serializers.IntegerField:
    """A row id filter: past 2**63 - 1 no column holds it, and the database driver overflows (a 500)."""
    return serializers.IntegerField(required=False, min_value=1, max_value=2**63 - 1, **kwargs)


class ToolStatsQuery(TimeRangeQuery):
    window = serializers.CharField(required=False, help_text="Instead of since: the last 15m, 1h, 24h, 7d, 2w…")
    conversation = object_id(help_text="A conversation id.")
    tool = serializers.CharField(required=False, max_length=255, help_text="Only this tool.")

    def validate_window(self, value: str) -> Any:
        try:
            return parse_window(value)
        except ValueError as error:
            raise serializers.ValidationError(str(error)) from None

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("window") is not None and attrs.get("since") is not None:
            raise serializers.ValidationError({"window": ["Give window or since, not both."]})
        return super().validate(attrs)


class CompressionQuery(TimeRangeQuery):
    conversation = object_id()
    strategy = serializers.ChoiceField(choices=CompressionStrategy.choices, required=False)


class ArtifactQuery(serializers.Serializer):
    conversation = object_id()
    expired = serializers.BooleanField(required=False, allow_null=True, default=None)
