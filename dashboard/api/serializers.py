"""Read API serializers: what the REST API shows of conversations, calls, compressions, artifacts."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from pipeline.insight.findings import CODES, SEVERITIES
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


def usd(help_text: str) -> serializers.DecimalField:
    """A USD amount: a JSON number (never a string, whatever COERCE_DECIMAL_TO_STRING says), or
    null when no price is known ("no price", never 0)."""
    return serializers.DecimalField(max_digits=30, decimal_places=12, coerce_to_string=False, read_only=True,
                                    allow_null=True, help_text=help_text)


SUM_OF_COSTS = ("Sum of its LLM calls' cost_usd; null when none of them has a known price (or it has no LLM "
                "calls). With unpriced_call_count > 0 it is a partial sum.")
UNPRICED = "How many of its LLM calls have no known price (left out of cost_usd)."
STORED_COUNTS = ("Stored with the conversation and refreshed in the background about a second after the "
                 "ingest that changed it; /api/conversations/{id}/findings/ computes the findings themselves fresh.")


class ConversationSerializer(serializers.ModelSerializer):
    cost_usd = usd(SUM_OF_COSTS)
    unpriced_call_count = serializers.IntegerField(read_only=True, help_text=UNPRICED)
    finding_count = serializers.IntegerField(read_only=True, help_text=f"How many findings. {STORED_COUNTS}")
    finding_counts = serializers.DictField(
        child=serializers.IntegerField(), read_only=True,
        help_text=f"Findings by code, e.g. {{\"cache_break\": 2}}. {STORED_COUNTS}")

    class Meta:
        model = Conversation
        fields = [
            "id", "external_id", "title", "agent_name", "user_id", "service_name", "model", "status",
            "started_at", "last_activity_at", "round_count", "llm_call_count", "tool_call_count",
            "error_count", "input_tokens", "output_tokens", "compression_count", "skill_activation_count",
            "unique_skill_count", "retried_call_count", "message_count", "cost_usd", "unpriced_call_count",
            "finding_count", "finding_counts",
        ]


class FindingSerializer(serializers.Serializer):
    code = serializers.ChoiceField(choices=list(CODES), help_text="What is wrong (pipeline.insight.findings).")
    severity = serializers.ChoiceField(
        choices=SEVERITIES, help_text="error: a tool-calling protocol violation; warning: waste or a coming "
                                      "failure; info: worth knowing.")
    message = serializers.CharField(help_text="A sentence with the figures.")
    round_id = serializers.IntegerField(allow_null=True, help_text="The turn the finding is about.")
    llm_call_id = serializers.IntegerField(allow_null=True, help_text="The LLM call it is about (/llm-calls/<id>/).")
    tool_call_id = serializers.CharField(allow_null=True, help_text="The id the model gave the tool call it is about.")
    tool_call = serializers.IntegerField(allow_null=True, help_text="The stored tool call it is about.")


class FindingListSerializer(serializers.Serializer):
    results = FindingSerializer(many=True, help_text="In the order of the time of the call each is about.")


class LLMCallSerializer(serializers.ModelSerializer):
    approximate = serializers.BooleanField(
        source="tokens_approximate", read_only=True,
        help_text="Token counts ctxlens computed with a tokenizer that only approximates the model's")
    cost_usd = usd("What the call cost in USD, from its input, cache-read, cache-write, output and reasoning "
                   "tokens at the model's price when it started (genai-prices, or CTXLENS_PRICES_FILE); "
                   "null when the model has no known price.")

    class Meta:
        model = LLMCall
        fields = [
            "id", "trace_id", "span_id", "step", "model", "request_model", "response_model", "provider",
            "operation", *TIMING, "input_tokens", "output_tokens", "total_tokens", "cache_read_tokens",
            "cache_write_tokens", "reasoning_tokens", "context_window", "context_tokens",
            "context_composition", "input_messages", "output_messages", "finish_reason", "tokens_estimated",
            "approximate", "cost_usd",
        ]


class TokensAtLevelSerializer(serializers.Serializer):
    brief = serializers.IntegerField()
    standard = serializers.IntegerField()
    full = serializers.IntegerField()


class DiffMessageSerializer(serializers.Serializer):
    index = serializers.IntegerField(help_text="Position in the input: this call's (added, changed) or "
                                               "the previous call's (removed).")
    role = serializers.CharField()
    category = serializers.CharField(help_text="The context category it counts under.")
    tokens = serializers.IntegerField(help_text="The call's input tokens split over its messages by UTF-8 size.")


class ChangedMessageSerializer(DiffMessageSerializer):
    previous_index = serializers.IntegerField(help_text="Its position in the previous call's input.")
    previous_tokens = serializers.IntegerField(help_text="Its tokens in the previous call.")


class CallDiffSerializer(serializers.Serializer):
    """An LLM call's input against the previous LLM call of its conversation (pipeline.insight.diff)."""

    previous_call_id = serializers.IntegerField(
        allow_null=True, help_text="null: the first call of its stream (the conversation's first call, or one that "
                                   "shares no message with earlier calls).")
    kept_prefix_messages = serializers.IntegerField(help_text="Leading messages both inputs share unchanged.")
    kept_prefix_tokens = serializers.IntegerField(help_text="Their tokens: what a prompt cache can serve.")
    added = DiffMessageSerializer(many=True)
    removed = DiffMessageSerializer(many=True)
    changed = ChangedMessageSerializer(many=True)
    token_delta = serializers.IntegerField(help_text="input_tokens minus the previous call's.")
    token_delta_by_category = serializers.DictField(
        child=serializers.IntegerField(), help_text="The added, removed and changed messages' tokens by category.")
    cache_break = serializers.BooleanField(help_text="The previous input is not a prefix of this one.")
    cache_break_reason = serializers.ChoiceField(
        choices=["compression", "edit"], allow_null=True,
        help_text="compression: a recorded compression explains it; edit: nothing does; null: no break.")
    uncacheable_tokens = serializers.IntegerField(
        help_text="Tokens of messages both inputs share that sit past the break: cached before, not now.")


