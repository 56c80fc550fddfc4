"""A DDSketch-style latency histogram: log-spaced buckets with relative accuracy ALPHA.

Written here (about 40 lines) rather than taken from the `ddsketch` package: the rollups need
only the bucket mapping, merging and quantiles, and a sketch kept as a JSON map
{bucket index: count} that can be added to and subtracted from (a call deleted or replaced
takes its count back out), which the package's protobuf form does not offer.

A duration d > 0 falls in bucket i = ceil(log_gamma(d)), gamma = (1 + ALPHA) / (1 - ALPHA);
the bucket's value 2 * gamma**i / (gamma + 1) is within ALPHA of every duration in it. A
percentile is read as percentile_cont defines it — interpolated between the durations at the two
nearest ranks — from those ranks' bucket values: each within ALPHA, so the percentile is within
ALPHA (2 %) of the exact one. Durations <= MIN_MS share bucket "z", read as 0.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping

ALPHA = 0.02
GAMMA = (1 + ALPHA) / (1 - ALPHA)
LOG_GAMMA = math.log(GAMMA)
MIN_MS = 1e-6  # a nanosecond: below this a duration is zero (buckets stay few: ~1,300 up to 10**7 ms)
ZERO = "z"


def bucket_of(duration_ms: float) -> str:
    """The JSON key of the bucket holding `duration_ms`."""
    if duration_ms <= MIN_MS:
        return ZERO
    return str(math.ceil(math.log(duration_ms) / LOG_GAMMA))


def value_of(key: str) -> float:
    """The representative value of a bucket: within ALPHA of everything in it."""
    if key == ZERO:
        return 0.0
    return 2 * GAMMA ** int(key) / (GAMMA + 1)


def merge(into: Counter, other: Mapping[str, int], sign: int = 1) -> None:
    """Add (sign=1) or take out (sign=-1) the counts of `other`; empty buckets are dropped."""
    for key, count in other.items():
        into[key] += sign * count
        if not into[key]:
            del into[key]


def quantiles(sketch: Mapping[str, int], qs: Iterable[float]) -> list[float | None]:
    """The continuous percentiles `qs` (percentile_cont's definition: between the durations at the
    two nearest ranks) from the bucket values; None for an empty sketch."""
    qs = list(qs)
    n = sum(sketch.values())
    if n <= 0:
        return [None] * len(qs)
    ordered = sorted(sketch.items(), key=lambda item: -math.inf if item[0] == ZERO else int(item[0]))

    def at(rank: int) -> float:
        seen = 0
        for key, count in ordered:
            seen += count
            if seen > rank:
                return value_of(key)
        return value_of(ordered[-1][0])

    out = []
    for q in qs:
        position = q * (n - 1)
        lower = math.floor(position)
        low, high = at(lower), at(min(lower + 1, n - 1))
        out.append(low + (high - low) * (position - lower))
    return out
