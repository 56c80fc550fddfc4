"""Per-key ingest rate limit, kept in Django's cache so every worker shares it (Redis on the scale path).

A token bucket per key: it holds at most CTXLENS_INGEST_RATE_LIMIT × CTXLENS_INGEST_RATE_WINDOW
spans (the burst a key may send at once) and refills at CTXLENS_INGEST_RATE_LIMIT spans per
second (the limit may be a fraction, e.g. 0.5 is 30 spans a minute). A request is let through
while the bucket is not empty, even when its spans take it below zero, so a batch larger than
the bucket is never refused forever; the next one waits until the deficit has refilled.

The state is two cache entries a key: when the bucket (re)started and how many spans it has
let through since (an atomic `incr` on a counter named after that start), so concurrent
requests on several workers never overshoot by more than the requests that cross the line
together. A bucket found full restarts at that moment with a fresh counter, so credit beyond
a full bucket is dropped without any write-off arithmetic that two workers could double.

Refusals are 429 (the OTLP specification's code for throttling; gRPC: RESOURCE_EXHAUSTED with
RetryInfo) with a Retry-After of the seconds until the bucket holds spans again, at most
MAX_RETRY_AFTER_SECONDS: the OTel exporters give up after a 10 s deadline, so a longer wait
would make them drop the batch without one retry. A key that stays over its rate still loses
data, as a rate limit must; a burst no longer does.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from django.core.cache import cache

from pipeline.conf import ctxlens_config
from pipeline.models import ApiKey

MAX_RETRY_AFTER_SECONDS = 3
KEEP_IDLE_SECONDS = 3600  # a key idle this long starts again with a full bucket


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    retry_after: int = 0  # whole seconds until the bucket holds spans again; 0 when allowed
    remaining: int | None = None  # spans the bucket still holds; None when there is no limit


ALLOW = RateDecision(allowed=True)


def bucket_name(key: ApiKey | str | int) -> str:
    """An ApiKey's hash prefix (unique across databases that share one Redis), else the id given."""
    return key.key_hash[:32] if isinstance(key, ApiKey) else str(key)


def _incr(name: str, delta: int, keep: int) -> int:
    try:
        return cache.incr(name, delta)
    except ValueError:  # expired since it was added
        cache.add(name, delta, timeout=keep)
        return delta


def _spent_key(base: str, origin: float) -> str:
    """The counter belongs to one start of the bucket: a lost or new origin never meets an old count."""
    return f"{base}:spent:{origin:.6f}"


def check_ingest_rate(key: ApiKey | str | int, spans: int = 1, *, now: float | None = None) -> RateDecision:
    """Take `spans` from `key`'s bucket (an ApiKey, or another stable client id) and decide.

    `spans=0` only asks whether the bucket is empty (e.g. before decoding a body). A refused
    request takes nothing.
    """
    config = ctxlens_config()
    rate = config.ingest_rate_limit
    if rate <= 0:
        return ALLOW
    capacity = rate * config.ingest_rate_window
    now = time.time() if now is None else now
    base = f"ctxlens:ratelimit:{bucket_name(key)}"
    keep = max(KEEP_IDLE_SECONDS, 2 * config.ingest_rate_window)
    origin_key = f"{base}:origin"
    cache.add(origin_key, now, timeout=keep)  # a new bucket starts full
    origin = cache.get(origin_key, now)
    spent_key = _spent_key(base, origin)
    if capacity + rate * (now - origin) - cache.get(spent_key, 0) > capacity:
        # Full (the key was quiet): start the bucket again now, with a counter of its own, so
        # nothing earned past a full bucket carries over. Two workers restarting at once each
        # count on their own new counter: the later origin wins, at most one request's spans
        # go uncounted, and no write-off is ever applied twice.
        origin = now
        cache.set(origin_key, origin, timeout=keep)
        spent_key = _spent_key(base, origin)
    cache.add(spent_key, 0, timeout=keep)
    cache.touch(origin_key, keep)
    cache.touch(spent_key, keep)
    spent = _incr(spent_key, spans, keep) if spans > 0 else cache.get(spent_key, 0)
    credit = capacity + rate * (now - origin) - (spent - spans if spans > 0 else spent)
    if credit > 0:
        return RateDecision(True, 0, max(0, math.floor(credit - spans)))
    if spans > 0:
        _incr(spent_key, -spans, keep)  # refused: nothing was taken
    wait = (-credit) / rate
    return RateDecision(False, min(MAX_RETRY_AFTER_SECONDS, max(1, math.ceil(wait + 1e-9))), 0)


def retry_after_header(decision: RateDecision) -> dict[str, str]:
    return {"Retry-After": str(decision.retry_after)}
