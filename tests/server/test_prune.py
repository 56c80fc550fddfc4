"""`manage.py prune`: retention of conversations, spans and artifacts, in short batches."""

from __future__ import annotations

import datetime as dt
from io import StringIO

import pytest
import time_machine
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.db.models import signals
from django.test.utils import CaptureQueriesContext

from pipeline.artifacts.store import store_artifact
from pipeline.models import (
    Artifact,
    CompressionEvent,
    Conversation,
    LLMCall,
    Rollup,
    Round,
    SkillActivation,
    Span,
    SpanLog,
    ToolCall,
)
from pipeline.ingest.records import SpanRecord
from pipeline.ingest.write.store import store_spans
from pipeline import retention
from pipeline.retention import delete_in_batches, prune
from pipeline.rollups.compact import rebuild_rollups
from tests.genai_spans import MS, ROOT, T0, chat, tool
from tests.stored_rollups import rollup_rows

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.timezone.utc)
pytestmark = pytest.mark.django_db(transaction=True)


def make_conversation(name: str, last_activity: dt.datetime, spans: int = 3) -> Conversation:
    """A conversation with one row of every kind that belongs to it."""
    conv = Conversation.objects.create(
        external_id=name, started_at=last_activity - dt.timedelta(hours=1), last_activity_at=last_activity
    )
    trace = f"{abs(hash(name)):032x}"[-32:]
    rnd = Round.objects.create(conversation=conv, key=f"{trace}:root", trace_id=trace, started_at=last_activity)
    llm = LLMCall.objects.create(
        conversation=conv, round=rnd, trace_id=trace, span_id="a" * 16, started_at=last_activity, model="gpt-4o"
    )
    artifact = store_artifact(f"big output of {name}" * 100, conversation=conv, ttl_hours=24 * 365)
    ToolCall.objects.create(
        conversation=conv, round=rnd, llm_call=llm, trace_id=trace, span_id="b" * 16,
        started_at=last_activity, tool_name="search", artifact=artifact,
    )
    CompressionEvent.objects.create(
        conversation=conv, round=rnd, llm_call=llm, trace_id=trace, span_id="c" * 16,
        strategy="truncate", occurred_at=last_activity,
    )
    SkillActivation.objects.create(
        conversation=conv, round=rnd, trace_id=trace, span_id="d" * 16, skill_name="pdf", activated_at=last_activity
    )
    for n in range(spans):
        make_span(trace, n, last_activity, conv)
    return conv


def make_span(trace: str, n: int, start: dt.datetime, conversation: Conversation | None = None) -> Span:
    return Span.objects.create(
        trace_id=trace, span_id=f"{n + 1:016x}", name=f"span {n}", start_time=start,
        start_time_unix_nano=int(start.timestamp() * 1e9), conversation=conversation,
    )


def run_prune(*args: str) -> str:
    out = StringIO()
    call_command("prune", *args, stdout=out)
    return out.getvalue()


@time_machine.travel(NOW, tick=False)
def test_it_deletes_old_conversations_with_every_row_and_artifact_file(artifact_dir, settings):
    settings.CTXLENS_RETENTION_DAYS = 30
    old = make_conversation("old", NOW - dt.timedelta(days=31))
    artifact_file = artifact_dir / Artifact.objects.get(conversation=old).artifact_id
    assert artifact_file.exists()

    out = run_prune()

    assert not Conversation.objects.filter(pk=old.pk).exists()
    for model in (Round, LLMCall, ToolCall, CompressionEvent, SkillActivation, Span, Artifact):
        assert model.objects.count() == 0, model.__name__
    assert not artifact_file.exists()
    assert out.count("\n") == 1
    assert out.startswith("prune: deleted 1 conversations, 3 spans, 1 artifacts and 5 other rows older than 2026-05-02")


