"""Artifact retention: the TTL, the total-size cap (least recently used first) and orphan files.

An artifact a tool call uses is kept by all of them, whoever stored it first (issue #10).

`cleanup_artifacts()` is what `manage.py cleanup_artifacts` (run by cron or a systemd timer)
and the admin call; `delete_expired_artifacts()` is its TTL step alone, which `manage.py prune`
and the admin's "delete expired" action use too. Rows are deleted in short transactions; their
files go on commit through the Artifact post_delete receiver. Orphans are files in the sandbox named like an artifact (or
left-over temp files) that have no row and are older than a grace period, so a file whose
row is still being committed is never taken.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import NamedTuple
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Count, Sum
from django.utils import timezone

from pipeline.artifacts.store import TEMP_PREFIX, sandbox_dir
from pipeline.conf import ctxlens_config
from pipeline.models import Artifact
from pipeline.runtime.artifacts import ARTIFACT_ID_RE

ORPHAN_GRACE = timedelta(minutes=10)
BATCH = 500


def format_bytes(size: int) -> str:
    """1.2 MB style (binary units, as the thresholds are)."""
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"  # pragma: no cover - the loop returns first


@dataclass
class CleanupReport:
    expired: int = 0
    expired_bytes: int = 0
    evicted: int = 0
    evicted_bytes: int = 0
    orphans: int = 0
    kept: int = 0
    kept_bytes: int = 0
    dry_run: bool = False

    def line(self) -> str:
        """The one-line summary the command prints."""
        name = "cleanup_artifacts (dry run)" if self.dry_run else "cleanup_artifacts"
        return (
            f"{name}: expired {self.expired}, evicted {self.evicted} ({format_bytes(self.evicted_bytes)}), "
            f"orphans {self.orphans}, kept {self.kept} ({format_bytes(self.kept_bytes)})"
        )


class Deleted(NamedTuple):
    count: int
    size: int  # bytes
    batches: int  # transactions


def delete_artifacts(pks: list[int], gone: set[str] | None = None, batch_size: int = BATCH, **still: object) -> Deleted:
    """Delete rows by pk that still match `still` and that no tool call uses, `batch_size` per
    transaction, adding their ids to `gone`.

    The rows are locked before their users are looked for: an ingest that is linking a tool call
    to one of them holds a key-share lock on it until it commits, so the look happens after
    that, and a link made later waits for this delete (and then finds no artifact).
    """
    gone = set() if gone is None else gone
    count = size = batches = 0
    for start in range(0, len(pks), batch_size):
        with transaction.atomic():
            locked = list(Artifact.objects.select_for_update(of=("self",))
                          .filter(pk__in=pks[start : start + batch_size], **still).values_list("pk", flat=True))
            chunk = list(Artifact.objects.filter(pk__in=locked).unused().values_list("pk", "size", "artifact_id"))
            Artifact.objects.filter(pk__in=[pk for pk, _, _ in chunk]).delete()
        count += len(chunk)
        size += sum(s for _, s, _ in chunk)
        batches += 1
        gone.update(aid for _, _, aid in chunk)
    return Deleted(count, size, batches)


def delete_expired_artifacts(
    now: datetime | None = None, *, batch_size: int = BATCH, gone: set[str] | None = None
) -> Deleted:
    """Delete the artifacts past their expiry at `now`, in short transactions; a row whose expiry
    was pushed out meanwhile (the same content stored again), or that a tool call uses, stays.
    Files go on commit."""
    now = now or timezone.now()
    pks = list(Artifact.objects.expired(now).unused().order_by("pk").values_list("pk", flat=True))
    return delete_artifacts(pks, gone, batch_size, expires_at__lte=now)


def _orphan_files(known: set[str], now: datetime) -> list[str]:
    root = sandbox_dir()
    cutoff = (now - ORPHAN_GRACE).timestamp()
    names = []
    with os.scandir(root) as entries:
        for entry in entries:
            is_artifact = ARTIFACT_ID_RE.match(entry.name) is not None
            if not (is_artifact or entry.name.startswith(TEMP_PREFIX)) or entry.name in known:
                continue
            st = entry.stat(follow_symlinks=False)
            if (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)) and st.st_mtime < cutoff:
                names.append(entry.name)
    return names


def cleanup_artifacts(
    *, now: datetime | None = None, max_total_bytes: int | None = None, dry_run: bool = False
) -> CleanupReport:
    """Delete expired artifacts, then the least recently used until the total fits the cap,
    then orphan files. With dry_run nothing changes and the report says what would go."""
    now = now or timezone.now()
    cap = ctxlens_config().artifact_max_total_bytes if max_total_bytes is None else max_total_bytes
    report = CleanupReport(dry_run=dry_run)
    gone: set[str] = set()  # deleted rows; their files go on commit and are not orphans

    expired_pks: set[int] = set()
    if dry_run:
        expired = list(Artifact.objects.expired(now).unused().values_list("pk", "size"))
        expired_pks = {pk for pk, _ in expired}
        report.expired, report.expired_bytes = len(expired), sum(size for _, size in expired)
    else:
        report.expired, report.expired_bytes, _ = delete_expired_artifacts(now, gone=gone)

    live = Artifact.objects.exclude(pk__in=expired_pks) if dry_run else Artifact.objects.all()
    total = live.aggregate(size=Sum("size"))["size"] or 0
    # Artifacts a tool call uses count towards the cap but are never evicted.
    lru = list(live.unused().order_by("last_accessed_at", "created_at", "pk").values_list("pk", "size"))
    victims: list[int] = []
    for pk, size in lru:
        if total <= cap:
            break
        victims.append(pk)
        total -= size
        report.evicted_bytes += size
    report.evicted = len(victims)
    if victims and not dry_run:
        # Rows touched since `now` are in use again and stay.
        report.evicted, report.evicted_bytes, _ = delete_artifacts(victims, gone, last_accessed_at__lte=now)

    known = set(Artifact.objects.values_list("artifact_id", flat=True)) | gone
    orphans = _orphan_files(known, now)
    if not dry_run:
        root = sandbox_dir()
        for name in orphans:
            (root / name).unlink(missing_ok=True)
    report.orphans = len(orphans)

    kept = Artifact.objects.exclude(pk__in=expired_pks | set(victims)) if dry_run else Artifact.objects.all()
    totals = kept.aggregate(count=Count("pk"), size=Sum("size"))
    report.kept, report.kept_bytes = totals["count"], totals["size"] or 0
    return report
