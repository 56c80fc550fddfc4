"""The ingest's datetime writer (pipeline.ingest.write.sql.Prepare.datetime) gives what the
backend's adapter gives, for every kind of aware datetime."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from django.db import connection

from pipeline.ingest.write.sql import Prepare

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("value", [
    datetime(2025, 11, 22, 8, 30, 5, 123456, tzinfo=UTC),
    datetime(2025, 11, 22, 8, 30, 5, tzinfo=UTC),  # no microseconds: str() leaves them out
    datetime(2025, 11, 22, 8, 30, 5, 1, tzinfo=timezone(timedelta(0))),
    datetime(2025, 11, 22, 8, 30, 5, 1, tzinfo=ZoneInfo("UTC")),
    datetime(2025, 11, 22, 8, 30, 5, 1, tzinfo=timezone(timedelta(hours=2))),
    None,
])
def test_a_datetime_is_written_as_the_adapter_writes_it(value):
    assert Prepare().datetime(value) == connection.ops.adapt_datetimefield_value(value)
