"""A conversation (session or thread) and its rounds (one user turn of the ReAct loop)."""

from __future__ import annotations

from django.db import models


def usd_field() -> models.DecimalField:
    """A USD amount, or null for "no price". Decimal, not float: genai-prices computes in Decimal,
    and PostgreSQL keeps the column and its sums exact (SQLite holds 15 significant digits, which
    Django rounds back on reading). 12 places keep a single token at any listed rate exact (rates
    per million tokens carry at most 6 places); 30 digits leave room for sums of absurd counts."""
    return models.DecimalField(max_digits=30, decimal_places=12, null=True, blank=True)


class Status(models.TextChoices):
    RUNNING = "running", "Running"
    OK = "ok", "OK"
    ERROR = "error", "Error"


class Conversation(models.Model):
    # From gen_ai.conversation.id, session.id, traceloop session, the REST payload, or the trace id.
    external_id = models.CharField(max_length=255, unique=True)
    title = models.CharField(max_length=500, blank=True)
    # Set when a client named the conversation (REST `title`, ctxlens.conversation.title): the
    # title is then no longer taken from the first user message.
    title_explicit = models.BooleanField(default=False)
    agent_name = models.CharField(max_length=255, blank=True)
    user_id = models.CharField(max_length=255, blank=True)
    service_name = models.CharField(max_length=255, blank=True)
    model = models.CharField(max_length=255, blank=True, db_index=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING, db_index=True)
    started_at = models.DateTimeField()
    last_activity_at = models.DateTimeField()
    round_count = models.PositiveIntegerField(default=0)
    llm_call_count = models.PositiveIntegerField(default=0)
    tool_call_count = models.PositiveIntegerField(default=0)
    error_count = models.PositiveIntegerField(default=0)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    # Sum of its LLM calls' cost_usd (null when none has a price) and how many calls have no price:
    # with both, a page says "partly priced" rather than passing a partial sum off as the total.
    cost_usd = usd_field()
    unpriced_call_count = models.PositiveIntegerField(default=0)
    # The seeds' ConversationMetrics, re-aggregated with the counters above: context compressions,
    # skill activations (and distinct skills), tool calls that needed a retry, and messages in
    # the conversation's history (user messages, model replies, tool results).
    compression_count = models.PositiveIntegerField(default=0)
    skill_activation_count = models.PositiveIntegerField(default=0)
    unique_skill_count = models.PositiveIntegerField(default=0)
    retried_call_count = models.PositiveIntegerField(default=0)
    message_count = models.PositiveIntegerField(default=0)
    # What pipeline.insight.findings finds in the conversation, counted ({code: n}, and their sum)
    # for the list and the overview, which must not compute findings on every read. Refreshed
    # after the ingest that changed the conversation, off the request path
    # (pipeline.insight.finding_counts); `findings_stale` counts the changes since (0: current).
    finding_counts = models.JSONField(default=dict, blank=True)
    finding_count = models.PositiveIntegerField(default=0)
    findings_stale = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-last_activity_at"]
        indexes = [
            models.Index(fields=["-last_activity_at"], name="conv_last_activity_idx"),
            models.Index(fields=["started_at"], name="conv_started_idx"),
            models.Index(fields=["id"], condition=models.Q(findings_stale__gt=0), name="conv_findings_stale_idx"),
            # The overview's finding codes read the conversations with findings, not all of them.
            models.Index(fields=["finding_count", "last_activity_at"], condition=models.Q(finding_count__gt=0),
                         name="conv_with_findings_idx"),
        ]

    def __str__(self) -> str:
        return self.title or self.external_id


class Round(models.Model):
    # Found by (conversation, key) and (conversation, started_at): an index of its own would only
    # repeat their prefix.
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="rounds", db_index=False)
    # Identity of the turn inside its conversation: "<trace_id>:<root span id>" for OTLP, or the
    # round id a REST client sends.
    key = models.CharField(max_length=255)
    trace_id = models.CharField(max_length=32, blank=True, db_index=True)
    user_message = models.TextField(blank=True)
    final_answer = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    llm_call_count = models.PositiveIntegerField(default=0)
    tool_call_count = models.PositiveIntegerField(default=0)
    error_count = models.PositiveIntegerField(default=0)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cost_usd = usd_field()  # as on Conversation
    unpriced_call_count = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["conversation", "started_at"]
        constraints = [models.UniqueConstraint(fields=["conversation", "key"], name="round_unique_key")]
        indexes = [models.Index(fields=["conversation", "started_at"], name="round_conv_started_idx")]

    def __str__(self) -> str:
        return f"{self.conversation_id}/{self.key}"