class LLMCallDetailSerializer(LLMCallSerializer):
    """One LLM call with the diff of its input against the previous call's (the view puts it in the context)."""

    diff = serializers.SerializerMethodField()

    class Meta(LLMCallSerializer.Meta):
        fields = ["id", "conversation", "round", *(f for f in LLMCallSerializer.Meta.fields if f != "id"), "diff"]

    @extend_schema_field(CallDiffSerializer)
    def get_diff(self, call: LLMCall) -> dict[str, Any]:
        return CallDiffSerializer(self.context["diff"]).data


class ToolCallSerializer(serializers.ModelSerializer):
    artifact_id = serializers.SlugRelatedField(source="artifact", slug_field="artifact_id", read_only=True)
    approximate = serializers.BooleanField(
        source="tokens_approximate", read_only=True,
        help_text="observation_tokens counted with a tokenizer that only approximates the model's")
    error_class = serializers.CharField(
        read_only=True, help_text="The error type's class: retryable, permanent or needs_human; empty when unknown."
    )
    context_tokens = serializers.IntegerField(
        read_only=True, help_text="The tokens this result occupied in every later LLM call whose input carried it, "
                                  "summed (each call's input tokens split over its messages by size).")
    context_carries = serializers.IntegerField(read_only=True, help_text="How many LLM calls carried this result.")
    context_cost_usd = serializers.FloatField(
        read_only=True, allow_null=True,
        help_text="context_tokens priced as input tokens of each carrying call's model; null when none has a price.")
    tokens_at_level = serializers.SerializerMethodField(
        help_text="The observation's tokens at each output level, from its stored full result (counted shortly after "
                  "ingest); null without a full result or until counted.")

    class Meta:
        model = ToolCall
        fields = [
            "id", "trace_id", "span_id", "llm_call", "tool_name", "tool_call_id", "arguments", "observation",
            "observation_tokens", "input_tokens", "tokens_estimated", "output_level", "success", *TIMING, "error_class",
            "error_code", "retry_count", "cache_hit", "artifact_id", "approximate", "context_tokens",
            "context_carries", "context_cost_usd", "tokens_at_level",
        ]

    @extend_schema_field(TokensAtLevelSerializer(allow_null=True))
    def get_tokens_at_level(self, tool: ToolCall) -> dict[str, int] | None:
        return tool.tokens_at_level or None  # {}: the stored result could not be read


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
    cost_usd = usd(SUM_OF_COSTS)
    unpriced_call_count = serializers.IntegerField(read_only=True, help_text=UNPRICED)

    class Meta:
        model = Round
        fields = [
            "id", "key", "trace_id", "status", "started_at", "ended_at", "duration_ms", "user_message",
            "final_answer", "llm_call_count", "tool_call_count", "error_count", "input_tokens", "output_tokens",
            "cost_usd", "unpriced_call_count", "llm_calls", "tool_calls", "compressions", "skill_activations",
        ]


