"""Windowed figures per tool, model or compression strategy, and conversation counts: rollup
rows for the whole buckets inside the window, raw rows only for the parts at its edges that no
stored bucket covers.

A window [since, until) is covered from the coarsest grain down: whole days from the day rows
(kept for ever), the rest at each edge by whole hours from the hour rows where they are still
kept, the rest by whole minutes likewise, and what is left — less than a minute near now, less
than an hour or a day further back — from the rows themselves. Everything but the latency
percentiles is therefore exact; those come from the merged sketches (pipeline.rollups.sketch):
within 2 % of the duration at the percentile's rank.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime

from django.db.models import Q
from django.utils import timezone

from pipeline.models import Rollup
from pipeline.rollups.figures import COLUMNS, MODEL_OF, NAME_COLUMN, TIME_COLUMN, Figures, contribution
from pipeline.rollups.track import GRAINS, floor, kept_since

ORDER = ("d", "h", "m")
# Later than any stored time (OTLP's nanoseconds end in 2554), and far enough from datetime.max for
# a bucket's end: a window's edge past it is open (until) or past everything (since).
LATEST = datetime(9999, 1, 1, tzinfo=UTC)


def _ceil(moment: datetime, grain: str) -> datetime:
    start = floor(moment, grain)
    return start if start == moment else start + GRAINS[grain]


Segment = tuple[int, str, "datetime | None", "datetime | None"]  # sign, grain, first bucket start, end
Part = tuple[int, "datetime | None", "datetime | None"]  # sign, raw since, raw until


def cover(since: datetime | None, until: datetime | None, now: datetime | None = None
          ) -> tuple[list[Segment], list[Part]]:
    """Rollup segments and raw parts whose signed sum is [since, until), each call counted once.

    At each edge inside a bucket the cheaper side is read: the part of the bucket inside the
    window (added, at the finer grains), or the whole bucket less the part outside (subtracted).
    So an edge costs at most half a bucket of each finer grain: a window of 24 hours reads a day
    row, at most 12 hour rows and 30 minute rows per name, instead of 23 and 59."""
    if until is not None and until >= LATEST:
        until = None
    if since is not None and since > LATEST:
        since = LATEST
    kept = kept_since(now)
    segments: list[Segment] = []
    raw: list[Part] = []

    def finer(sign: int, lo: datetime, hi: datetime, level: int) -> None:
        if lo >= hi:
            return
        if level + 1 < len(ORDER) and lo >= kept[ORDER[level + 1]]:
            walk(sign, lo, hi, level + 1)
        else:
            raw.append((sign, lo, hi))

    def walk(sign: int, lo: datetime | None, hi: datetime | None, level: int) -> None:
        grain = ORDER[level]
        start = end = None
        edges: list[tuple[int, datetime, datetime]] = []
        if lo is not None:
            low, high = floor(lo, grain), _ceil(lo, grain)
            outer = lo - low < high - lo
            start = low if outer else high
            edges.append((-sign, low, lo) if outer else (sign, lo, high))
        if hi is not None:
            low, high = floor(hi, grain), _ceil(hi, grain)
            outer = high - hi < hi - low
            end = high if outer else low
            edges.append((-sign, hi, high) if outer else (sign, low, hi))
        if start is not None and end is not None and start >= end:  # no whole bucket: all finer
            finer(sign, lo, hi, level)
            return
        segments.append((sign, grain, start, end))
        for edge_sign, edge_lo, edge_hi in edges:
            finer(edge_sign, edge_lo, edge_hi, level)

    if since is None or until is None or since < until:
        walk(1, since, until, 0)
    return segments, raw


def figures_by_name(kind: str, *, since: datetime | None = None, until: datetime | None = None,
                    name: str | None = None, now: datetime | None = None) -> dict[str, Figures]:
    """{name: Figures} of the `kind` ("tool" / "model" / "compression" / "conversation") rows whose
    time (started, or a conversation's last activity) is in [since, until)."""
    segments, raw = cover(since, until, now or timezone.now())
    out: dict[str, Figures] = defaultdict(Figures)
    for sign in (1, -1):
        where = Q()
        for segment_sign, grain, start, end in segments:
            if segment_sign != sign:
                continue
            part = Q(grain=grain)
            if start is not None:
                part &= Q(bucket_start__gte=start)
            if end is not None:
                part &= Q(bucket_start__lt=end)
            where |= part
        if not where:
            continue
        rows = Rollup.objects.order_by().filter(where, kind=kind)
        if name is not None:
            rows = rows.filter(name=name)
        for row_name, calls, sums, errors, latency in rows.values_list("name", "calls", "sums", "errors", "latency"):
            out[row_name].add_stored(calls, sums, errors, latency, sign)
    for sign, lo, hi in raw:
        for row in _raw_calls(kind, lo, hi, name):
            row_name, _, figures = contribution(kind, row)
            out[row_name].add(figures, sign)
    # calls <= 0: a name whose only calls were subtracted at an edge (an ingest committed between
    # the rollup and raw reads can leave -1 for a moment)
    return {row_name: f for row_name, f in out.items() if f.calls > 0}


def _raw_calls(kind: str, lo: datetime, hi: datetime, name: str | None) -> Iterator[dict]:
    calls = MODEL_OF[kind].objects.order_by().filter(**{f"{TIME_COLUMN[kind]}__gte": lo,
                                                        f"{TIME_COLUMN[kind]}__lt": hi})
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
