"""Migration 0019 marks the tool calls stored before it whose spans reported their observation's
tokens, as ingest marks them now."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from pipeline.ingest.write.store import store_spans
from pipeline.models import ToolCall
from tests.ingest.test_precount import _chat, _tool

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_migration_marks_the_counts_spans_reported(settled):
    trace = "c" * 32
    reported = _tool(trace, "00000000000000d1", 5, "3 hits", "call_1")
    reported.attributes["ctxlens.tool.observation_tokens"] = 40
    seed = _tool(trace, "00000000000000d2", 6, "2 hits", "call_2")
    seed.attributes["tool.output_tokens"] = 30
    counted_here = _tool(trace, "00000000000000d3", 7, "1 hit", "call_3")
    # the same span id in another trace, its count not reported: its span is another one
    other = _tool("d" * 32, "00000000000000d1", 5, "0 hits", "call_4")
    store_spans([_chat(trace, "00000000000000c1", 1, "gpt-4o"), reported, seed, counted_here, other])
    marked = dict(ToolCall.objects.values_list("observation", "tokens_reported"))
    assert marked == {"3 hits": True, "2 hits": True, "1 hit": False, "0 hits": False}

    executor = MigrationExecutor(connection)
    migration = next(key for key in executor.loader.disk_migrations
                     if key[0] == "pipeline" and key[1].endswith("_tool_tokens_reported"))
    leaves = executor.loader.graph.leaf_nodes()
    try:
        executor.migrate([executor.loader.disk_migrations[migration].dependencies[0]])  # the column dropped
        executor = MigrationExecutor(connection)
        executor.migrate([migration])
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(leaves)  # the rest of the suite runs on the whole schema, whatever happened

    assert dict(ToolCall.objects.values_list("observation", "tokens_reported")) == marked
