"""Windowed figures per tool or per model: rollup rows for the whole buckets inside the window,
raw calls only for the parts at its edges that no stored bucket covers.

A window [since, until) is covered from the coarsest grain down: whole days from the day rows
(kept for ever), the rest at each edge by whole hours from the hour rows where they are still
kept, the rest by whole minutes likewise, and what is left — less than a minute near now, less
than an hour or a day further back — from the calls themselves. Everything but the latency
percentiles is therefore exact; those come from the merged sketches (pipeline.rollups.sketch):
within 2 % of the duration at the percentile's rank.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime

from django.db.models import Q
from django.utils import timezone

from pipeline.models import Rollup
from pipeline.rollups.compact import kept_since
from pipeline.rollups.figures import COLUMNS, MODEL_OF, NAME_COLUMN, TIME_COLUMN, Figures, contribution
from pipeline.rollups.track import GRAINS, floor

ORDER = ("d", "h", "m")


def _ceil(moment: datetime, grain: str) -> datetime:
    start = floor(moment, grain)
    return start if start == moment else start + GRAINS[grain]


def cover(since: datetime | None, until: datetime | None, now: datetime | None = None
          ) -> tuple[list[tuple[str, datetime | None, datetime | None]], list[tuple[datetime | None, datetime | None]]]:
    """([(grain, first bucket start, end)], [(raw since, raw until)]) covering [since, until) once."""
    kept = kept_since(now)
    segments: list[tuple[str, datetime | None, datetime | None]] = []
    raw: list[tuple[datetime | None, datetime | None]] = []

    def walk(lo: datetime | None, hi: datetime | None, level: int) -> None:
        grain = ORDER[level]
        start = None if lo is None else _ceil(lo, grain)
        end = None if hi is None else floor(hi, grain)
        if start is not None and end is not None and start >= end:
            rest = [(lo, hi)]
        else:
            segments.append((grain, start, end))
            rest = [part for part in ((lo, start), (end, hi)) if part[0] is not None and part[1] is not None]
        for part_lo, part_hi in rest:
            if part_lo >= part_hi:
                continue
            finer = level + 1
            if finer < len(ORDER) and part_lo >= kept[ORDER[finer]]:
                walk(part_lo, part_hi, finer)
            else:
                raw.append((part_lo, part_hi))

    if since is None or until is None or since < until:
        walk(since, until, 0)
    return segments, raw


def figures_by_name(kind: str, *, since: datetime | None = None, until: datetime | None = None,
                    name: str | None = None, now: datetime | None = None) -> dict[str, Figures]:
    """{name: Figures} of the `kind` ("tool" / "model") calls started in [since, until)."""
    segments, raw = cover(since, until, now or timezone.now())
    out: dict[str, Figures] = defaultdict(Figures)
    if segments:
        where = Q()
        for grain, start, end in segments:
            part = Q(grain=grain)
            if start is not None:
                part &= Q(bucket_start__gte=start)
            if end is not None:
                part &= Q(bucket_start__lt=end)
            where |= part
        rows = Rollup.objects.order_by().filter(where, kind=kind)
        if name is not None:
            rows = rows.filter(name=name)
        for row_name, calls, sums, errors, latency in rows.values_list("name", "calls", "sums", "errors", "latency"):
            out[row_name].add_stored(calls, sums, errors, latency)
    for row in _raw_calls(kind, raw, name):
        row_name, _, figures = contribution(kind, row)
        out[row_name].add(figures)
    return dict(out)


def _raw_calls(kind: str, parts: list[tuple[datetime | None, datetime | None]], name: str | None) -> Iterator[dict]:
    model = MODEL_OF[kind]
    for lo, hi in parts:
        calls = model.objects.order_by().filter(**{f"{TIME_COLUMN[kind]}__gte": lo, f"{TIME_COLUMN[kind]}__lt": hi})
        if name is not None:
            calls = calls.filter(**{NAME_COLUMN[kind]: name})
        yield from calls.values(*COLUMNS[kind]).iterator(chunk_size=5000)


def per_minute(kind: str, since: datetime) -> dict[datetime, Figures]:
    """{minute: Figures over every name} from `since` (a minute boundary in the kept minute rows) on."""
    out: dict[datetime, Figures] = defaultdict(Figures)
    rows = Rollup.objects.order_by().filter(kind=kind, grain="m", bucket_start__gte=since)
    for start, calls, sums, errors, latency in rows.values_list("bucket_start", "calls", "sums", "errors", "latency"):
        out[start].add_stored(calls, sums, errors, latency)
    return dict(out)
