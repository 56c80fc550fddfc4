"""The ingest's JSON writer (pipeline.ingest.write.sql.Prepare.json) takes and refuses the values
JSONField takes and refuses: orjson writes faster, but what json.dumps refuses is not stored."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime

import pytest
from django.db import connection

from pipeline.ingest.write.sql import Prepare
from pipeline.models import Span

pytestmark = [
    pytest.mark.django_db,
    # PostgreSQL's adapter encodes when the statement runs; SQLite's text is made here
    pytest.mark.skipif(connection.vendor != "sqlite", reason="the orjson path is SQLite's"),
]


@dataclasses.dataclass
class Point:
    x: int


def _field_prepares(value):
    try:
        return Span._meta.get_field("attributes").get_db_prep_save(value, connection), None
    except TypeError as error:
        return None, type(error)


def _ingest_prepares(value):
    try:
        return Prepare().json(value), None
    except TypeError as error:
        return None, type(error)


@pytest.mark.parametrize("value", [
    {"at": datetime(2026, 1, 1, tzinfo=UTC)},
    {"point": Point(1)},
    [datetime(2026, 1, 1)],
])
def test_values_json_refuses_are_refused_alike(value):
    assert _field_prepares(value) == (None, TypeError)
    assert _ingest_prepares(value) == (None, TypeError)


@pytest.mark.parametrize("value", [{"a": [1, 2.5, "é", None, True]}, {1: "integer key"}, [2**70]])
def test_values_json_takes_read_back_the_same(value):
    stored, refused = _ingest_prepares(value)
    assert refused is None
    assert json.loads(stored) == json.loads(json.dumps(value))


@pytest.mark.parametrize("value", [
    {"a": [1, 2.5, "é", None, True], "nested": {"b": "c"}},
    {"raw": b"\x00\xffbytes", "list": [b"one", {"deeper": b"two"}]},
    [b"top level"],
    {1: "integer key", "raw": b"x"},
    {"big": 2**70, "raw": b"x"},
])
def test_span_attributes_are_written_as_jsonable_then_prepared(value):
    """_SpanJson.json lets orjson write bytes as base64 itself: the same text as jsonable first."""
    from pipeline.ingest.write.rows import _SpanJson, jsonable

    assert _SpanJson().json(value) == Prepare().json(jsonable(value))


def test_span_attributes_json_refuses_what_prepare_refuses():
    from pipeline.ingest.write.rows import _SpanJson

    with pytest.raises(TypeError):
        _SpanJson().json({"at": datetime(2026, 1, 1, tzinfo=UTC), "raw": b"x"})


def test_span_json_encoded_before_the_transaction_is_what_the_transaction_would_write():
    """prepare_spans encodes each span's JSON columns on the request's thread; the Span rows are
    the ones the writer made when it encoded them itself."""
    from pipeline.ingest.records import SpanEvent
    from pipeline.ingest.write.rows import _SpanRows
    from pipeline.ingest.write.store import prepare_spans
    from tests.ingest.test_otlp_store import agent_trace

    records = agent_trace()
    records[1].events = [SpanEvent("retry", 5, {"raw": b"\x00\x01"})]
    records[2].links = [{"trace_id": "ab" * 16, "span_id": "cd" * 8}]
    spans = prepare_spans(records).spans
    assert spans and all(s.span_json is not None for s in spans)
    rows = _SpanRows("otlp")
    encoded_before = [rows.values(s, 1) for s in spans]
    assert all(row[16:20] == list(s.span_json) and row[16] is s.span_json[0] for row, s in zip(encoded_before, spans))
    for s in spans:
        s.span_json = None
    assert encoded_before == [rows.values(s, 1) for s in spans]
    assert any(json.loads(row[17]) for row in encoded_before)  # events and links written, not only empty lists
    assert any(json.loads(row[18]) for row in encoded_before)
