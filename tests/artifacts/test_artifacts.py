"""The artifact sandbox: content-addressed storage, atomic writes, and reads that never leave it."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
import time_machine
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from pipeline.artifacts.store import (
    ArtifactError,
    ArtifactNotFound,
    ArtifactStorageError,
    InvalidArtifactId,
    ServerArtifactStore,
    open_artifact,
    read_artifact,
    store_artifact,
)
from pipeline.runtime.artifact_tool import read_artifact_tool
from pipeline.models import Artifact, Conversation
from pipeline.runtime.protocol import ToolErrorType
from pipeline.runtime.executor import DeadlineExceeded, ToolExecutor, run_with_deadline

pytestmark = pytest.mark.django_db

REPORT = "region,revenue\nnorth,120\nsouth,95\n" * 100


def sandbox_files(path: Path) -> list[str]:
    return sorted(entry.name for entry in path.iterdir())


def test_it_stores_content_under_its_hash_with_a_row(artifact_dir):
    conversation = Conversation.objects.create(
        external_id="conv-a", started_at=timezone.now(), last_activity_at=timezone.now()
    )
    with time_machine.travel("2030-05-01 10:00:00+00:00", tick=False):
        row = store_artifact(REPORT, summary="sales by region", mime="text/csv", token_count=321, conversation=conversation)
    digest = hashlib.sha256(REPORT.encode()).hexdigest()
    assert row.artifact_id == f"artifact_{digest[:32]}"
    assert (row.sha256, row.size, row.mime, row.summary, row.token_count) == (
        digest,
        len(REPORT),
        "text/csv",
        "sales by region",
        321,
    )
    assert row.conversation == conversation
    assert row.expires_at - row.created_at == timedelta(hours=24)
    assert sandbox_files(artifact_dir) == [row.artifact_id]
    assert (artifact_dir / row.artifact_id).read_text() == REPORT


def test_same_content_is_stored_once_and_its_expiry_is_pushed_out(artifact_dir):
    with time_machine.travel("2030-05-01 10:00:00+00:00", tick=False) as traveller:
        first = store_artifact(REPORT)
        traveller.shift(timedelta(hours=5))
        again = store_artifact(REPORT.encode(), summary="late summary")
    assert again.pk == first.pk
    assert Artifact.objects.count() == 1
    assert sandbox_files(artifact_dir) == [first.artifact_id]
    assert again.expires_at - first.expires_at == timedelta(hours=5)
    assert again.last_accessed_at - first.last_accessed_at == timedelta(hours=5)
    assert again.summary == "late summary"


def test_different_content_gets_a_different_id(artifact_dir):
    assert store_artifact("a").artifact_id != store_artifact("b").artifact_id
    assert len(sandbox_files(artifact_dir)) == 2


def test_a_short_id_taken_by_other_content_falls_back_to_the_full_hash(artifact_dir):
    digest = hashlib.sha256(REPORT.encode()).hexdigest()
    other = Artifact.objects.create(artifact_id=f"artifact_{digest[:32]}", sha256="f" * 64, size=1)
    row = store_artifact(REPORT)
    assert row.pk != other.pk and row.artifact_id == f"artifact_{digest}"
    assert read_artifact(row.artifact_id).text == REPORT


def test_a_missing_file_is_written_again_on_the_next_store(artifact_dir):
    row = store_artifact(REPORT)
    (artifact_dir / row.artifact_id).unlink()
    store_artifact(REPORT)
    assert read_artifact(row.artifact_id).text == REPORT


def test_storing_content_again_while_its_old_row_is_deleted_keeps_the_file(artifact_dir, django_capture_on_commit_callbacks):
    old = store_artifact(REPORT)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with transaction.atomic():
            old.delete()  # e.g. cleanup_artifacts: the file goes when this commits
            new = store_artifact(REPORT)  # finds the file still there
    assert len(callbacks) == 2  # the deletion's unlink runs first
    assert new.pk != old.pk and read_artifact(new.artifact_id).text == REPORT


def test_ttl_follows_the_setting(settings, artifact_dir):
    settings.CTXLENS_ARTIFACT_TTL_HOURS = 2
    row = store_artifact("short lived")
    assert row.expires_at - row.created_at == timedelta(hours=2)


@pytest.fixture
def full_disk(tmp_path, settings):
    """A sandbox on a real 64 KiB tmpfs; where mounting is not allowed, writes fail with ENOSPC."""
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    try:
        command = ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)]
        mounted = subprocess.run(command, capture_output=True).returncode == 0
    except OSError:
        mounted = False
    settings.CTXLENS_ARTIFACT_DIR = mount_point
    if mounted:
        yield mount_point
        subprocess.run(["umount", str(mount_point)], check=True)
        return
    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(mount_point)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "write", write)
        yield mount_point


def test_a_full_disk_gives_a_clear_error_and_leaves_nothing_behind(full_disk):
    with pytest.raises(ArtifactStorageError, match="artifact storage is full") as caught:
        store_artifact(os.urandom(256 * 1024))
    assert str(full_disk) not in str(caught.value)
    assert Artifact.objects.count() == 0
    assert sandbox_files(full_disk) == []


def test_a_full_disk_turns_into_a_failed_tool_result(full_disk):
    def export(query: str = "") -> str:
        return "x" * (256 * 1024)

    executor = ToolExecutor([export], artifact_store=ServerArtifactStore())
    result = executor.execute_tool_call({"id": "call_1", "name": "export", "args": {}}, output_level="full")
    assert not result.success
    assert result.error_type is ToolErrorType.INTERNAL
    assert "artifact storage is full" in result.content
    assert str(full_disk) not in result.content
    assert Artifact.objects.count() == 0


def test_reading_returns_the_content_and_marks_it_used(artifact_dir):
    with time_machine.travel("2030-05-01 10:00:00+00:00", tick=False) as traveller:
        row = store_artifact(REPORT, mime="text/csv", summary="sales")
        traveller.shift(timedelta(hours=3))
        content = read_artifact(row.artifact_id)
    assert (content.text, content.mime, content.summary, content.size) == (REPORT, "text/csv", "sales", len(REPORT))
    row.refresh_from_db()
    assert row.last_accessed_at - row.created_at == timedelta(hours=3)


def test_a_partial_read_stops_at_max_bytes(artifact_dir):
    row = store_artifact(REPORT)
    assert read_artifact(row.artifact_id, max_bytes=14).text == "region,revenue"


HEX = "0123456789abcdef" * 2


@pytest.mark.parametrize(
    "artifact_id",
    [
        "../../etc/passwd",
        f"artifact_{HEX}/../../../etc/passwd",
        f"../artifact_{HEX}",
        "/etc/passwd",
        f"/tmp/artifact_{HEX}",
        f"artifact_{HEX}\x00.txt",
        f"artifact_{HEX}\n",
        "artifact_%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        f"artifact_{HEX[:-2]}%2f",
        "ａｒｔｉｆａｃｔ_" + HEX,  # fullwidth letters
        "artifact_" + "０１２３４５６７８９" * 2,  # fullwidth digits
        "artıfact_" + HEX,  # dotless i
        "artifact_" + HEX.replace("a", "а"),  # Cyrillic a
        "ARTIFACT_" + HEX,
        "artifact_" + HEX.upper(),
        "artifact_" + "0" * 15,
        "artifact_" + "0" * 65,
        "",
        None,
        b"artifact_" + HEX.encode(),
        Path("artifact_" + HEX),
    ],
)
def test_it_refuses_ids_that_are_not_exactly_an_artifact_id(artifact_dir, artifact_id):
    with pytest.raises(InvalidArtifactId) as caught:
        read_artifact(artifact_id)
    assert str(artifact_dir) not in str(caught.value)


def test_an_absolute_path_to_a_real_artifact_is_refused(artifact_dir):
    row = store_artifact(REPORT)
    with pytest.raises(InvalidArtifactId):
        read_artifact(str(artifact_dir / row.artifact_id))


def test_a_symlink_in_the_sandbox_is_not_followed(artifact_dir, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("database password")
    digest = hashlib.sha256(secret.read_bytes()).hexdigest()
    artifact_id = f"artifact_{digest[:32]}"
    Artifact.objects.create(
        artifact_id=artifact_id, sha256=digest, size=secret.stat().st_size, expires_at=timezone.now() + timedelta(hours=1)
    )
    (artifact_dir / artifact_id).symlink_to(secret)
    with pytest.raises(ArtifactNotFound) as caught:
        read_artifact(artifact_id)
    assert str(tmp_path) not in str(caught.value)


def planted_symlink(artifact_dir: Path, target: Path) -> Artifact:
    """A row whose sandbox file is a link to `target`, as an attacker with sandbox access would leave it."""
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    row = Artifact.objects.create(
        artifact_id=f"artifact_{digest[:32]}", sha256=digest, size=target.stat().st_size,
        expires_at=timezone.now() + timedelta(hours=1),
    )
    (artifact_dir / row.artifact_id).symlink_to(target)
    return row


def test_the_admin_preview_does_not_follow_a_symlink_out_of_the_sandbox(client, alice, artifact_dir, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("database password hunter2")
    row = planted_symlink(artifact_dir, secret)
    client.force_login(alice)
    response = client.get(reverse("admin:pipeline_artifact_change", args=[row.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    assert row.artifact_id in html
    assert "hunter2" not in html and str(tmp_path) not in html


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_something_other_than_a_regular_file_is_refused_at_once(artifact_dir, kind):
    digest = hashlib.sha256(b"").hexdigest()
    artifact_id = f"artifact_{digest[:32]}"
    Artifact.objects.create(artifact_id=artifact_id, sha256=digest, size=0)
    path = artifact_dir / artifact_id
    path.mkdir() if kind == "directory" else os.mkfifo(path)
    try:
        row = Artifact.objects.get(artifact_id=artifact_id)
        for read in (read_artifact, lambda _: open_artifact(row)):
            # A FIFO opened for reading would block until a writer came; the deadline makes a hang fail.
            with pytest.raises(ArtifactNotFound):
                run_with_deadline(lambda: read(artifact_id), timeout_ms=5000)
    except DeadlineExceeded:
        pytest.fail("opening the artifact blocked")
    finally:
        if kind == "fifo":  # release a reader left blocked by a regression
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass


def test_unknown_and_expired_artifacts_are_not_found(artifact_dir):
    with pytest.raises(ArtifactNotFound):
        read_artifact("artifact_" + HEX)
    with time_machine.travel("2030-05-01 10:00:00+00:00", tick=False) as traveller:
        row = store_artifact(REPORT)
        traveller.shift(timedelta(hours=25))
        with pytest.raises(ArtifactNotFound, match="expired"):
            read_artifact(row.artifact_id)


def test_a_hard_link_planted_under_an_artifacts_name_is_never_served(client, alice, artifact_dir, tmp_path):
    """A hard link passes every fence a symlink does not (a regular file, directly in the sandbox):
    only the row's size and sha256 tell it apart. The admin download and the API both refuse it."""
    row = store_artifact(REPORT)
    secret = artifact_dir.parent / "secret.txt"  # same filesystem: a hard link needs one
    secret.write_text("database password hunter2")
    sandbox_file = artifact_dir / row.artifact_id
    sandbox_file.unlink()
    os.link(secret, sandbox_file)

    with pytest.raises(ArtifactError, match="integrity"):
        open_artifact(row)
    client.force_login(alice)
    admin_download = client.get(reverse("admin:pipeline_artifact_download", args=[row.pk]))
    api_download = client.get(f"/api/artifacts/{row.artifact_id}/content")
    for response in (admin_download, api_download):
        assert response.status_code == 404
        body = b"".join(response.streaming_content) if response.streaming else response.content
        assert b"hunter2" not in body and str(tmp_path).encode() not in body


