"""On PostgreSQL, trace content that outgrows a row is compressed with LZ4 (migration 0018)."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.db import connection, models

from pipeline.ingest.records import SpanRecord
from pipeline.ingest.write.store import store_spans
from pipeline.models import Span, ToolCall

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="TOAST compression is PostgreSQL's"),
    pytest.mark.django_db,
]

T0 = 1_763_800_000_000_000_000
CONTENT_FIELDS = ("JSONField", "TextField")


def lz4_available() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")
        row = cursor.fetchone()
    return bool(row and row[0])


def stored_with(model: type[models.Model], column: str, pk: int) -> str | None:
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT pg_column_compression({quote(column)}) FROM {quote(model._meta.db_table)} "
                       "WHERE id = %s", [pk])
        return cursor.fetchone()[0]


def test_every_content_column_compresses_with_lz4():
    if not lz4_available():
        pytest.skip("this PostgreSQL was built without LZ4")
    content = {(m._meta.db_table, f.column) for m in apps.get_app_config("pipeline").get_models()
               for f in m._meta.concrete_fields if f.get_internal_type() in CONTENT_FIELDS}
    tables = sorted({table for table, _ in content})
    assert {"pipeline_span", "pipeline_llmcall", "pipeline_toolcall"} <= set(tables)
    with connection.cursor() as cursor:
        cursor.execute("SELECT c.relname, a.attname, a.attcompression FROM pg_attribute a "
                       "JOIN pg_class c ON c.oid = a.attrelid "
                       "WHERE c.oid = ANY(%s::regclass[]) AND a.attnum > 0 AND NOT a.attisdropped", [tables])
        method = {(table, column): compression for table, column, compression in cursor.fetchall()}
    assert {key: method[key] for key in content} == dict.fromkeys(content, "l")


def test_a_long_tool_observation_is_stored_lz4_compressed():
    if not lz4_available():
        pytest.skip("this PostgreSQL was built without LZ4")
    observation = "row 17: revenue grew 4 % over the quarter; " * 400  # 17 KB, compressible
    store_spans([SpanRecord("ab" * 16, "cd" * 8, "execute_tool sql", T0, T0 + 10**9, attributes={
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "sql", "gen_ai.tool.call.id": "call_1",
        "gen_ai.tool.call.result": observation})])
    span, call = Span.objects.get(), ToolCall.objects.get()
    assert call.observation == observation
    assert stored_with(Span, "attributes", span.pk) == "lz4"
    assert stored_with(ToolCall, "observation", call.pk) == "lz4"