class ConversationTotalsSerializer(serializers.Serializer):
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    llm_calls = serializers.IntegerField()
    tool_calls = serializers.IntegerField()
    errors = serializers.IntegerField(help_text="Failed tool calls plus LLM calls with status error.")
    cost_usd = usd(SUM_OF_COSTS)
    unpriced_llm_calls = serializers.IntegerField(help_text="LLM calls with no known price (left out of cost_usd).")


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


class LevelSavingSerializer(serializers.Serializer):
    tokens = serializers.IntegerField(
        help_text="Context tokens saved: (observation tokens − tokens at the level) × the LLM calls that carried "
                  "each result, summed; negative when the level would have cost more.")
    cost_usd = serializers.FloatField(
        allow_null=True, help_text="tokens at the tool's average context cost per token (context_cost_usd / "
                                   "context_tokens); null without a price.")


class LevelSavingsSerializer(serializers.Serializer):
    brief = LevelSavingSerializer()
    standard = LevelSavingSerializer()
    full = LevelSavingSerializer()


PERCENTILE_BOUND = ("{}. Over a time window (no conversation given) read from the rollups: within 2 % of the duration at the percentile's rank (DDSketch-style histogram); with a conversation, exact "
                    "(linear interpolation between the two nearest ranks).")


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
    p50_duration_ms = serializers.FloatField(allow_null=True, help_text=PERCENTILE_BOUND.format("Median"))
    p95_duration_ms = serializers.FloatField(allow_null=True, help_text=PERCENTILE_BOUND.format("95th percentile"))
    p99_duration_ms = serializers.FloatField(allow_null=True, help_text=PERCENTILE_BOUND.format("99th percentile"))
    avg_observation_tokens = serializers.FloatField()
    total_observation_tokens = serializers.IntegerField()
    context_tokens = serializers.IntegerField(
        help_text="What the tool's results cost the context: each result's tokens in every later LLM call whose "
                  "input carried it (until dropped or compressed), summed.")
    context_cost_usd = serializers.FloatField(
        allow_null=True, help_text="context_tokens priced as input tokens of each carrying call's model; "
                                   "null when no carrying call's model has a price.")
    avg_context_carries = serializers.FloatField(
        help_text="How many LLM calls carried a result (its re-sends), on average over the tool's calls.")
    level_calls = serializers.IntegerField(
        help_text="Calls whose full result is stored (a full-level observation or an artifact): "
                  "the calls tokens_at_level and level_savings cover.")
    tokens_at_level = TokensAtLevelSerializer(
        allow_null=True, help_text="The level_calls' observations formatted at each output level by the runtime's "
                                   "formatters and counted with its token counter, summed; null when level_calls is 0.")
    level_savings = LevelSavingsSerializer(
        allow_null=True, help_text="What switching the level_calls to each level would have saved; null when "
                                   "level_calls is 0.")


class ModelStatsSerializer(serializers.Serializer):
    model = serializers.CharField(help_text="The model the calls named; empty for calls that named none.")
    calls = serializers.IntegerField()
    input_tokens = serializers.IntegerField(help_text="Including cache reads and writes, as providers report them.")
    output_tokens = serializers.IntegerField()
    cache_read_tokens = serializers.IntegerField()
    cache_write_tokens = serializers.IntegerField()
    reasoning_tokens = serializers.IntegerField()
    cost_usd = usd("Sum of the calls' cost_usd; null when none has a known price.")
    unpriced_calls = serializers.IntegerField(help_text="Calls with no known price (left out of cost_usd).")


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
    rounds_limit = serializers.IntegerField(required=False, default=10, min_value=1, max_value=500,
                                            help_text="At most this many rounds (10 unless given, 500 at most).")


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


class ModelStatsQuery(ToolStatsQuery):
    tool = None
    model = serializers.CharField(required=False, max_length=255, help_text="Only this model.")


class CompressionQuery(TimeRangeQuery):
    conversation = object_id()
    strategy = serializers.ChoiceField(choices=CompressionStrategy.choices, required=False)


class ArtifactQuery(serializers.Serializer):
    conversation = object_id()
    expired = serializers.BooleanField(required=False, allow_null=True, default=None)
