"""Context compressions and skill activations, as they happened inside a conversation."""

from __future__ import annotations

from django.db import models

from pipeline.models.calls import LLMCall
from pipeline.models.conversations import Conversation, Round


class CompressionStrategy(models.TextChoices):
    TRUNCATE = "truncate", "Truncate"
    EXTRACT = "extract", "Extract"
    SUMMARIZE = "summarize", "Summarize"


class CompressionEvent(models.Model):
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="compressions")
    round = models.ForeignKey(Round, on_delete=models.CASCADE, null=True, blank=True, related_name="compressions")
    llm_call = models.ForeignKey(
        LLMCall, on_delete=models.SET_NULL, null=True, blank=True, related_name="compressions"
    )
    # Identity for idempotent ingest: the span that carried the event and the event's index on it.
    trace_id = models.CharField(max_length=32)
    span_id = models.CharField(max_length=16)
    seq = models.PositiveIntegerField(default=0)
    strategy = models.CharField(max_length=16, choices=CompressionStrategy.choices)
    occurred_at = models.DateTimeField()
    messages_before = models.PositiveIntegerField(default=0)
    messages_after = models.PositiveIntegerField(default=0)
    tokens_before = models.IntegerField(default=0)
    tokens_after = models.IntegerField(default=0)
    context_window = models.IntegerField(null=True, blank=True)
    tokens_before_by_category = models.JSONField(default=dict, blank=True)
    tokens_after_by_category = models.JSONField(default=dict, blank=True)
    before_messages = models.JSONField(default=list, blank=True)
    after_messages = models.JSONField(default=list, blank=True)
    # Indexes into before_messages of what was dropped and of what was folded into the summary.
    dropped = models.JSONField(default=list, blank=True)
    summarised = models.JSONField(default=list, blank=True)
    summary = models.TextField(blank=True)
    # The estimated USD of each strategy for this compression ({strategy: cost}), and why the
    # strategy was used: "configured", or the reason of the automatic choice.
    estimated_costs = models.JSONField(default=dict, blank=True)
    selection = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["occurred_at"]
        constraints = [
            models.UniqueConstraint(fields=["trace_id", "span_id", "seq"], name="compression_unique_span_seq")
        ]
        indexes = [
            models.Index(fields=["conversation", "occurred_at"], name="comp_conv_occurred_idx"),
            models.Index(fields=["occurred_at"], name="comp_occurred_idx"),
        ]

    @property
    def tokens_saved(self) -> int:
        return self.tokens_before - self.tokens_after

    def __str__(self) -> str:
        return f"{self.strategy} {self.tokens_before}->{self.tokens_after}"


class SkillActivation(models.Model):
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="skill_activations")
    round = models.ForeignKey(
        Round, on_delete=models.CASCADE, null=True, blank=True, related_name="skill_activations"
    )
    trace_id = models.CharField(max_length=32)
    span_id = models.CharField(max_length=16)
    seq = models.PositiveIntegerField(default=0)
    skill_name = models.CharField(max_length=255, db_index=True)
    load_level = models.PositiveSmallIntegerField(default=2)
    chain = models.JSONField(default=list, blank=True)  # the activation path, outermost first
    depth = models.PositiveSmallIntegerField(default=1)
    context_modifier = models.JSONField(default=dict, blank=True)
    tokens = models.IntegerField(default=0)
    resources = models.JSONField(default=list, blank=True)  # level 3: the resource files loaded
    # The injected messages: [{"kind", "visibility": "visible" | "hidden", "resource", "tokens", "content"}].
    messages = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=16, default="ok")
    error_message = models.TextField(blank=True)
    activated_at = models.DateTimeField()

    class Meta:
        ordering = ["activated_at"]
        constraints = [
            models.UniqueConstraint(fields=["trace_id", "span_id", "seq"], name="skill_unique_span_seq")
        ]

    def __str__(self) -> str:
        return f"{self.skill_name} (level {self.load_level})"
