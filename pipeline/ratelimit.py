"""Per-key ingest rate limit, kept in Django's cache so every worker shares it (Redis on the scale path).

A fixed window of CTXLENS_INGEST_RATE_WINDOW seconds allows CTXLENS_INGEST_RATE_LIMIT spans
per second per key on average (limit × window spans per window; the limit may be a fraction,
e.g. 0.5 with a 60 s window is 30 spans a minute). Counting is one atomic
`cache.add` + `cache.incr`, so concurrent requests on several workers never overshoot by
more than the request that crosses the line: that one is let through, so a batch larger
than the budget is never refused forever. Once a window is spent, every request is refused
until it ends, with the seconds to wait.

Refusals are answered 503 + Retry-After (not 429): every generation of the OTel exporters
retries a 503, and the current ones wait as Retry-After says; older ones drop a 429.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from django.core.cache import cache

from pipeline.conf import ctxlens_config
from pipeline.models import ApiKey

STATUS = 503


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    retry_after: int = 0  # whole seconds until the window ends; 0 when allowed
    remaining: int | None = None  # spans left in this window; None when there is no limit


ALLOW = RateDecision(allowed=True)


def _window(now: float, window: int) -> tuple[int, float]:
    index = int(now // window)
    return index, (index + 1) * window - now


def bucket_name(key: ApiKey | str | int) -> str:
    """An ApiKey's hash prefix (unique across databases that share one Redis), else the id given."""
    return key.key_hash[:32] if isinstance(key, ApiKey) else str(key)


def check_ingest_rate(key: ApiKey | str | int, spans: int = 1, *, now: float | None = None) -> RateDecision:
    """Count `spans` against `key` (an ApiKey, or another stable client id) and decide.

    `spans=0` only asks whether the key is already over its budget (e.g. before decoding a body).
    """
    config = ctxlens_config()
    if config.ingest_rate_limit <= 0:
        return ALLOW
    window = config.ingest_rate_window
    budget = config.ingest_rate_limit * window
    index, left = _window(time.time() if now is None else now, window)
    cache_key = f"ctxlens:ratelimit:{bucket_name(key)}:{index}"
    retry_after = max(1, math.ceil(left))
    if spans <= 0:
        used = cache.get(cache_key, 0)
        return RateDecision(used < budget, 0 if used < budget else retry_after, max(0, math.floor(budget - used)))
    # add() is a no-op when the counter exists; it keeps the counter a little past its window.
    cache.add(cache_key, 0, timeout=window + 5)
    try:
        used = cache.incr(cache_key, spans)
    except ValueError:  # expired between add and incr
        cache.add(cache_key, spans, timeout=window + 5)
        used = spans
    before = used - spans
    if before >= budget:
        return RateDecision(False, retry_after, 0)
    return RateDecision(True, 0, max(0, math.floor(budget - used)))


def retry_after_header(decision: RateDecision) -> dict[str, str]:
    return {"Retry-After": str(decision.retry_after)}
