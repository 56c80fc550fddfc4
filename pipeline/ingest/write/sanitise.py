"""Make hostile but well-formed span content storable, so one odd value cannot sink a batch.

OTLP and JSON allow what the databases refuse: NUL characters (PostgreSQL text and jsonb
reject them), lone UTF-16 surrogates (a JSON "\\ud800" escape) that UTF-8 cannot encode (the
database driver raised UnicodeEncodeError), NaN and infinities (not JSON: SQLite's JSON check
and PostgreSQL's jsonb reject them), integers beyond 64 bits (SQLite and PostgreSQL overflow),
and enum values outside their range (smallint columns). Each such value made the whole batch fail with a database
error (503), which exporters retry until they give up, so the batch was lost. Found by the
OTLP fuzzing in tests/receivers/test_hostile_input.py and bench/fuzz_otlp.py. NUL and lone
surrogates become U+FFFD, the replacement character.

Times: an end before the start is clamped to the start (a zero duration, not a negative one;
an end of 0 still means the span is unfinished), and a log's time is kept inside 0..2**63 - 1.

`clean_record` / `clean_log` run in store_spans before normalising; `integer_clamp` is how
pipeline.ingest.write.sql writes integer columns and `clamp_integers` does the same before ORM inserts
(a token count of 2**40 becomes the column's maximum).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from django.db.backends.base.operations import BaseDatabaseOperations
from django.db.models import Field, IntegerField, Model

from pipeline.ingest.records import LogRecord, SpanEvent, SpanRecord

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_SPAN_KIND, MAX_STATUS_CODE = 5, 2


UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # NUL, and surrogates (JSON pairs arrive already joined)


def clean_text(text: str) -> str:
    if text.isascii():  # no surrogates: only a NUL to replace, found without the regex
        return text.replace("\x00", "\ufffd") if "\x00" in text else text
    if "\x00" not in text:
        try:
            text.encode()  # fails on a surrogate: a third of the regex's time on the long texts of LLM spans
            return text
        except UnicodeEncodeError:
            pass
    return UNSTORABLE.sub("\ufffd", text)


def clean_value(value: Any) -> Any:
    """An attribute value without NUL characters, non-finite floats or integers past 64 bits."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if INT64_MIN <= value <= INT64_MAX else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)  # "nan", "inf", "-inf"
    if isinstance(value, dict):
        return {clean_text(str(key)): clean_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [clean_value(item) for item in value]
    return value  # bytes: base64 text once stored


def clean_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    """clean_value of every key and value, with the common case (ASCII text without NUL: nothing
    to clean) tested inline: this runs for some forty keys and values of every span."""
    cleaned = {}
    for key, value in attributes.items():
        if type(key) is not str or not key.isascii() or "\x00" in key:
            key = clean_text(str(key))
        if type(value) is not str or not value.isascii() or "\x00" in value:
            value = clean_value(value)
        cleaned[key] = value
    return cleaned


def clean_record(record: SpanRecord, resources: dict[int, tuple[dict, dict]] | None = None) -> SpanRecord:
    """`resources`: cleaned resources by the id of the dict they came from, for one batch (the spans
    of one ResourceSpans share its dict, and stay sharing the cleaned one)."""
    record.name = clean_text(record.name)
    record.status_message = clean_text(record.status_message)
    record.scope_name, record.scope_version = clean_text(record.scope_name), clean_text(record.scope_version)
    record.attributes = clean_attributes(record.attributes)
    if resources is None:
        record.resource = clean_attributes(record.resource)
    else:
        original, cleaned = resources.get(id(record.resource), (None, None))
        if original is not record.resource:
            original, cleaned = record.resource, clean_attributes(record.resource)
            resources[id(original)] = (original, cleaned)  # the original is kept so its id is not reused
        record.resource = cleaned
    record.events = [SpanEvent(clean_text(e.name), e.time_unix_nano, clean_attributes(e.attributes))
                     for e in record.events]
    record.links = [clean_value(link) for link in record.links]
    if not 0 <= record.kind <= MAX_SPAN_KIND:
        record.kind = 0  # unspecified
    if not 0 <= record.status_code <= MAX_STATUS_CODE:
        record.status_code = 0  # unset
    if record.end_time_unix_nano and record.end_time_unix_nano < record.start_time_unix_nano:
        record.end_time_unix_nano = record.start_time_unix_nano  # else a negative duration (or -2**64: overflow)
    return record


def clean_log(log: LogRecord) -> LogRecord:
    log.event_name = clean_text(log.event_name)
    log.body = clean_value(log.body)
    log.attributes = clean_attributes(log.attributes)
    log.time_unix_nano = max(0, min(INT64_MAX, log.time_unix_nano))  # fixed64 goes to 2**64 - 1
    return log


def integer_clamp(field: Field) -> Callable[[Any], Any] | None:
    """For an integer column: a function that keeps values inside the column's range, else None.

    The ranges are PostgreSQL's on every backend (SQLite would take any 64-bit value), so the
    same span stores the same numbers everywhere and sums of counts cannot overflow 64 bits.
    """
    if not isinstance(field, IntegerField) or field.primary_key:
        return None
    low, high = BaseDatabaseOperations.integer_field_ranges.get(field.get_internal_type(), (INT64_MIN, INT64_MAX))

    def clamp(value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and not low <= value <= high:
            return max(low, min(high, value))
        return value

    return clamp


def clamp_integers(rows: list[Model]) -> list[Model]:
    """Keep the integer fields of unsaved instances inside their columns' ranges (for ORM inserts)."""
    if rows:
        clamps = [(field.attname, clamp) for field in rows[0]._meta.concrete_fields
                  if (clamp := integer_clamp(field)) is not None]
        for row in rows:
            for attname, clamp in clamps:
                setattr(row, attname, clamp(getattr(row, attname)))
    return rows
