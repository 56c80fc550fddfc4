"""The raw normalised span: everything that arrived, for the trace view and for re-export."""

from __future__ import annotations

from django.db import models

from pipeline.models.conversations import Conversation


class SpanKind(models.TextChoices):
    LLM = "llm", "LLM"
    TOOL = "tool", "Tool"
    AGENT = "agent", "Agent"
    CHAIN = "chain", "Chain"
    OTHER = "other", "Other"


class Span(models.Model):
    trace_id = models.CharField(max_length=32)
    span_id = models.CharField(max_length=16)
    parent_span_id = models.CharField(max_length=16, blank=True)
    name = models.CharField(max_length=1000)
    kind = models.CharField(max_length=16, choices=SpanKind.choices, default=SpanKind.OTHER)
    otel_kind = models.PositiveSmallIntegerField(default=0)  # OTLP Span.SpanKind
    status_code = models.PositiveSmallIntegerField(default=0)  # 0 unset, 1 ok, 2 error
    status_message = models.TextField(blank=True)
    start_time = models.DateTimeField()
    end_time = models.DateTimeField(null=True, blank=True)
    start_time_unix_nano = models.BigIntegerField(default=0)
    end_time_unix_nano = models.BigIntegerField(default=0)
    duration_ms = models.FloatField(null=True, blank=True)
    service_name = models.CharField(max_length=255, blank=True)
    scope_name = models.CharField(max_length=255, blank=True)
    scope_version = models.CharField(max_length=64, blank=True)
    # OTLP attributes flattened to {key: python value}; events as [{name, time_unix_nano, attributes}].
    attributes = models.JSONField(default=dict, blank=True)
    events = models.JSONField(default=list, blank=True)
    links = models.JSONField(default=list, blank=True)
    resource = models.JSONField(default=dict, blank=True)
    # Found by (conversation, start_time): an index of its own would only repeat its prefix.
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, null=True, blank=True, related_name="spans", db_index=False
    )
    source = models.CharField(max_length=16, default="otlp")  # otlp, rest, pipeline, grpc
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["start_time"]
        constraints = [models.UniqueConstraint(fields=["trace_id", "span_id"], name="span_unique_trace_span")]
        indexes = [
            models.Index(fields=["conversation", "start_time"], name="span_conv_start_idx"),
            models.Index(fields=["start_time"], name="span_start_idx"),
            models.Index(fields=["received_at"], name="span_received_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.trace_id}/{self.span_id}"


class SpanLog(models.Model):
    """An OTLP log record about a span (GenAI message events sent to /v1/logs).

    Kept so that messages reach their LLM call whichever of span and log arrives first.
    """

    trace_id = models.CharField(max_length=32, db_index=True)
    span_id = models.CharField(max_length=16, blank=True)
    time_unix_nano = models.BigIntegerField(default=0)
    event_name = models.CharField(max_length=255, blank=True)
    body = models.JSONField(null=True, blank=True)
    attributes = models.JSONField(default=dict, blank=True)
    digest = models.CharField(max_length=64, unique=True)  # of the record's content: re-sends are no-ops
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["time_unix_nano", "id"]

    def __str__(self) -> str:
        return f"{self.event_name} {self.trace_id}/{self.span_id}"
