"""The cost migration prices the LLM calls stored before it and sums them up as ingest would."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from pipeline.models import Conversation, LLMCall, Round
from tests.insight.cost_support import ingest_client, llm_call, round_start, send

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def figures() -> dict[str, list[tuple]]:
    return {
        "calls": list(LLMCall.objects.order_by("pk").values_list("span_id", "cost_usd")),
        "rounds": list(Round.objects.order_by("pk").values_list("key", "cost_usd", "unpriced_call_count")),
        "conversations": list(Conversation.objects.order_by("pk").values_list(
            "external_id", "cost_usd", "unpriced_call_count")),
    }


def test_the_migration_prices_the_calls_stored_before_it():
    api = ingest_client()
    send(api, round_start("priced", "r1", T0),
         llm_call("priced", "r1", "c1", T0, "gpt-4o", provider="openai", input_tokens=4_000, cache_read_tokens=2_000,
                  output_tokens=100),
         llm_call("priced", "r1", "c2", T0 + timedelta(seconds=2), "no-such-model", input_tokens=10),
         round_start("priced", "r2", T0 + timedelta(minutes=1)),
         llm_call("priced", "r2", "c3", T0 + timedelta(minutes=1), "gpt-4o-mini", provider="openai",
                  input_tokens=10_000))
    send(api, llm_call("unpriced", "r1", "c1", T0, "no-such-model", input_tokens=10))
    after_ingest = figures()
    assert after_ingest["conversations"] == [("priced", Decimal("0.01"), 1), ("unpriced", None, 1)]

    executor = MigrationExecutor(connection)
    cost = next(key for key in executor.loader.disk_migrations if key[0] == "pipeline" and key[1].endswith("_cost"))
    leaves = executor.loader.graph.leaf_nodes()
    try:
        executor.migrate([executor.loader.disk_migrations[cost].dependencies[0]])  # back to before costs
        executor = MigrationExecutor(connection)
        executor.migrate([cost])
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(leaves)  # the rest of the suite runs on the whole schema, whatever happened

    assert figures() == after_ingest