@time_machine.travel(NOW, tick=False)
def test_it_keeps_recent_conversations_even_with_old_spans(artifact_dir, settings):
    settings.CTXLENS_RETENTION_DAYS = 30
    recent = make_conversation("recent", NOW - dt.timedelta(days=2))
    # A long-running conversation: its first span is older than the retention, its last activity is not.
    make_span("f" * 32, 99, NOW - dt.timedelta(days=90), recent)

    out = run_prune()

    assert Conversation.objects.filter(pk=recent.pk).exists()
    assert Span.objects.filter(conversation=recent).count() == 4
    assert ToolCall.objects.count() == 1 and Artifact.objects.count() == 1
    assert "deleted 0 conversations, 0 spans, 0 artifacts" in out


@time_machine.travel(NOW, tick=False)
def test_it_deletes_old_orphan_spans_and_expired_artifacts(artifact_dir):
    old_orphan = make_span("1" * 32, 0, NOW - dt.timedelta(days=40))
    new_orphan = make_span("2" * 32, 0, NOW - dt.timedelta(days=1))
    with time_machine.travel(NOW - dt.timedelta(days=2), tick=False):
        expired = store_artifact("expired output", ttl_hours=24)
    live = store_artifact("live output", ttl_hours=72)

    out = run_prune("--days", "30")

    assert not Span.objects.filter(pk=old_orphan.pk).exists()
    assert Span.objects.filter(pk=new_orphan.pk).exists()
    assert list(Artifact.objects.values_list("pk", flat=True)) == [live.pk]
    assert not (artifact_dir / expired.artifact_id).exists()
    assert (artifact_dir / live.artifact_id).exists()
    assert "1 spans, 1 artifacts" in out


def test_it_deletes_log_records_received_before_the_cutoff(db):
    with time_machine.travel(NOW - dt.timedelta(days=45), tick=False):
        SpanLog.objects.create(trace_id="5" * 32, event_name="gen_ai.user.message", digest="old")
    with time_machine.travel(NOW - dt.timedelta(days=3), tick=False):
        SpanLog.objects.create(trace_id="6" * 32, event_name="gen_ai.user.message", digest="new")

    with time_machine.travel(NOW, tick=False):
        out = run_prune("--days", "30")

    assert list(SpanLog.objects.values_list("digest", flat=True)) == ["new"]
    assert "and 1 other rows" in out


@time_machine.travel(NOW, tick=False)
def test_days_override_the_setting(artifact_dir, settings):
    settings.CTXLENS_RETENTION_DAYS = 365
    make_conversation("ten-days", NOW - dt.timedelta(days=10))
    make_conversation("one-day", NOW - dt.timedelta(days=1))

    assert "deleted 0 conversations" in run_prune()
    assert "deleted 1 conversations" in run_prune("--days", "7")
    assert list(Conversation.objects.values_list("external_id", flat=True)) == ["one-day"]


@time_machine.travel(NOW, tick=False)
def test_dry_run_counts_and_deletes_nothing(artifact_dir):
    make_conversation("old", NOW - dt.timedelta(days=60), spans=4)
    make_span("3" * 32, 0, NOW - dt.timedelta(days=60))

    out = run_prune("--days", "30", "--dry-run")

    assert out.startswith("prune: would delete 1 conversations, 5 spans, 1 artifacts and 5 other rows")
    assert Conversation.objects.count() == 1 and Span.objects.count() == 5 and Artifact.objects.count() == 1


@time_machine.travel(NOW, tick=False)
def test_it_deletes_in_batches_of_the_given_size(artifact_dir):
    big = make_conversation("big", NOW - dt.timedelta(days=60), spans=25)
    for trace in "6789":
        for n in range(5):
            make_span(trace * 32, n, NOW - dt.timedelta(days=60), big)
    for n in range(7):
        make_span("4" * 32, n, NOW - dt.timedelta(days=60))

    result = prune(30, batch_size=10)

    assert Span.objects.count() == 0 and Conversation.objects.count() == 0
    assert result.spans == 52
    # A trace goes whole with its rows: 25 spans in 1 batch, four traces of 5 in 2. Then 7 orphans
    # in 1, the rounds in 1, the artifacts in 1, the conversation in 1.
    assert result.batches == 3 + 1 + 1 + 1 + 1


