"""Signals the pipeline sends. The dashboard listens; the pipeline never imports the dashboard."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from django.dispatch import Signal


class IngestChanges(TypedDict):
    """What one committed ingest request changed."""

    conversation_ids: list[int]  # conversations created or changed
    new_conversation_ids: list[int]
    round_ids: list[int]  # rounds created or changed
    llm_call_ids: list[int]  # new LLM calls
    tool_call_ids: list[int]  # new tool calls
    compression_ids: list[int]  # new compression events
    input_tokens: int  # token deltas of the new LLM calls
    output_tokens: int
    span_count: int  # new spans stored
    rows_removed: NotRequired[bool]  # rows were deleted or edited (the admin): pages reload what they show


def empty_changes() -> IngestChanges:
    return IngestChanges(
        conversation_ids=[], new_conversation_ids=[], round_ids=[], llm_call_ids=[], tool_call_ids=[],
        compression_ids=[], input_tokens=0, output_tokens=0, span_count=0, rows_removed=False,
    )


# Sent once after each ingest transaction commits, with `changes: IngestChanges`.
ingest_committed = Signal()
