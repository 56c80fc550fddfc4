"""The REST JSON ingest schema (`POST /api/ingest/`), validated by DRF serializers.

A request is `{"schema_version": "1.0", "events": [...]}`; each event has a `type` and the
client's own ids (`conversation_id`, `round_id`, `call_id`, ...). `pipeline.ingest.decode.rest`
turns validated events into SpanRecords, so REST data goes through the same normaliser and
store as OTLP.
"""

from __future__ import annotations

import re
from typing import Any

from rest_framework import serializers

from pipeline import semconv as sc
from pipeline.ingest.normalise.values import MAX_COUNT
from pipeline.models.events import CompressionStrategy

SCHEMA_MAJOR = 1
SCHEMA_VERSION = "1.0"
SCHEMA_VERSION_RE = re.compile(r"\A(\d+)(?:\.(\d+))?\Z")
MAX_EVENTS = 10_000
ID_LENGTH = 255
STATUS_CHOICES = ("ok", "error")


def text(**kwargs: Any) -> serializers.CharField:
    """Trace content: kept byte for byte (no whitespace trimming), may be empty."""
    return serializers.CharField(allow_blank=True, trim_whitespace=False, required=False, **kwargs)


def client_id(**kwargs: Any) -> serializers.CharField:
    return serializers.CharField(max_length=ID_LENGTH, **kwargs)


MAX_DURATION_MS = 366 * 24 * 3600 * 1000  # a year; 1e308 overflowed the nanosecond arithmetic (a 500)


def duration(**kwargs: Any) -> serializers.FloatField:
    return serializers.FloatField(min_value=0, max_value=MAX_DURATION_MS, required=False,
                                  help_text="How long it took, in milliseconds (a year at most).", **kwargs)


def count(**kwargs: Any) -> serializers.IntegerField:
    """A token or item count: what a database integer column holds (MAX_COUNT), as over OTLP."""
    return serializers.IntegerField(min_value=0, max_value=MAX_COUNT, **{"required": False, **kwargs})


class ToolCallRequestSerializer(serializers.Serializer):
    id = client_id(help_text="The tool_call_id the model generated.")
    name = serializers.CharField(max_length=255)
    arguments = serializers.JSONField(required=False, default=dict)


class MessageSerializer(serializers.Serializer):
    """A chat message: `content` text (and `tool_calls`, `tool_call_id`), or OTel GenAI `parts`."""

    role = serializers.ChoiceField(choices=("system", "user", "assistant", "tool"))
    content = text(allow_null=True)
    parts = serializers.ListField(child=serializers.DictField(), required=False)
    tool_calls = ToolCallRequestSerializer(many=True, required=False)
    tool_call_id = client_id(required=False, help_text="On tool messages: the call this answers.")
    name = serializers.CharField(max_length=255, required=False)
    finish_reason = serializers.CharField(max_length=64, required=False)


class TokensByCategoryField(serializers.DictField):
    """Token counts keyed by context category: system, skills, user, assistant, ..."""

    child = count(required=True)

    def to_internal_value(self, data: Any) -> dict[str, int]:
        value = super().to_internal_value(data)
        unknown = sorted(set(value) - set(sc.CONTEXT_CATEGORIES))
        if unknown:
            raise serializers.ValidationError(
                f"Unknown categories {', '.join(unknown)}; use {', '.join(sc.CONTEXT_CATEGORIES)}."
            )
        return value


class EventSerializer(serializers.Serializer):
    type = serializers.CharField()
    conversation_id = client_id(help_text="Your id of the conversation (session, thread).")
    round_id = client_id(
        required=False,
        help_text="Your id of the turn. Events without one belong to one implicit turn per conversation.",
    )


def _timed(attrs: dict[str, Any]) -> dict[str, Any]:
    """Calls are reported when they end: they need `ended_at` or `duration_ms`."""
    ended, duration = attrs.get("ended_at"), attrs.get("duration_ms")
    if ended is None and duration is None:
        raise serializers.ValidationError({"ended_at": ["Give ended_at or duration_ms."]})
    if ended is not None and ended < attrs["started_at"]:
        raise serializers.ValidationError({"ended_at": ["ended_at is before started_at."]})
    return attrs


class OutcomeFields(serializers.Serializer):
    status = serializers.ChoiceField(choices=STATUS_CHOICES, default="ok")
    error_type = serializers.CharField(max_length=255, required=False, allow_blank=True)
    error_message = text()


