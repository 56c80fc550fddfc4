"""On PostgreSQL, the ingest's bulk statements bind their values on the server
(pipeline.ingest.write.sql.executemany) and stay Django statements: the same rows stored, errors
translated for the store's retries, statements logged."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models import JSONField
from django.test.utils import CaptureQueriesContext

from pipeline.ingest.write import sql
from pipeline.ingest.write.rows import SPAN_COLUMNS
from pipeline.ingest.write.store import store_spans
from pipeline.models import LLMCall, Span, ToolCall
from tests.ingest.test_precount import OBSERVATIONS, _chat, _tool

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="server-side binding is PostgreSQL's"),
]


def _batch(trace: str) -> list:
    return [_chat(trace, "00000000000000c1", 1, "gpt-4o", requested=["call_1"]),
            _tool(trace, "00000000000000d1", 3, OBSERVATIONS["short"], "call_1")]


def test_bulk_statements_send_their_values_apart_from_the_statement():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE bound (kind text)")
        cursor.execute("INSERT INTO bound VALUES (pg_typeof(%s)::text)", [7])
    sql.executemany("INSERT INTO bound VALUES (pg_typeof(%s)::text)", [[7], [2**40]])
    with connection.cursor() as cursor:
        cursor.execute("SELECT kind FROM bound ORDER BY 1")
        # Django's cursor writes 7 into the text, a literal integer; bound, it is psycopg's smallest fitting type
        assert [kind for (kind,) in cursor.fetchall()] == ["bigint", "integer", "smallint"]


def test_ingest_writes_its_rows_through_them_and_django_logs_each(monkeypatch):
    from django.db.backends.postgresql.base import ServerBindingCursor

    bound: list[str] = []
    real = ServerBindingCursor.executemany

    def recording(self, query, params_seq, **kwargs):
        bound.append(str(query))
        return real(self, query, params_seq, **kwargs)

    monkeypatch.setattr(ServerBindingCursor, "executemany", recording)
    with CaptureQueriesContext(connection) as queries:
        store_spans(_batch("5" * 32))
    for table in ("pipeline_span", "pipeline_llmcall", "pipeline_toolcall"):
        assert any(q.startswith(f'INSERT INTO "{table}"') for q in bound), table
    logged = [q["sql"] for q in queries.captured_queries]
    assert all(any(entry.endswith(q) and " times: " in entry for entry in logged) for q in bound)


def _stored(trace: str) -> list[list]:
    def values(model, exclude):
        names = [f.attname for f in model._meta.concrete_fields if f.attname not in exclude]
        return list(model.objects.filter(trace_id=trace).order_by("span_id").values_list(*names))

    keys = {"id", "trace_id", "conversation_id", "round_id", "llm_call_id", "received_at"}
    return [values(Span, keys), values(LLMCall, keys), values(ToolCall, keys)]


def test_the_rows_stored_are_those_djangos_own_cursor_stores(monkeypatch):
    store_spans(_batch("1" * 32))
    monkeypatch.setattr(sql, "_server_binding_cursor", connection.cursor)  # Django's default cursor
    store_spans(_batch("2" * 32))
    assert _stored("1" * 32) == _stored("2" * 32)
    assert all(_stored("1" * 32))


def test_a_refused_row_raises_djangos_integrity_error_for_the_store_to_retry():
    store_spans(_batch("6" * 32)[:1])
    names = SPAN_COLUMNS[:-2]  # but source and received_at
    row = Span.objects.filter(trace_id="6" * 32).values_list(*names).get()
    as_json = sql.Prepare().json
    prepared = [as_json(value) if isinstance(Span._meta.get_field(name), JSONField) else value
                for name, value in zip(names, row, strict=True)]
    with pytest.raises(IntegrityError) as refused, transaction.atomic():
        sql.executemany(f"INSERT INTO {sql.table(Span)} ({sql.columns(names)}, source, received_at) "
                        f"VALUES ({sql.marks(names)}, %s, now())", [[*prepared, "otlp"]])
    assert refused.value.__cause__.sqlstate == "23505"  # the unique (trace_id, span_id), not another refusal
