"""add_contribution puts into (and takes out of) a bucket the figures of each call: the figures
are pinned here, and adding a call's own contribution (the read path) gives the same."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipeline.rollups import sketch
from pipeline.rollups.figures import COMPRESSION, MODEL, TOOL, Figures, add_contribution, contribution

AT = datetime(2025, 11, 22, 8, 30, 12, tzinfo=UTC)
ROWS = {
    TOOL: [
        {"tool_name": "search", "started_at": AT, "duration_ms": 120.5, "success": True, "error_type": "",
         "retry_count": 1, "cache_hit": True, "observation_tokens": 300, "input_tokens": 20, "context_tokens": 300,
         "context_carries": 2, "context_cost_usd": "0.000125", "tokens_at_level": {"brief": 10, "standard": 90, "full": 300}},
        {"tool_name": "search", "started_at": AT, "duration_ms": None, "success": False, "error_type": "TimeoutError",
         "retry_count": 0, "cache_hit": False, "observation_tokens": None, "input_tokens": 0, "context_tokens": None,
         "context_carries": None, "context_cost_usd": None, "tokens_at_level": {}},
    ],
    MODEL: [
        {"model": "gpt-4o", "started_at": AT, "duration_ms": 900.0, "status": "ok", "error_type": "", "input_tokens": 1200,
         "output_tokens": 80, "cache_read_tokens": 100, "cache_write_tokens": 0, "reasoning_tokens": 5,
         "cost_usd": "0.0042"},
        {"model": "gpt-4o", "started_at": AT, "duration_ms": 0.0, "status": "error", "error_type": "RateLimitError",
         "input_tokens": None, "output_tokens": None, "cache_read_tokens": None, "cache_write_tokens": None,
         "reasoning_tokens": None, "cost_usd": None},
    ],
    COMPRESSION: [{"strategy": "truncate", "occurred_at": AT, "tokens_before": 9000, "tokens_after": 3000}],
}


# What the rows of each kind add up to, worked out by hand from ROWS.
EXPECTED = {
    TOOL: {"calls": 2, "sums": {
        "duration_n": 1, "duration_ms": 120.5, "retry_count": 1, "observation_tokens": 300, "input_tokens": 20,
        "context_tokens": 300, "context_carries": 2, "successes": 1, "cache_hits": 1, "context_cost_usd": "0.000125",
        "context_priced": 1, "level_calls": 1, "level_carried": 600, "at_brief": 10, "carried_brief": 20,
        "at_standard": 90, "carried_standard": 180, "at_full": 300, "carried_full": 600},
        "errors": {"TimeoutError": 1}, "latency": {sketch.bucket_of(120.5): 1}},
    MODEL: {"calls": 2, "sums": {
        "duration_n": 2, "duration_ms": 900.0, "input_tokens": 1200, "output_tokens": 80, "cache_read_tokens": 100,
        "reasoning_tokens": 5, "cost_usd": "0.0042", "priced": 1},
        "errors": {"RateLimitError": 1}, "latency": {sketch.bucket_of(900.0): 1, sketch.bucket_of(0.0): 1}},
    COMPRESSION: {"calls": 1, "sums": {"tokens_before": 9000, "tokens_after": 3000}, "errors": {}, "latency": {}},
}


@pytest.mark.parametrize("kind", ROWS)
def test_adding_a_calls_figures_in_place_equals_adding_its_contribution(kind):
    by_contribution, in_place = Figures(), Figures()
    for sign in (1, 1, -1):  # in twice, then one taken out again
        for row in ROWS[kind]:
            by_contribution.add(contribution(kind, row)[2], sign)
            add_contribution(kind, row, in_place, sign)
            assert in_place == by_contribution
    assert in_place.stored() == by_contribution.stored() == EXPECTED[kind]
