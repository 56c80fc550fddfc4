"""The ingest's datetime writer (pipeline.ingest.write.sql.Prepare.datetime) gives what the
backend's adapter gives, for every kind of aware datetime."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from django.db import connection

from pipeline.ingest.write.sql import Prepare

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("value", [
    datetime(2025, 11, 22, 8, 30, 5, 123456, tzinfo=UTC),
    datetime(2025, 11, 22, 8, 30, 5, tzinfo=UTC),  # no microseconds: str() leaves them out
    datetime(2025, 11, 22, 8, 30, 5, 10, tzinfo=UTC),  # leading zeros kept
    datetime(1, 1, 1, tzinfo=UTC),
    datetime(999, 1, 2, 3, 4, 5, 100000, tzinfo=UTC),  # a year of three digits is padded
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(2025, 11, 22, 8, 30, 5, 1, tzinfo=timezone(timedelta(0))),
    datetime(2025, 11, 22, 8, 30, 5, 1, tzinfo=ZoneInfo("UTC")),
    datetime(2025, 11, 22, 8, 30, 5, 1, tzinfo=timezone(timedelta(hours=2))),
    None,
    type("Moment", (datetime,), {})(2025, 11, 22, 8, 30, 5, 7, tzinfo=UTC),  # a subclass, which orjson refuses
])
def test_a_datetime_is_written_as_the_adapter_writes_it(value):
    assert Prepare().datetime(value) == connection.ops.adapt_datetimefield_value(value)


def test_utc_datetimes_across_the_range_are_written_as_the_adapter_writes_them():
    rng, prepare, start = random.Random(7), Prepare(), datetime(1, 1, 1, tzinfo=UTC)
    for _ in range(2000):
        value = start + timedelta(days=rng.randrange(3652058), microseconds=rng.randrange(86400 * 10**6))
        value = value.replace(microsecond=rng.choice([0, value.microsecond, value.microsecond % 1000]))
        assert prepare.datetime(value) == connection.ops.adapt_datetimefield_value(value)
