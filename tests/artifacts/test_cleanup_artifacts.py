"""`manage.py cleanup_artifacts`: TTL, size cap with LRU eviction, orphan files, one summary line."""

from __future__ import annotations

import os
from datetime import timedelta
from io import StringIO

import pytest
import time_machine
from django.core.management import call_command

from pipeline.artifacts.store import read_artifact, store_artifact
from pipeline.models import Artifact

# Files of deleted rows go when the deletion commits, so these tests commit for real.
pytestmark = pytest.mark.django_db(transaction=True)

START = "2030-05-01 10:00:00+00:00"


def run(*args: str) -> str:
    out = StringIO()
    call_command("cleanup_artifacts", *args, stdout=out)
    return out.getvalue().strip()


def names(sandbox) -> set[str]:
    return {entry.name for entry in sandbox.iterdir()}


def age(path, seconds: float) -> None:
    old = path.stat().st_mtime - seconds
    os.utime(path, (old, old), follow_symlinks=False)


def test_expired_artifacts_and_their_files_go(artifact_dir):
    with time_machine.travel(START, tick=False) as traveller:
        old = store_artifact("old report " * 100, ttl_hours=1)
        fresh = store_artifact("fresh report " * 100, ttl_hours=48)
        traveller.shift(timedelta(hours=2))
        line = run()
    assert line == f"cleanup_artifacts: expired 1, evicted 0 (0 B), orphans 0, kept 1 ({fresh.size / 1024:.1f} KB)"
    assert list(Artifact.objects.values_list("artifact_id", flat=True)) == [fresh.artifact_id]
    assert names(artifact_dir) == {fresh.artifact_id}
    assert old.artifact_id not in names(artifact_dir)


def test_the_size_cap_evicts_least_recently_used_first(settings, artifact_dir):
    settings.CTXLENS_ARTIFACT_MAX_TOTAL_BYTES = 2500
    with time_machine.travel(START, tick=False) as traveller:
        first = store_artifact("a" * 1000)
        traveller.shift(60)
        second = store_artifact("b" * 1000)
        traveller.shift(60)
        third = store_artifact("c" * 1000)
        traveller.shift(60)
        read_artifact(first.artifact_id)  # now the oldest use is `second`
        line = run()
    assert line == "cleanup_artifacts: expired 0, evicted 1 (1000 B), orphans 0, kept 2 (2.0 KB)"
    assert set(Artifact.objects.values_list("artifact_id", flat=True)) == {first.artifact_id, third.artifact_id}
    assert names(artifact_dir) == {first.artifact_id, third.artifact_id}


def test_the_cap_can_be_given_for_one_run(artifact_dir):
    store_artifact("a" * 1000)
    store_artifact("b" * 1000)
    assert "evicted 2 (2.0 KB)" in run("--max-total-bytes", "0")
    assert names(artifact_dir) == set()


def test_orphan_artifact_files_and_stale_temp_files_go_but_nothing_else(artifact_dir, tmp_path):
    kept = store_artifact("kept")
    orphan = artifact_dir / ("artifact_" + "ab" * 16)
    orphan.write_text("no row")
    stale_temp = artifact_dir / ".tmp-half-written"
    stale_temp.write_text("partial")
    just_written = artifact_dir / ("artifact_" + "cd" * 16)  # its row may still be committing
    just_written.write_text("new")
    notes = artifact_dir / "README.txt"
    notes.write_text("operator notes")
    outside = tmp_path / "outside.txt"
    outside.write_text("not ours")
    link = artifact_dir / ("artifact_" + "ef" * 16)
    link.symlink_to(outside)
    for path in (orphan, stale_temp, notes, link):
        age(path, 3600)
    line = run()
    assert "orphans 3" in line
    assert names(artifact_dir) == {kept.artifact_id, just_written.name, notes.name}
    assert outside.read_text() == "not ours"