@time_machine.travel(NOW, tick=False)
def test_a_batch_takes_at_most_so_many_traces_however_small(artifact_dir, monkeypatch):
    """A lock each on PostgreSQL: 50,000 one-span traces in one batch ran out of shared memory."""
    monkeypatch.setattr(retention, "MAX_TRACES_PER_BATCH", 2)
    many = make_conversation("many traces", NOW - dt.timedelta(days=60), spans=1)
    for trace in "6789":
        make_span(trace * 32, 0, NOW - dt.timedelta(days=60), many)

    by_model, batches = retention.delete_traces([many.pk], NOW - dt.timedelta(days=30), batch_size=1000)

    assert (by_model[Span], batches, Span.objects.count()) == (5, 3, 0)


@time_machine.travel(NOW, tick=False)
def test_it_rejects_a_retention_below_one_day(artifact_dir):
    with pytest.raises(CommandError, match="at least 1"):
        run_prune("--days", "0")


@time_machine.travel(NOW, tick=False)
def test_it_keeps_an_artifact_a_current_tool_call_still_uses(artifact_dir, settings):
    """Artifacts are content-addressed and keep their first owner: the same output in a later
    conversation links the old conversation's artifact, which must outlive its first owner."""
    settings.CTXLENS_RETENTION_DAYS = 30
    old = make_conversation("old", NOW - dt.timedelta(days=31))
    shared = Artifact.objects.get(conversation=old)
    current = make_conversation("current", NOW - dt.timedelta(days=1))
    call = ToolCall.objects.get(conversation=current)
    call.artifact = shared  # the same output again: the same artifact
    call.save()

    out = run_prune()

    assert not Conversation.objects.filter(pk=old.pk).exists()
    assert ToolCall.objects.get(pk=call.pk).artifact_id == shared.pk
    assert (artifact_dir / shared.artifact_id).exists()
    assert Artifact.objects.get(pk=shared.pk).conversation_id == current.pk  # handed to the conversation using it
    assert "deleted 1 conversations, 3 spans, 0 artifacts" in out

    with time_machine.travel(NOW + dt.timedelta(days=60), tick=False):  # once the user goes too, so does it
        run_prune()
    assert not Artifact.objects.exists() and not (artifact_dir / shared.artifact_id).exists()


@time_machine.travel(NOW, tick=False)  # recent calls: the rebuild keeps the minutes and hours of the recent past
def test_a_batch_of_rounds_takes_the_calls_it_cascades_to_out_of_the_rollups(artifact_dir):
    """Prune deletes a conversation's calls before its rounds, but a call ingested between the two
    (late, with a span that started long ago, so its conversation stays idle) goes with its round."""
    conversation = make_conversation("late call", NOW - dt.timedelta(minutes=1))
    assert Rollup.objects.filter(kind__in=["model", "tool", "compression"]).exists()

    deleted, _ = delete_in_batches(Round.objects.filter(conversation=conversation))

    assert deleted == 1
    assert not (LLMCall.objects.exists() or ToolCall.objects.exists() or CompressionEvent.objects.exists())
    assert not Rollup.objects.filter(kind__in=["model", "tool", "compression"]).exists()
    incremental = rollup_rows()
    rebuild_rollups()
    assert rollup_rows() == incremental


@time_machine.travel(NOW, tick=False)
def test_a_batch_of_spans_goes_in_one_delete_without_reading_them(artifact_dir):
    """Spans carry every attribute as sent (kilobytes each), and nothing cascades from them: a
    batch reads their ids and deletes them, never loads them."""
    for n in range(5):
        make_span("5" * 32, n, NOW - dt.timedelta(days=60))

    with CaptureQueriesContext(connection) as queries:
        deleted, batches = delete_in_batches(Span.objects.all(), batch_size=10)

    assert (deleted, batches, Span.objects.count()) == (5, 1, 0)
    span_reads = [q["sql"] for q in queries if q["sql"].startswith("SELECT") and '"pipeline_span"' in q["sql"]]
    assert span_reads and all('"pipeline_span"."attributes"' not in sql for sql in span_reads), span_reads
    assert sum(q["sql"].startswith("DELETE") for q in queries) == 1


