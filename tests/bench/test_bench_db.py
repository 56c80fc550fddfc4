"""bench/bench_db.py: the page benches' database on SQLite or PostgreSQL — bulk-loaded rows are
the ones the models read, ids continue after them, and the full-scan check reads real plans."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bench.bench_db import _select, bench_database, bulk_insert, full_scans, reproduce_prefix, reset_sequences
from pipeline.models import Conversation, ToolCall

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


@pytest.mark.django_db
def test_bulk_inserted_rows_read_back_and_new_ids_follow_them():
    bulk_insert(Conversation, [dict(id=7, external_id="c7", title="Seven", started_at=T0, last_activity_at=T0,
                                    finding_counts={"E1": 2})])
    bulk_insert(ToolCall, [dict(conversation_id=7, trace_id="t", span_id="s", tool_name="grep", started_at=T0,
                                arguments={"q": "x"}, success=True)])
    reset_sequences(Conversation, ToolCall)
    stored = Conversation.objects.get(pk=7)
    assert (stored.title, stored.started_at, stored.finding_counts) == ("Seven", T0, {"E1": 2})
    assert ToolCall.objects.get().arguments == {"q": "x"}
    assert Conversation.objects.create(external_id="next", started_at=T0, last_activity_at=T0).pk > 7


@pytest.mark.django_db
def test_a_whole_table_read_is_flagged_and_an_id_lookup_is_not():
    scans = full_scans([{"sql": "SELECT tool_name FROM pipeline_toolcall WHERE duration_ms > 5"},
                        {"sql": "SELECT tool_name FROM pipeline_toolcall WHERE id = 1"},
                        {"sql": "INSERT INTO nothing VALUES (1)"}])
    assert len(scans) == 1 and "duration_ms > 5" in scans[0]


def test_the_select_of_a_server_side_cursor_is_checked():
    declared = 'DECLARE "_django_curs_1" NO SCROLL CURSOR WITH HOLD FOR SELECT "x" FROM "pipeline_span"'
    assert _select(declared) == 'SELECT "x" FROM "pipeline_span"'
    assert _select("  SELECT 1") == "SELECT 1"
    assert _select("SAVEPOINT s1") is None


def test_without_a_postgres_url_the_bench_uses_a_sqlite_file(monkeypatch, tmp_path):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with bench_database(tmp_path) as url:
        assert url == f"sqlite:///{tmp_path / 'bench.sqlite3'}"
    assert reproduce_prefix() == ""


def test_the_printed_command_names_the_server_without_its_password(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://bench:secret@db.example:5432/postgres")
    assert reproduce_prefix() == "DATABASE_URL=postgres://bench@db.example:5432/postgres "