def test_a_tampered_file_fails_the_integrity_check(artifact_dir):
    row = store_artifact(REPORT)
    (artifact_dir / row.artifact_id).write_text(REPORT.replace("north", "NORTH"))
    with pytest.raises(ArtifactError, match="integrity"):
        read_artifact(row.artifact_id)


def test_the_model_reads_an_artifact_through_the_tool_a_window_at_a_time(artifact_dir):
    row = store_artifact(REPORT)
    executor = ToolExecutor([read_artifact_tool(ServerArtifactStore(), max_chars=100)])
    call = {"id": "call_r1", "name": "read_artifact", "args": {"artifact_id": row.artifact_id, "offset": 14}}
    result = executor.execute_tool_call(call, timeout_ms=None, output_level="full")
    assert result.success and result.artifact_id is None
    assert result.observation.startswith(f"{row.artifact_id} characters 14-114 of {len(REPORT)}")
    assert REPORT[14:114] in result.observation
    assert "call again with offset=114" in result.observation


def test_the_read_tool_reports_bad_and_unknown_ids_as_tool_errors(artifact_dir):
    executor = ToolExecutor([read_artifact_tool(ServerArtifactStore())])
    bad = executor.execute_tool_call({"id": "c1", "name": "read_artifact", "args": {"artifact_id": "../etc/passwd"}}, timeout_ms=None)
    missing = executor.execute_tool_call({"id": "c2", "name": "read_artifact", "args": {"artifact_id": "artifact_" + HEX}}, timeout_ms=None)
    assert (bad.error_type, missing.error_type) == (ToolErrorType.INVALID_INPUT, ToolErrorType.NOT_FOUND)
    assert str(artifact_dir) not in bad.content + missing.content
