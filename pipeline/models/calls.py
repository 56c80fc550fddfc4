"""LLM calls and tool calls: one row per span, with the figures the dashboard aggregates in columns."""

from __future__ import annotations

from django.db import models

from pipeline.models.conversations import Conversation, Round, usd_field
from pipeline.runtime.errors import ToolErrorType


class SpanRecordMixin(models.Model):
    """Identity and timing shared by rows that come from one span."""

    trace_id = models.CharField(max_length=32)
    span_id = models.CharField(max_length=16)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    status = models.CharField(max_length=16, default="ok")
    error_type = models.CharField(max_length=255, blank=True)
    error_message = models.TextField(blank=True)

    class Meta:
        abstract = True


class LLMCall(SpanRecordMixin):
    # Found by (conversation, started_at) (an index of its own would be a shorter duplicate that
    # PostgreSQL's planner picks for a conversation's time window, then filters every call of it).
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="llm_calls", db_index=False)
    # Found by (round, started_at), likewise.
    round = models.ForeignKey(Round, on_delete=models.CASCADE, null=True, blank=True, related_name="llm_calls",
                              db_index=False)
    step = models.PositiveIntegerField(default=0)  # order inside the round
    model = models.CharField(max_length=255, blank=True)
    request_model = models.CharField(max_length=255, blank=True)
    response_model = models.CharField(max_length=255, blank=True)
    provider = models.CharField(max_length=255, blank=True)
    operation = models.CharField(max_length=64, default="chat")
    input_tokens = models.IntegerField(default=0)
    output_tokens = models.IntegerField(default=0)
    total_tokens = models.IntegerField(default=0)
    cache_read_tokens = models.IntegerField(default=0)
    cache_write_tokens = models.IntegerField(default=0)
    reasoning_tokens = models.IntegerField(default=0)
    # What the call cost in USD (pipeline.insight.costs), from the token counts above and the price
    # at `started_at`; null when no price is known for the model ("no price", never 0). Kept
    # whenever the counts change: at ingest, after deferred counting, when logs rebuild the call.
    cost_usd = usd_field()
    # The model's maximum context, and what filled it: {"system": n, "skills": n, "user": n,
    # "assistant": n, "tool_observations": n, "compressed_summaries": n, "free": n}.
    context_window = models.IntegerField(null=True, blank=True)
    context_tokens = models.IntegerField(null=True, blank=True)
    context_composition = models.JSONField(default=dict, blank=True)
    input_messages = models.JSONField(default=list, blank=True)
    output_messages = models.JSONField(default=list, blank=True)
    # Per-message fingerprints of both, for diffs and findings without loading the messages
    # (pipeline.ingest.normalise.digest).
    input_digest = models.JSONField(default=list, blank=True)
    output_digest = models.JSONField(default=list, blank=True)
    finish_reason = models.CharField(max_length=64, blank=True)
    # Token counts still to compute after the ingest response (see pipeline.ingest.write.deferred).
    tokens_pending = models.BooleanField(default=False)
    # Counted by ctxlens from text too long to tokenise whole: the head exactly, the rest by its rate.
    tokens_estimated = models.BooleanField(default=False)
    # Counted with a tokenizer that only approximates the model's (no public one): shown as "≈".
    tokens_approximate = models.BooleanField(default=False)

    class Meta:
        ordering = ["started_at"]
        constraints = [models.UniqueConstraint(fields=["trace_id", "span_id"], name="llmcall_unique_span")]
        indexes = [
            models.Index(fields=["id"], condition=models.Q(tokens_pending=True), name="llm_tokens_pending_idx"),
            models.Index(fields=["conversation", "started_at"], name="llm_conv_started_idx"),
            # A conversation's totals (the detail API) from the index alone: cost_usd sits past the
            # messages and digests in each row, so reading it from the rows walks their overflow pages.
            models.Index(fields=["conversation", "input_tokens", "output_tokens", "status", "cost_usd"],
                         name="llm_conv_totals_idx"),
            models.Index(fields=["started_at"], name="llm_started_idx"),
            models.Index(fields=["model", "started_at"], name="llm_model_started_idx"),
            # a round's calls from a point in time on, and the one just before (ingest's linking)
            models.Index(fields=["round", "started_at"], name="llm_round_started_idx"),
            # The dashboard's "recent errors": the latest failed calls without walking every call.
            models.Index(fields=["-started_at"], condition=models.Q(status="error"), name="llm_error_started_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.model or 'llm'} {self.span_id}"


class ToolCall(SpanRecordMixin):
    # Found by (conversation, started_at) (an index of its own would be a shorter duplicate that
    # PostgreSQL's planner picks for a conversation's time window, then filters every call of it).
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="tool_calls", db_index=False)
    # Found by (round, started_at), likewise (tool_unowned_idx holds only the unowned tools).
    round = models.ForeignKey(Round, on_delete=models.CASCADE, null=True, blank=True, related_name="tool_calls",
                              db_index=False)
    llm_call = models.ForeignKey(
        LLMCall, on_delete=models.SET_NULL, null=True, blank=True, related_name="tool_calls"
    )
    tool_name = models.CharField(max_length=255)
    # Looked up only inside a conversation (tool_conv_call_id_idx) or a round, never on its own.
    tool_call_id = models.CharField(max_length=255, blank=True)
    arguments = models.JSONField(default=dict, blank=True)
    observation = models.TextField(blank=True)
    observation_tokens = models.IntegerField(default=0)
    input_tokens = models.IntegerField(default=0)  # the arguments' tokens, when the span says (tool.input_tokens)
    output_level = models.CharField(max_length=16, blank=True)
    success = models.BooleanField(default=True)
    error_code = models.CharField(max_length=64, blank=True)
    retry_count = models.PositiveIntegerField(default=0)
    cache_hit = models.BooleanField(default=False)  # answered from the tool-result cache, the tool did not run
    artifact = models.ForeignKey(
        "pipeline.Artifact", on_delete=models.SET_NULL, null=True, blank=True, related_name="tool_calls"
    )
    tokens_pending = models.BooleanField(default=False)  # observation_tokens still to count
    tokens_estimated = models.BooleanField(default=False)  # observation_tokens estimated past the exact cap
    tokens_approximate = models.BooleanField(default=False)  # counted with an approximating tokenizer: "≈"
    # observation_tokens as the span reported them: kept whichever LLM call the tool is linked to
    tokens_reported = models.BooleanField(default=False)
    # What the observation cost the context: its tokens summed over the later LLM calls whose
    # input carried it, how many did, and those tokens priced per call (None: no call priced).
    # Kept at ingest from pipeline.models.carries (pipeline.ingest.write.tool_context).
    context_tokens = models.BigIntegerField(default=0)  # a large result carried many times outgrows 2**31
    context_carries = models.IntegerField(default=0)
    context_cost_usd = models.DecimalField(max_digits=24, decimal_places=12, null=True, blank=True)
    # The observation's tokens at each output level, {"brief": n, "standard": n, "full": n}, from
    # the full result (a full observation or the artifact), counted after the response while
    # `levels_pending` (pipeline.ingest.write.tool_levels); {} when the result could not be
    # read, None for calls without a full result.
    tokens_at_level = models.JSONField(null=True, blank=True)
    levels_pending = models.BooleanField(default=False)

    class Meta:
        ordering = ["started_at"]
        constraints = [models.UniqueConstraint(fields=["trace_id", "span_id"], name="toolcall_unique_span")]
        indexes = [
            models.Index(fields=["id"], condition=models.Q(tokens_pending=True), name="tool_tokens_pending_idx"),
            models.Index(fields=["id"], condition=models.Q(levels_pending=True), name="tool_levels_pending_idx"),
            models.Index(fields=["tool_name", "started_at"], name="tool_name_started_idx"),
            models.Index(fields=["started_at"], name="tool_started_idx"),
            models.Index(fields=["conversation", "started_at"], name="tool_conv_started_idx"),
            # a result's tool calls, found by the calls that carried it (pipeline.ingest.write.tool_context)
            models.Index(fields=["conversation", "tool_call_id"], name="tool_conv_call_id_idx"),
            # ingest's linking: a round's tools from a point in time on, and those no call owns yet
            models.Index(fields=["round", "started_at"], name="tool_round_started_idx"),
            models.Index(fields=["round"], condition=models.Q(llm_call__isnull=True), name="tool_unowned_idx"),
            # a conversation's retried calls, counted on every batch without reading its other tools
            models.Index(fields=["conversation"], condition=models.Q(retry_count__gt=0), name="tool_retried_idx"),
            models.Index(fields=["-started_at"], condition=models.Q(success=False), name="tool_failed_started_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} {self.tool_call_id or self.span_id}"

    @property
    def error_class(self) -> str:
        """retryable | permanent | needs_human for a known error type (old names too), else ""."""
        error_type = ToolErrorType.parse(self.error_type)
        return error_type.error_class.value if error_type else ""


class ToolRequest(models.Model):
    """A tool call an LLM call's output asks for (a tool_call part with an id), one row each.

    Ingest links each tool call to the LLM call that requested it; this index finds that call by
    (round, tool_call_id) or (round, tool name) without reading the round's output messages.
    Written with the call, rewritten when logs rebuild its messages (pipeline.ingest.write.linking).
    """

    llm_call = models.ForeignKey(LLMCall, on_delete=models.CASCADE, related_name="tool_requests")
    round = models.ForeignKey(Round, on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    tool_call_id = models.CharField(max_length=255)
    name = models.CharField(max_length=255, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["round", "tool_call_id"], name="toolrequest_round_id_idx"),
            models.Index(fields=["round", "name"], name="toolrequest_round_name_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.tool_call_id}"