class ConversationEventSerializer(EventSerializer):
    type = serializers.ChoiceField(choices=["conversation"])
    round_id = None  # describes the whole conversation
    started_at = serializers.DateTimeField(required=False)
    title = serializers.CharField(max_length=500, required=False, allow_blank=True,
                                  help_text="Shown instead of the first user message.")
    agent_name = serializers.CharField(max_length=255, required=False, allow_blank=True)
    user_id = serializers.CharField(max_length=255, required=False, allow_blank=True)
    service_name = serializers.CharField(max_length=255, required=False, allow_blank=True)


class RoundStartEventSerializer(EventSerializer):
    type = serializers.ChoiceField(choices=["round_start"])
    round_id = client_id()
    timestamp = serializers.DateTimeField(help_text="When the turn started.")
    user_message = text()
    agent_name = serializers.CharField(max_length=255, required=False, allow_blank=True)


class RoundEndEventSerializer(OutcomeFields, EventSerializer):
    type = serializers.ChoiceField(choices=["round_end"])
    round_id = client_id()
    timestamp = serializers.DateTimeField(help_text="When the turn ended.")
    started_at = serializers.DateTimeField(
        required=False, help_text="When the turn started, if no round_start was sent."
    )
    user_message = text()
    final_answer = text()
    agent_name = serializers.CharField(max_length=255, required=False, allow_blank=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("started_at") and attrs["started_at"] > attrs["timestamp"]:
            raise serializers.ValidationError({"started_at": ["started_at is after the end timestamp."]})
        return attrs


class LLMCallEventSerializer(OutcomeFields, EventSerializer):
    type = serializers.ChoiceField(choices=["llm_call"])
    call_id = client_id(help_text="Your id of this LLM call, unique in its turn.")
    started_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(required=False)
    duration_ms = duration()
    model = serializers.CharField(max_length=255)
    response_model = serializers.CharField(max_length=255, required=False, allow_blank=True)
    provider = serializers.CharField(max_length=255, required=False, allow_blank=True)
    input_tokens = count()
    output_tokens = count()
    cache_read_tokens = count(help_text="Included in input_tokens.")
    cache_write_tokens = count(help_text="Included in input_tokens.")
    reasoning_tokens = count(help_text="Included in output_tokens.")
    context_window = count(help_text="The model's maximum context in tokens.")
    context_tokens = count(help_text="Tokens in the context for this call.")
    context_composition = TokensByCategoryField(required=False)
    input_messages = MessageSerializer(many=True, required=False)
    output_messages = MessageSerializer(many=True, required=False)
    finish_reason = serializers.CharField(max_length=64, required=False, allow_blank=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return _timed(attrs)


class ToolCallEventSerializer(OutcomeFields, EventSerializer):
    type = serializers.ChoiceField(choices=["tool_call"])
    call_id = client_id(required=False, help_text="Your id of this execution; defaults to tool_call_id.")
    tool_name = serializers.CharField(max_length=255)
    tool_call_id = client_id(required=False, help_text="The id from the model's tool call.")
    started_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(required=False)
    duration_ms = duration()
    arguments = serializers.JSONField(required=False, default=dict)
    observation = serializers.JSONField(required=False, help_text="What the model was shown (text or JSON).")
    observation_tokens = count()
    input_tokens = count(help_text="The arguments' tokens.")
    output_level = serializers.ChoiceField(choices=("brief", "standard", "full"), required=False)
    retry_count = count()
    cache_hit = serializers.BooleanField(required=False, help_text="Answered from a tool-result cache: the tool did not run.")
    error_code = serializers.CharField(max_length=64, required=False, allow_blank=True)
    artifact_id = serializers.CharField(max_length=80, required=False, allow_blank=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs.get("call_id") and not attrs.get("tool_call_id"):
            raise serializers.ValidationError({"call_id": ["Give call_id or tool_call_id."]})
        return _timed(attrs)


class CompressionEventSerializer(EventSerializer):
    type = serializers.ChoiceField(choices=["compression"])
    compression_id = client_id(help_text="Your id of this compression, unique in its turn.")
    timestamp = serializers.DateTimeField()
    duration_ms = duration()
    strategy = serializers.ChoiceField(choices=CompressionStrategy.choices)
    tokens_before = count(required=True)
    tokens_after = count(required=True)
    messages_before = count(help_text="Defaults to the length of before_messages.")
    messages_after = count(help_text="Defaults to the length of after_messages.")
    context_window = count()
    tokens_before_by_category = TokensByCategoryField(required=False)
    tokens_after_by_category = TokensByCategoryField(required=False)
    before_messages = MessageSerializer(many=True, required=False)
    after_messages = MessageSerializer(many=True, required=False)
    dropped = serializers.ListField(child=serializers.IntegerField(min_value=0), required=False,
                                    help_text="Indexes into before_messages that were dropped.")
    summarised = serializers.ListField(child=serializers.IntegerField(min_value=0), required=False,
                                       help_text="Indexes into before_messages folded into the summary.")
    summary = text()
    estimated_costs = serializers.DictField(
        child=serializers.FloatField(min_value=0), required=False,
        help_text="Estimated USD of each strategy for this compression, e.g. {\"truncate\": 0, \"summarize\": 0.012}.",
    )
    selection = serializers.CharField(max_length=255, required=False, allow_blank=True,
                                      help_text="Why this strategy: \"configured\" or the automatic choice's reason.")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(attrs.get("estimated_costs", {})) - set(CompressionStrategy.values))
        if unknown:
            raise serializers.ValidationError(
                {"estimated_costs": [f"Unknown strategies {unknown}; use {CompressionStrategy.values}."]}
            )
        before = attrs.get("before_messages")
        if before is not None:
            for name in ("dropped", "summarised"):
                bad = [i for i in attrs.get(name, ()) if i >= len(before)]
                if bad:
                    raise serializers.ValidationError(
                        {name: [f"Indexes {bad} are outside before_messages ({len(before)} messages)."]}
                    )
        return attrs


class SkillMessageSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=("metadata", "instruction", "permissions"))
    visibility = serializers.ChoiceField(choices=("visible", "hidden"), default="visible")
    resource = serializers.CharField(max_length=1000, required=False, allow_null=True)
    tokens = count()
    content = text()


class SkillActivationEventSerializer(OutcomeFields, EventSerializer):
    type = serializers.ChoiceField(choices=["skill_activation"])
    activation_id = client_id(help_text="Your id of this activation, unique in its turn.")
    timestamp = serializers.DateTimeField()
    duration_ms = duration()
    skill_name = serializers.CharField(max_length=255)
    level = serializers.ChoiceField(choices=(1, 2, 3), default=2, help_text="Progressive-disclosure load level.")
    chain = serializers.ListField(child=serializers.CharField(max_length=255), required=False,
                                  help_text="The activation path, outermost skill first.")
    depth = serializers.IntegerField(min_value=1, required=False)
    context_modifier = serializers.DictField(required=False)
    tokens = count()
    resources = serializers.ListField(child=serializers.CharField(max_length=1000), required=False, max_length=200,
                                      help_text="Level 3: the resource files loaded, paths inside the skill.")
    messages = SkillMessageSerializer(many=True, required=False,
                                      help_text="The messages the activation injected, with their visibility.")


EVENT_SERIALIZERS: dict[str, type[EventSerializer]] = {
    "conversation": ConversationEventSerializer,
    "round_start": RoundStartEventSerializer,
    "round_end": RoundEndEventSerializer,
    "llm_call": LLMCallEventSerializer,
    "tool_call": ToolCallEventSerializer,
    "compression": CompressionEventSerializer,
    "skill_activation": SkillActivationEventSerializer,
}


def validate_event(data: Any) -> tuple[dict[str, Any] | None, Any]:
    """(validated event, None) or (None, errors) for one raw event."""
    if not isinstance(data, dict):
        return None, {"non_field_errors": ["Each event must be a JSON object."]}
    kind = data.get("type")
    serializer_class = EVENT_SERIALIZERS.get(kind) if isinstance(kind, str) else None
    if serializer_class is None:
        return None, {"type": [f"Unknown event type {kind!r}; use one of {', '.join(EVENT_SERIALIZERS)}."]}
    serializer = serializer_class(data=data)
    if not serializer.is_valid():
        return None, serializer.errors
    return dict(serializer.validated_data), None


class IngestRequestSerializer(serializers.Serializer):
    schema_version = serializers.CharField(max_length=16, help_text=f"This server reads {SCHEMA_MAJOR}.x.")
    events = serializers.ListField(child=serializers.JSONField(), max_length=MAX_EVENTS)

    def validate_schema_version(self, value: str) -> str:
        match = SCHEMA_VERSION_RE.match(value)
        if not match:
            raise serializers.ValidationError(f"schema_version must look like '{SCHEMA_VERSION}'.")
        if int(match.group(1)) != SCHEMA_MAJOR:
            raise serializers.ValidationError(
                f"Unsupported schema_version {value!r}: this server accepts {SCHEMA_MAJOR}.x "
                f"(current {SCHEMA_VERSION})."
            )
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # Events are read only once the version is known to be one this server understands.
        events, errors = [], {}
        for index, raw in enumerate(attrs["events"]):
            event, error = validate_event(raw)
            if error is not None:
                errors[index] = error
            else:
                events.append(event)
        if errors:
            raise serializers.ValidationError({"events": errors})
        return {**attrs, "events": events}