def test_dry_run_reports_the_same_counts_and_changes_nothing(settings, artifact_dir):
    settings.CTXLENS_ARTIFACT_MAX_TOTAL_BYTES = 1500
    with time_machine.travel(START, tick=False) as traveller:
        store_artifact("x" * 1000, ttl_hours=1)
        traveller.shift(60)
        store_artifact("y" * 1000)
        traveller.shift(60)
        store_artifact("z" * 1000)
        orphan = artifact_dir / ("artifact_" + "ab" * 16)
        orphan.write_text("no row")
        age(orphan, 3600)
        traveller.shift(timedelta(hours=2))
        before = names(artifact_dir)
        dry = run("--dry-run")
        assert names(artifact_dir) == before
        assert Artifact.objects.count() == 3
        real = run()
    assert dry == "cleanup_artifacts (dry run): expired 1, evicted 1 (1000 B), orphans 1, kept 1 (1000 B)"
    assert real == dry.replace(" (dry run)", "")
    assert len(names(artifact_dir)) == 1


def test_a_row_used_again_during_cleanup_is_not_evicted(settings, artifact_dir):
    from pipeline.artifacts.cleanup import cleanup_artifacts

    settings.CTXLENS_ARTIFACT_MAX_TOTAL_BYTES = 0
    with time_machine.travel(START, tick=False) as traveller:
        row = store_artifact("busy")
        traveller.shift(5)
        read_artifact(row.artifact_id)
        report = cleanup_artifacts(now=row.created_at + timedelta(seconds=1))
    assert (report.evicted, report.kept) == (0, 1)


def test_an_empty_sandbox_reports_zeroes(artifact_dir):
    assert run() == "cleanup_artifacts: expired 0, evicted 0 (0 B), orphans 0, kept 0 (0 B)"


def test_an_operator_applies_retention_from_the_admin(client, alice, artifact_dir):
    with time_machine.travel(START, tick=False) as traveller:
        expired = store_artifact("old " * 100, ttl_hours=1)
        kept = store_artifact("new " * 100)
        traveller.shift(timedelta(hours=2))
        client.force_login(alice)
        response = client.post(
            "/admin/pipeline/artifact/",
            {"action": "apply_retention", "_selected_action": [kept.pk]},
            follow=True,
        )
    assert response.status_code == 200
    # The admin capitalises the first letter of a message.
    assert "Cleanup_artifacts: expired 1, evicted 0 (0 B), orphans 0, kept 1" in response.content.decode()
    assert names(artifact_dir) == {kept.artifact_id}
    assert not Artifact.objects.filter(pk=expired.pk).exists()


def test_expired_artifacts_go_in_short_batches_for_prune_and_the_admin_too(artifact_dir):
    from pipeline.artifacts.cleanup import delete_expired_artifacts

    with time_machine.travel(START, tick=False) as traveller:
        expired = [store_artifact(f"old {n} " * 100, ttl_hours=1) for n in range(5)]
        fresh = store_artifact("fresh " * 100, ttl_hours=48)
        traveller.shift(timedelta(hours=2))
        deleted = delete_expired_artifacts(batch_size=2)
    assert (deleted.count, deleted.size, deleted.batches) == (5, sum(a.size for a in expired), 3)
    assert names(artifact_dir) == {fresh.artifact_id}


def test_expired_and_least_recently_used_artifacts_stay_while_a_tool_call_uses_them(settings, artifact_dir):
    from datetime import datetime

    from pipeline.models import Conversation, ToolCall

    settings.CTXLENS_ARTIFACT_MAX_TOTAL_BYTES = 1500
    with time_machine.travel(START, tick=False) as traveller:
        used_expired = store_artifact("u" * 1000, ttl_hours=1)
        used_old = store_artifact("o" * 1000, ttl_hours=48)
        traveller.shift(60)
        unused = store_artifact("n" * 1000, ttl_hours=48)
        now = datetime.fromisoformat(START)
        conversation = Conversation.objects.create(external_id="current", started_at=now, last_activity_at=now)
        for n, artifact in enumerate((used_expired, used_old)):
            ToolCall.objects.create(conversation=conversation, trace_id="7" * 32, span_id=f"{n + 1:016x}",
                                    started_at=now, tool_name="search", artifact=artifact)
        traveller.shift(timedelta(hours=2))
        dry = run("--dry-run")
        line = run()
    assert dry == "cleanup_artifacts (dry run): expired 0, evicted 1 (1000 B), orphans 0, kept 2 (2.0 KB)"
    assert line == "cleanup_artifacts: expired 0, evicted 1 (1000 B), orphans 0, kept 2 (2.0 KB)"
    assert names(artifact_dir) == {used_expired.artifact_id, used_old.artifact_id}
    assert not Artifact.objects.filter(pk=unused.pk).exists()
