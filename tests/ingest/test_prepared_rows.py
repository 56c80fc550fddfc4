"""The values sql.insert_rows writes for unsaved instances (pipeline.ingest.write.sql._prepared):
each field's attribute value through that field's preparer, in the model's column order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import connection

from pipeline.ingest.write import sql
from pipeline.ingest.write.store import store_spans
from pipeline.models import LLMCall, ToolCall
from tests.ingest.test_otlp_store import agent_trace

pytestmark = pytest.mark.django_db

AT = datetime(2025, 11, 22, 8, 30, 5, 123, tzinfo=UTC)


def _row_by_row(model, rows) -> tuple[list[str], list[list]]:
    """What _prepared gives, the plain way: read each attribute, prepare it as its field says."""
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    prepare = sql.Prepare()
    preparers = [prepare.for_field(f) for f in fields]
    return [f.column for f in fields], [
        [prep(getattr(row, f.attname)) if prep else getattr(row, f.attname) for f, prep in zip(fields, preparers)]
        for row in rows
    ]


def _typed(prepared) -> tuple[list[str], list[list[tuple[str, object]]]]:
    names, rows = prepared
    # PostgreSQL's JSON parameters are psycopg Jsonb wrappers, equal only to themselves: compare what they wrap
    return names, [[(type(v).__name__, getattr(v, "obj", v)) for v in row] for row in rows]


def test_unsaved_rows_are_prepared_as_each_field_prepares_its_value():
    make = sql.row_maker(ToolCall)
    rows = [
        make(trace_id="a" * 32, span_id="b" * 16, conversation_id=3, round_id=7, llm_call_id=11, started_at=AT,
             ended_at=AT.astimezone(timezone(timedelta(hours=2))), tool_name="search", arguments={"q": "é", "n": [1]},
             observation_tokens=2**40, retry_count=-1, success=True, context_tokens=-(2**70), duration_ms=1.5),
        make(trace_id="a" * 32, span_id="c" * 16, conversation_id=3, round_id=7, tool_name="x", arguments={1: "k"}),
        ToolCall(trace_id="a" * 32, span_id="d" * 16, conversation_id=4, round_id=8, started_at=None),
    ]
    names, params = sql._prepared(ToolCall, rows)
    assert _typed((names, params)) == _typed(_row_by_row(ToolCall, rows))
    first = dict(zip(names, params[0]))  # the clamps and the datetime text the row-by-row reference also gives
    assert first["observation_tokens"] == 2**31 - 1 and first["context_tokens"] == -(2**63)
    assert first["retry_count"] == 0 and first["llm_call_id"] == 11
    if connection.vendor == "sqlite":  # SQLite's datetimes are written as UTC text; PostgreSQL takes them as they are
        assert first["started_at"] == "2025-11-22 08:30:05.000123" == first["ended_at"]


def test_a_deferred_value_is_loaded_as_reading_the_attribute_loads_it():
    store_spans(agent_trace())
    for model in (LLMCall, ToolCall):
        stored = list(model.objects.only("id", "trace_id").order_by("id"))
        assert stored and "span_id" in stored[0].get_deferred_fields()
        expected = _typed(_row_by_row(model, list(model.objects.order_by("id"))))
        assert _typed(sql._prepared(model, stored)) == expected
