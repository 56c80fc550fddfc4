"""Rollups as they age, and from scratch.

`compact_rollups` deletes minute rows older than CTXLENS_ROLLUP_MINUTE_HOURS and hour rows older
than CTXLENS_ROLLUP_HOUR_DAYS: every call also counts in its hour and day rows, so nothing is
lost, only the finest grains of old data (windows whose edge falls there read raw calls for the
rest of that hour or day). `rebuild_rollups` recomputes every row from the stored calls and
conversations.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db import transaction

from pipeline.models import Rollup
from pipeline.rollups.figures import COLUMNS, MODEL_OF
from pipeline.rollups.track import Deltas, kept_since, write_deltas

CHUNK = 20_000


def compact_rollups(now: datetime | None = None) -> int:
    """Delete the minute and hour rows past their age; how many were deleted."""
    deleted = 0
    for grain, since in kept_since(now).items():
        if since is not None:
            deleted += Rollup.objects.filter(grain=grain, bucket_start__lt=since).delete()[0]
    return deleted


def rebuild_rollups(now: datetime | None = None, kinds: Iterable[str] = tuple(MODEL_OF)) -> int:
    """Recompute every rollup (of `kinds`) from the stored calls and conversations, in one
    transaction; the rows written."""
    since, kinds = kept_since(now), list(kinds)

    def finest(started: datetime) -> str:  # memory by kept buckets, not by minutes of all time
        return next(grain for grain in ("m", "h", "d") if since[grain] is None or started >= since[grain])

    with transaction.atomic():
        Rollup.objects.filter(kind__in=kinds).delete()
        deltas = Deltas()
        for kind in kinds:
            rows = MODEL_OF[kind].objects.order_by().values(*COLUMNS[kind]).iterator(chunk_size=CHUNK)
            deltas.add(kind, rows, finest=finest)
        rows = {k: v for k, v in deltas.expanded().items() if since[k[1]] is None or k[2] >= since[k[1]]}
        write_deltas(rows)
    return len(rows)