@time_machine.travel(NOW, tick=False)
def test_batches_of_llm_calls_and_rounds_are_deleted_without_reading_their_text(artifact_dir):
    """An LLM call's messages and a round's user message and answer, which can be megabytes, are
    not read to be deleted: not in a batch of calls, nor of rounds, nor of what a round's delete
    cascades to (a late call, still there when its round goes)."""
    first = make_conversation("calls then rounds", NOW - dt.timedelta(days=60))
    late = make_conversation("a late call", NOW - dt.timedelta(days=60))
    LLMCall.objects.update(input_messages=[{"role": "user", "parts": [{"type": "text", "content": "x" * 10_000}]}])
    Round.objects.update(user_message="y" * 10_000, final_answer="z" * 10_000)

    with CaptureQueriesContext(connection) as queries:
        calls, _ = delete_in_batches(LLMCall.objects.filter(conversation=first))
        rounds, _ = delete_in_batches(Round.objects.filter(conversation__in=[first, late]))

    assert (calls, rounds) == (1, 2) and not LLMCall.objects.exists() and not Round.objects.exists()
    reads = [q["sql"] for q in queries if q["sql"].startswith("SELECT")]
    assert not [sql for sql in reads if any(column in sql for column in (
        '"input_messages"', '"output_messages"', '"user_message"', '"final_answer"'))], reads


def _turn(trace: str, start_ms: int = 0, at: int = T0) -> list[SpanRecord]:
    """A turn of the conversation "revived": its root, a chat asking for a tool, the tool."""
    root = SpanRecord(trace, ROOT, "invoke_agent", at + start_ms * MS, at + (start_ms + 9) * MS, attributes={
        "gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "revived"})
    call = chat(trace, "00000000000000c1", start_ms + 1, "gpt-4o", requested=["call_1"])
    call.start_time_unix_nano, call.end_time_unix_nano = at + (start_ms + 1) * MS, at + (start_ms + 2) * MS
    result = tool(trace, "00000000000000c2", start_ms + 3, "42", call_id="call_1")
    result.start_time_unix_nano, result.end_time_unix_nano = at + (start_ms + 3) * MS, at + (start_ms + 4) * MS
    return [root, call, result]


def _whole(trace: str) -> tuple[int, int, int]:
    return (Span.objects.filter(trace_id=trace).count(), LLMCall.objects.filter(trace_id=trace).count(),
            ToolCall.objects.filter(trace_id=trace).count())


@time_machine.travel(NOW, tick=False)
def test_a_conversation_revived_while_pruned_keeps_whole_traces_and_a_resend_restores_the_rest(db):
    """Each trace's spans go with the rows made from them: before, every call of the conversation
    went before any span, and a conversation revived in between kept spans without their calls,
    which a re-send could not make again (ingest keeps the first write of a span)."""
    old_a, old_b, new = "a1" * 16, "b1" * 16, "c1" * 16
    store_spans([*_turn(old_a), *_turn(old_b, 20)])
    revived = Conversation.objects.get(external_id="revived")
    now_ns = int(NOW.timestamp() * 1e9)

    def revive_after_the_first_batch(**_):
        signals.post_delete.disconnect(revive_after_the_first_batch, sender=Span)
        transaction.on_commit(lambda: store_spans(_turn(new, at=now_ns - 60_000 * MS)))

    signals.post_delete.connect(revive_after_the_first_batch, sender=Span, weak=False)
    try:
        prune(30, batch_size=3)
    finally:
        signals.post_delete.disconnect(revive_after_the_first_batch, sender=Span)

    assert Conversation.objects.filter(pk=revived.pk).exists()
    assert {trace: _whole(trace) for trace in (old_a, old_b, new)} == {
        old_a: (0, 0, 0), old_b: (3, 1, 1), new: (3, 1, 1)}

    assert store_spans(_turn(old_a)).accepted == 3  # the trace that went comes back whole
    assert _whole(old_a) == (3, 1, 1)
