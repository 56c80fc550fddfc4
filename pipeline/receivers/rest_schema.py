"""The ingest request as OpenAPI documents it: `events` is a list of event objects told apart by `type`.

Validation is `pipeline.ingest.decode.rest_schema.IngestRequestSerializer`; this serializer only describes it.
"""

from __future__ import annotations

from drf_spectacular.utils import PolymorphicProxySerializer
from rest_framework import serializers

from pipeline.ingest.decode.rest_schema import EVENT_SERIALIZERS, MAX_EVENTS, SCHEMA_MAJOR, SCHEMA_VERSION

IngestEvent = PolymorphicProxySerializer(
    component_name="IngestEvent",
    serializers={kind: serializer_class for kind, serializer_class in EVENT_SERIALIZERS.items()},
    resource_type_field_name="type",
    many=True,
)


class IngestRequestDoc(serializers.Serializer):
    schema_version = serializers.CharField(
        help_text=f"'{SCHEMA_VERSION}'. Any {SCHEMA_MAJOR}.x is read; another major version is refused with 400."
    )
    events = IngestEvent

    class Meta:
        ref_name = "IngestRequest"


IngestRequestDoc.__doc__ = f"Up to {MAX_EVENTS} events per request, stored in one transaction."

INGEST_EXAMPLE = {
    "schema_version": SCHEMA_VERSION,
    "events": [
        {"type": "conversation", "conversation_id": "support-42", "agent_name": "support-bot",
         "user_id": "u-7", "service_name": "helpdesk"},
        {"type": "round_start", "conversation_id": "support-42", "round_id": "turn-1",
         "timestamp": "2026-05-01T12:00:00Z", "user_message": "Where is my order 1234?"},
        {"type": "llm_call", "conversation_id": "support-42", "round_id": "turn-1", "call_id": "llm-1",
         "model": "gpt-4o", "started_at": "2026-05-01T12:00:00.100Z", "duration_ms": 850,
         "input_tokens": 1200, "output_tokens": 40, "context_window": 128000,
         "input_messages": [{"role": "system", "content": "You are a support agent."},
                            {"role": "user", "content": "Where is my order 1234?"}],
         "output_messages": [{"role": "assistant", "tool_calls": [
             {"id": "call_abc", "name": "order_status", "arguments": {"order": "1234"}}]}]},
        {"type": "tool_call", "conversation_id": "support-42", "round_id": "turn-1", "tool_name": "order_status",
         "tool_call_id": "call_abc", "arguments": {"order": "1234"}, "observation": "Shipped on 30 April.",
         "started_at": "2026-05-01T12:00:01Z", "duration_ms": 120, "output_level": "standard"},
        {"type": "round_end", "conversation_id": "support-42", "round_id": "turn-1",
         "timestamp": "2026-05-01T12:00:02Z", "final_answer": "It shipped on 30 April.", "status": "ok"},
    ],
}
