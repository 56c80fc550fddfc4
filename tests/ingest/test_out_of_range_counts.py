"""Counts no column holds, sent in JSON attributes: kept within 0..MAX_COUNT like every other count,
and an estimated cost no float holds dropped alone, not the span with it (a 400-digit integer
stored as sent broke the conversation, LLM call and compression pages for good)."""

from __future__ import annotations

import json

import pytest

from pipeline import semconv as sc
from pipeline.ingest.normalise.values import MAX_COUNT
from pipeline.ingest.records import SpanRecord
from pipeline.ingest.write.store import store_spans
from pipeline.models import CompressionEvent, LLMCall
from tests.genai_spans import MS, ROOT, T0, chat

pytestmark = pytest.mark.django_db

TRACE = "0c" * 16
HUGE = 10**400


def test_token_counts_by_category_are_kept_within_what_a_column_holds():
    call = chat(TRACE, "00000000000000c1", 1, "gpt-4o")
    call.attributes[sc.CONTEXT_COMPOSITION] = json.dumps({"user": HUGE, "system": -5, "assistant": 12})
    compression = SpanRecord(TRACE, "00000000000000c2", "compress_context", T0 + 2 * MS, T0 + 3 * MS,
                             parent_span_id=ROOT, attributes={
                                 sc.SPAN_KIND: sc.SPAN_KIND_COMPRESSION, sc.COMPRESSION_STRATEGY: "truncate",
                                 sc.COMPRESSION_TOKENS_BEFORE: 900, sc.COMPRESSION_TOKENS_AFTER: 300,
                                 sc.COMPRESSION_TOKENS_BEFORE_BY_CATEGORY: json.dumps({"user": HUGE, "system": 7}),
                                 sc.COMPRESSION_TOKENS_AFTER_BY_CATEGORY: json.dumps({"user": 2**70}),
                                 sc.COMPRESSION_ESTIMATED_COSTS: json.dumps({"truncate": HUGE, "summarize": 0.01}),
                             })

    result = store_spans([call, compression])

    assert (result.accepted, result.rejected) == (2, 0)
    assert LLMCall.objects.get().context_composition == {"user": MAX_COUNT, "system": 0, "assistant": 12}
    event = CompressionEvent.objects.get()
    assert event.tokens_before_by_category == {"user": MAX_COUNT, "system": 7}
    assert event.tokens_after_by_category == {"user": MAX_COUNT}
    assert event.estimated_costs == {"summarize": 0.01}


def test_numbers_no_json_column_holds_are_kept_as_text_not_refused_with_the_batch():
    """NaN, Infinity and 1e999 inside a JSON attribute: PostgreSQL's JSON columns refuse them, and
    with them every span of the request (SQLite stored them as null)."""
    call = chat(TRACE, "00000000000000c1", 1, "gpt-4o", requested=["call_1"])
    call.attributes[sc.CONTEXT_COMPOSITION] = '{"user": 1e999, "system": NaN, "assistant": 12}'
    call.attributes["gen_ai.input.messages"] = json.dumps([{"role": "user", "parts": [
        {"type": "tool_call", "id": "call_0", "name": "plot", "arguments": {"x": "NaN-placeholder", "y": 2.5}}]}]
    ).replace('"NaN-placeholder"', "-Infinity")
    other = chat(TRACE, "00000000000000c3", 5, "gpt-4o")

    assert store_spans([call, other]).accepted == 2

    stored = LLMCall.objects.get(span_id="00000000000000c1")
    assert stored.context_composition == {"user": "1e999", "system": "NaN", "assistant": 12}
    assert stored.input_messages[0]["parts"][0]["arguments"] == {"x": "-Infinity", "y": 2.5}
