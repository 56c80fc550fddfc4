"""write_deltas reads the rollup rows' JSON with orjson, and on SQLite writes it with orjson: the ORM
and the tool stats must read back what JSONField's json.dumps / json.loads give, to the type and the
key order — integers past 64 bits, floats, Infinity, decimal strings, non-ASCII error types and the
latency sketch included."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.db import DataError, IntegrityError, connection, transaction

from pipeline.models import Rollup
from pipeline.rollups import sketch
from pipeline.rollups.figures import TOOL, Figures
from pipeline.rollups.track import write_deltas
from pipeline.stats import stats_of, window_tool_stats

pytestmark = pytest.mark.django_db

KEY = (TOOL, "d", datetime(2024, 5, 1, tzinfo=UTC), "search")


def batch(n: int, duration_ms: float) -> Figures:
    """One ingest batch's figures for KEY, with sums past 64 bits once added up."""
    return Figures(
        calls=3,
        sums=Counter({"duration_n": 3, "duration_ms": duration_ms, "successes": 2, "cache_hits": 1,
                      "observation_tokens": 2**62 + n, "context_tokens": 123, "context_carries": 4,
                      "context_cost_usd": Decimal("0.000125") * n, "context_priced": 1, "level_calls": 3,
                      "level_carried": 2**70 + n, "at_brief": 7, "carried_brief": 10**25 + n}),
        errors=Counter({"TimeoutError": 1, "délai dépassé ✗": n}),
        latency=Counter(sketch.bucket_of(d) for d in (0.0, 0.5 * n + 0.01, 1e6 + n, 1e6 + n)),
    )


def assert_read_back_as_json_wrote_it(durations: list[float]) -> None:
    expected = Figures()
    for n, duration_ms in enumerate(durations, 1):
        delta = batch(n, duration_ms)
        write_deltas({KEY: delta})  # the first creates the row (the ORM), the others update it
        expected.add(delta)
        # what the old path read back: JSONField's json.loads of json.dumps's text
        old = json.loads(json.dumps(expected.stored()))
        kind, grain, start, name = KEY
        row = Rollup.objects.values("calls", "sums", "errors", "latency").get(
            kind=kind, grain=grain, bucket_start=start, name=name)
        unordered = connection.vendor != "sqlite"  # jsonb keeps keys in an order of its own
        # types (int, not float) too, and the key order on SQLite
        assert json.dumps(row, sort_keys=unordered) == json.dumps(old, sort_keys=unordered)
        as_old = Figures.from_stored(old["calls"], old["sums"], old["errors"], old["latency"])
        assert window_tool_stats(tool_name=name) == stats_of({name: as_old})
    assert isinstance(row["sums"]["level_carried"], int) and row["sums"]["level_carried"] > 2**70


def test_updated_rollups_read_back_as_json_dumps_wrote_them():
    assert_read_back_as_json_wrote_it([1.5, 0.1 + 1e-7, 1234.000001, 2.5e-3])
    if connection.vendor == "sqlite":  # the updates took the fast path: orjson's compact text
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT latency, errors FROM {Rollup._meta.db_table}")
            latency, errors = cursor.fetchone()
        assert ": " not in latency and "délai" in errors


def test_an_infinite_sum_is_refused_as_json_dumps_has_it_refused():
    """json.dumps writes Infinity, which the column's JSON check (SQLite) or jsonb refuses; orjson
    would write null, read back as None: the write must still fail, not store that."""
    def timed(duration_ms: float) -> Figures:  # no integer past 64 bits: orjson writes this one
        return Figures(calls=1, sums=Counter({"duration_n": 1, "duration_ms": duration_ms}))

    write_deltas({KEY: timed(1.5)})
    with pytest.raises(IntegrityError if connection.vendor == "sqlite" else DataError):
        with transaction.atomic():
            write_deltas({KEY: timed(float("inf"))})
    assert Rollup.objects.get().sums["duration_ms"] == 1.5
