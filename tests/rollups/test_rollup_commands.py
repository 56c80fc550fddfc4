"""compact_rollups and rebuild_rollups as cron runs them, and their settings' checks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
import time_machine
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.urls import reverse

from pipeline.ingest.write.counters import recompute_counters
from pipeline.models import CompressionEvent, LLMCall, Rollup, Round, SkillActivation, ToolCall
from pipeline.rollups.compact import rebuild_rollups
from pipeline.rollups.track import collect_deletion
from pipeline.signals import ingest_committed
from tests.admin_forms import edit_in_the_admin
from tests.factories import make_conversation
from tests.stored_rollups import rollup_rows

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def at_now():
    """The rows are written at NOW: a rollup grain older than it is kept is not written at all."""
    with time_machine.travel(NOW, tick=False):
        yield


def tool_call(conversation, at: datetime, n: int) -> ToolCall:
    return ToolCall.objects.create(conversation=conversation, tool_name="search", trace_id=f"{n:032x}",
                                   span_id=f"{n:016x}", started_at=at, duration_ms=12.0)


def grains(kind: str = "tool") -> dict[str, int]:
    return {g: Rollup.objects.filter(kind=kind, grain=g).count() for g in "mhd"}


def conversations_counted() -> int:
    return sum(Rollup.objects.filter(kind="conversation", grain="d").values_list("calls", flat=True))


def test_compacting_drops_old_minutes_and_hours_and_keeps_the_days(settings):
    settings.CTXLENS_ROLLUP_MINUTE_HOURS, settings.CTXLENS_ROLLUP_HOUR_DAYS = 2, 3
    conversation = make_conversation()
    for n, ago in enumerate((timedelta(minutes=5), timedelta(hours=5), timedelta(days=10)), start=1):
        with time_machine.travel(NOW - ago, tick=False):  # each ingested as it happened
            tool_call(conversation, NOW - ago, n)
    assert grains() == {"m": 3, "h": 3, "d": 2}  # two of them on the same day
    out = StringIO()

    with time_machine.travel(NOW, tick=False):
        call_command("compact_rollups", stdout=out)

    assert grains() == {"m": 1, "h": 2, "d": 2}
    assert out.getvalue().startswith("compact_rollups: deleted 3 rollup rows")
    assert sum(Rollup.objects.filter(kind="tool", grain="d").values_list("calls", flat=True)) == 3


def test_a_call_older_than_a_grain_is_kept_is_written_to_the_grains_still_kept(settings):
    """A span that started days ago adds to its day only, as a rebuild would: minute and hour
    rows of old data, which no read takes, stayed until compaction deleted them."""
    settings.CTXLENS_ROLLUP_MINUTE_HOURS, settings.CTXLENS_ROLLUP_HOUR_DAYS = 2, 3
    conversation = make_conversation()
    for n, ago in enumerate((timedelta(minutes=5), timedelta(hours=5), timedelta(days=10)), start=1):
        tool_call(conversation, NOW - ago, n)

    assert grains() == {"m": 1, "h": 2, "d": 2}
    incremental = rollup_rows()
    rebuild_rollups()
    assert rollup_rows() == incremental


def test_rebuilding_restores_rollups_lost_to_a_manual_delete():
    conversation = make_conversation(last_activity_at=NOW - timedelta(minutes=2))
    with time_machine.travel(NOW, tick=False):
        tool_call(conversation, NOW - timedelta(minutes=1), 1)
        before = sorted(Rollup.objects.values_list("kind", "grain", "bucket_start", "calls", "latency"))
        Rollup.objects.all().delete()
        out = StringIO()
        call_command("rebuild_rollups", stdout=out)

    assert sorted(Rollup.objects.values_list("kind", "grain", "bucket_start", "calls", "latency")) == before
    assert grains("conversation") == grains("tool") == {"m": 1, "h": 1, "d": 1}
    assert out.getvalue().strip() == "rebuild_rollups: wrote 6 rollup rows"


@pytest.mark.parametrize(("name", "check_id"), [("CTXLENS_ROLLUP_MINUTE_HOURS", "pipeline.E080"),
                                                ("CTXLENS_ROLLUP_HOUR_DAYS", "pipeline.E081")])
def test_a_rollup_age_must_be_positive(settings, name, check_id):
    setattr(settings, name, 0)
    with pytest.raises(SystemCheckError, match=check_id):
        call_command("check")


def test_a_conversation_deleted_in_the_admin_takes_its_calls_out_of_the_rollups():
    kept, deleted = make_conversation("kept"), make_conversation("deleted")
    tool_call(kept, NOW, 1)
    tool_call(deleted, NOW, 2)
    tool_call(deleted, NOW, 3)

    assert conversations_counted() == 2

    deleted.delete()  # what the admin's delete action does: the calls go with the cascade

    assert set(Rollup.objects.filter(kind="tool").values_list("grain", "calls")) == {("m", 1), ("h", 1), ("d", 1)}
    assert conversations_counted() == 1


def test_rebuilding_one_kind_rebuilds_it_and_leaves_the_others():
    """What migration 0016 runs on a database that has conversations but no conversation rollups."""
    conversation = make_conversation(last_activity_at=NOW - timedelta(minutes=2))
    with time_machine.travel(NOW, tick=False):
        tool_call(conversation, NOW - timedelta(minutes=1), 1)
        before = sorted(Rollup.objects.values_list("kind", "grain", "bucket_start", "calls", "latency"))
        Rollup.objects.filter(kind="conversation").delete()
        Rollup.objects.filter(kind="tool", grain="m").update(calls=7)  # a tool row a rebuild of all kinds would fix

        assert rebuild_rollups(kinds=["conversation"]) == 3

    after = sorted(Rollup.objects.values_list("kind", "grain", "bucket_start", "calls", "latency"))
    assert [row for row in after if row[0] == "conversation"] == [row for row in before if row[0] == "conversation"]
    assert [row[3] for row in after if row[0] == "tool"] == [1, 1, 7]  # d, h, m: untouched


def test_saving_some_fields_of_a_stale_instance_counts_what_is_stored():
    with time_machine.travel(NOW, tick=False):
        conversation = make_conversation(last_activity_at=NOW - timedelta(hours=5))
        stale = type(conversation).objects.get(pk=conversation.pk)
        stale.last_activity_at = NOW - timedelta(hours=1)  # never written: only the title is saved
        stale.title = "Renamed"
        stale.save(update_fields=["title"])
        rebuilt = sorted(Rollup.objects.filter(kind="conversation").values_list("grain", "bucket_start", "calls"))
        Rollup.objects.all().delete()
        rebuild_rollups()

    assert conversations_counted() == 1
    assert sorted(Rollup.objects.filter(kind="conversation").values_list("grain", "bucket_start", "calls")) == rebuilt


def a_turn(conversation, key: str, at: datetime, n: int) -> Round:
    """A round with an LLM call, the tool it asked for (linked to the call) and a compression."""
    round_ = Round.objects.create(conversation=conversation, key=key, started_at=at)
    call = LLMCall.objects.create(conversation=conversation, round=round_, trace_id=f"{n:032x}", span_id=f"{n:016x}",
                                  started_at=at, duration_ms=800.0, model="gpt-4o", input_tokens=1000 + n,
                                  output_tokens=50)
    ToolCall.objects.create(conversation=conversation, round=round_, llm_call=call, tool_name="search",
                            trace_id=f"{n:032x}", span_id=f"{n + 1:016x}", started_at=at, duration_ms=12.0)
    CompressionEvent.objects.create(conversation=conversation, round=round_, trace_id=f"{n:032x}",
                                    span_id=f"{n + 2:016x}", strategy="truncate", occurred_at=at,
                                    tokens_before=900, tokens_after=300)
    recompute_counters({round_.pk}, {conversation.pk})  # what ingest keeps
    return round_


@pytest.mark.parametrize("how", ["delete page", "delete_selected action"])
@time_machine.travel(NOW, tick=False)  # the rebuild keeps minutes and hours of the recent past only
def test_a_round_deleted_in_the_admin_takes_its_calls_out_of_the_rollups(client, alice, how,
                                                                         django_capture_on_commit_callbacks):
    conversation = make_conversation()
    announced = []

    def receiver(changes, **kwargs):
        announced.append((changes["conversation_ids"], changes["rows_removed"]))

    kept, deleted = a_turn(conversation, "r1", NOW, 10), a_turn(conversation, "r2", NOW + timedelta(seconds=5), 20)
    with_both = rollup_rows()
    conversation.refresh_from_db()
    assert (conversation.round_count, conversation.llm_call_count, conversation.input_tokens) == (2, 2, 2030)
    client.force_login(alice)

    ingest_committed.connect(receiver)
    try:
        with django_capture_on_commit_callbacks() as after_commit:
            if how == "delete page":
                response = client.post(reverse("admin:pipeline_round_delete", args=[deleted.pk]), {"post": "yes"})
            else:
                response = client.post(reverse("admin:pipeline_round_changelist"),
                                       {"action": "delete_selected", "_selected_action": [deleted.pk], "post": "yes"})
        assert announced == []  # not before the delete commits
        for callback in after_commit:
            callback()
    finally:
        ingest_committed.disconnect(receiver)

    assert response.status_code == 302
    assert list(Round.objects.values_list("pk", flat=True)) == [kept.pk]
    assert LLMCall.objects.count() == ToolCall.objects.count() == CompressionEvent.objects.count() == 1
    incremental = rollup_rows()
    assert incremental != with_both
    rebuild_rollups()
    assert rollup_rows() == incremental  # what the rows left say, nothing of the deleted round
    conversation.refresh_from_db()
    assert (conversation.round_count, conversation.llm_call_count, conversation.tool_call_count,
            conversation.compression_count, conversation.input_tokens) == (1, 1, 1, 1, 1010)
    assert conversation.findings_stale
    assert announced == [([conversation.pk], True)]  # open pages reload what they show


@time_machine.travel(NOW, tick=False)
def test_an_llm_call_deleted_in_the_admin_leaves_the_rollups_and_its_tools_stay(client, alice):
    conversation = make_conversation()
    a_turn(conversation, "r1", NOW, 10)
    call = LLMCall.objects.get()
    client.force_login(alice)

    response = client.post(reverse("admin:pipeline_llmcall_delete", args=[call.pk]), {"post": "yes"})

    assert response.status_code == 302
    assert ToolCall.objects.get().llm_call_id is None  # SET_NULL: the tool stays, and in its rollups
    incremental = rollup_rows()
    assert not Rollup.objects.filter(kind="model").exists()
    rebuild_rollups()
    assert rollup_rows() == incremental
    round_ = Round.objects.get()
    assert (round_.llm_call_count, round_.tool_call_count, round_.input_tokens) == (0, 1, 0)


@time_machine.travel(NOW, tick=False)
def test_tool_calls_and_compressions_deleted_in_the_admin_leave_the_rollups(client, alice):
    conversation = make_conversation()
    a_turn(conversation, "r1", NOW, 10)
    a_turn(conversation, "r2", NOW + timedelta(seconds=5), 20)
    client.force_login(alice)

    for model in (ToolCall, CompressionEvent):
        response = client.post(reverse(f"admin:pipeline_{model._meta.model_name}_changelist"), {
            "action": "delete_selected", "_selected_action": list(model.objects.values_list("pk", flat=True)),
            "post": "yes"})
        assert response.status_code == 302

    assert not ToolCall.objects.exists() and not CompressionEvent.objects.exists()
    assert set(Rollup.objects.values_list("kind", flat=True)) == {"model", "conversation"}
    incremental = rollup_rows()
    rebuild_rollups()
    assert rollup_rows() == incremental
    conversation.refresh_from_db()
    assert (conversation.tool_call_count, conversation.compression_count, conversation.llm_call_count) == (0, 0, 2)


@pytest.mark.parametrize("how", ["delete page", "delete_selected action"])
def test_skill_activations_deleted_in_the_admin_leave_the_conversations_skill_counts(client, alice, how):
    conversation = make_conversation()
    pdf, docs, docs_again = (SkillActivation.objects.create(
        conversation=conversation, trace_id=f"{n:032x}", span_id=f"{n:016x}", skill_name=name, activated_at=NOW)
        for n, name in enumerate(("pdf", "docs", "docs"), start=1))
    recompute_counters(set(), {conversation.pk})  # what ingest keeps
    conversation.refresh_from_db()
    assert (conversation.skill_activation_count, conversation.unique_skill_count) == (3, 2)
    client.force_login(alice)

    if how == "delete page":
        response = client.post(reverse("admin:pipeline_skillactivation_delete", args=[pdf.pk]), {"post": "yes"})
    else:
        response = client.post(reverse("admin:pipeline_skillactivation_changelist"), {
            "action": "delete_selected", "_selected_action": [pdf.pk], "post": "yes"})

    assert response.status_code == 302
    assert sorted(SkillActivation.objects.values_list("pk", flat=True)) == [docs.pk, docs_again.pk]
    conversation.refresh_from_db()
    assert (conversation.skill_activation_count, conversation.unique_skill_count) == (2, 1)
    assert conversation.findings_stale


def test_an_llm_call_edited_in_the_admin_gives_its_round_and_conversation_its_new_tokens(
        client, alice, django_capture_on_commit_callbacks):
    conversation = make_conversation()
    a_turn(conversation, "r1", NOW, 10)
    edited = LLMCall.objects.get(round=a_turn(conversation, "r2", NOW + timedelta(seconds=5), 20))
    client.force_login(alice)
    announced = []

    def receiver(changes, **kwargs):
        announced.append((changes["conversation_ids"], changes["rows_removed"]))

    ingest_committed.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            edit_in_the_admin(client, edited, input_tokens=5000)
    finally:
        ingest_committed.disconnect(receiver)

    assert LLMCall.objects.get(pk=edited.pk).input_tokens == 5000
    assert Round.objects.get(pk=edited.round_id).input_tokens == 5000
    conversation.refresh_from_db()
    assert (conversation.round_count, conversation.llm_call_count, conversation.tool_call_count,
            conversation.input_tokens) == (2, 2, 2, 1010 + 5000)
    assert conversation.findings_stale
    assert announced == [([conversation.pk], True)]  # open pages reload: a figure may have gone down


@time_machine.travel(NOW, tick=False)  # the rebuild keeps minutes and hours of the recent past only
def test_an_llm_call_moved_to_another_model_and_minute_in_the_admin_moves_its_rollups(client, alice):
    conversation = make_conversation()
    a_turn(conversation, "r1", NOW - timedelta(minutes=3), 10)
    client.force_login(alice)

    edit_in_the_admin(client, LLMCall.objects.get(), model="gpt-4o-mini", started_at=NOW - timedelta(minutes=1))

    assert LLMCall.objects.get().started_at == NOW - timedelta(minutes=1)
    assert set(Rollup.objects.filter(kind="model").values_list("name", flat=True)) == {"gpt-4o-mini"}
    incremental = rollup_rows()
    rebuild_rollups()
    assert rollup_rows() == incremental


def test_an_admin_save_that_changes_nothing_writes_nothing(client, alice):
    conversation = make_conversation()
    a_turn(conversation, "r1", NOW + timedelta(microseconds=123456), 10)  # finer than the form's seconds
    conversation.refresh_from_db()
    assert not conversation.findings_stale
    rollups = list(Rollup.objects.order_by("pk").values_list("pk", "calls", "sums"))
    client.force_login(alice)

    edit_in_the_admin(client, LLMCall.objects.get())

    assert LLMCall.objects.get().started_at == NOW + timedelta(microseconds=123456)
    assert list(Rollup.objects.order_by("pk").values_list("pk", "calls", "sums")) == rollups
    conversation.refresh_from_db()
    assert not conversation.findings_stale


def test_a_tool_call_edited_to_failed_in_the_admin_counts_as_an_error(client, alice):
    conversation = make_conversation()
    round_ = a_turn(conversation, "r1", NOW, 10)
    round_.refresh_from_db()
    conversation.refresh_from_db()
    assert (round_.error_count, conversation.error_count, conversation.tool_call_count) == (0, 0, 1)
    client.force_login(alice)

    edit_in_the_admin(client, ToolCall.objects.get(), success=False)

    assert not ToolCall.objects.get().success
    round_.refresh_from_db()
    conversation.refresh_from_db()
    assert (round_.error_count, round_.tool_call_count) == (1, 1)
    assert (conversation.error_count, conversation.tool_call_count) == (1, 1)


def test_the_deletion_collector_refuses_conversations():
    with pytest.raises(ValueError, match="pre_delete"):
        collect_deletion([make_conversation()])
