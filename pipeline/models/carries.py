"""Which LLM calls carried which tool results: the ledger behind a tool call's context cost.

A tool result is re-sent with every later LLM call until it is dropped or compressed. One row
says that one LLM call's input carried the result answering one tool_call_id, and how many of
that call's input tokens it occupied (and what they cost). A tool call's `context_tokens`,
`context_carries` and `context_cost_usd` are the sums of the rows of its
(conversation, tool_call_id) (pipeline.ingest.write.tool_context keeps them), so a tool call
that arrives after the calls that carried it finds them by that key, without reading any
call's messages.
"""

from __future__ import annotations

from django.db import models

from pipeline.models.conversations import Conversation

COST_DIGITS = {"max_digits": 24, "decimal_places": 12}  # USD; a token of the cheapest models is ~1e-8


class ToolResultCarry(models.Model):
    # No index of its own: carry_conv_result_idx starts with it.
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="+", db_index=False)
    tool_call_id = models.CharField(max_length=255)
    # The carrying LLM call, by its span (which survives the call's row being replaced by a
    # finished version of its span) and its start (which says which of two tool calls that
    # share an id it carried).
    trace_id = models.CharField(max_length=32)
    span_id = models.CharField(max_length=16)
    started_at = models.DateTimeField()
    tokens = models.IntegerField()
    cost_usd = models.DecimalField(null=True, blank=True, **COST_DIGITS)  # None: the call's model has no price

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["trace_id", "span_id", "tool_call_id"], name="carry_unique_span_result"),
        ]
        indexes = [models.Index(fields=["conversation", "tool_call_id"], name="carry_conv_result_idx")]

    def __str__(self) -> str:
        return f"{self.tool_call_id} in {self.span_id}"
