"""Small readers for span attribute values: first present key, lenient numbers and JSON.

Instrumentations write "", "unknown" or "None" where they know nothing; those count as absent.
`any`-typed attributes arrive either structured (kvlist/array) or as a JSON string.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

ABSENT = frozenset({"", "unknown", "None", "none", "null"})


def present(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, str):
        return value not in ABSENT
    return True


def first(attrs: Mapping[str, Any], *keys: str) -> Any:
    """The value of the first key in `keys` that `attrs` has with a real value, else None."""
    for key in keys:
        value = attrs.get(key)
        if value is not None and (not isinstance(value, str) or value not in ABSENT):  # present(), inline
            return value
    return None


def first_str(attrs: Mapping[str, Any], *keys: str) -> str:
    value = first(attrs, *keys)
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def as_int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(float(value))
    except (TypeError, ValueError, OverflowError):  # OverflowError: "inf", "1e400" (missing, not an error)
        return None


def first_int(attrs: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = attrs.get(key)
        if value is not None:  # most keys are missing: no as_int call for them
            number = as_int(value)
            if number is not None:
                return number
    return None


TRUE_TEXTS = frozenset({"true", "1", "yes"})


def first_bool(attrs: Mapping[str, Any], *keys: str) -> bool:
    """A flag: the first value present is true (bool, non-zero number, or "true"/"1"/"yes" in any case)."""
    value = first(attrs, *keys)
    if isinstance(value, str):
        return value.strip().lower() in TRUE_TEXTS
    return bool(value) if isinstance(value, bool | int | float) else False


MAX_COUNT = 2**31 - 1  # the largest value an IntegerField column holds on every backend


def first_count(attrs: Mapping[str, Any], *keys: str) -> int | None:
    """A token or item count: the first integer present, kept within 0..MAX_COUNT."""
    number = first_int(attrs, *keys)
    return None if number is None else min(max(number, 0), MAX_COUNT)


SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # a UTF-16 surrogate written as a JSON \u escape
SURROGATE = re.compile("[\ud800-\udfff]")


def _without_surrogates(value: Any) -> Any:
    """Lone surrogates (which UTF-8, and so the database, cannot hold) replaced with U+FFFD."""
    if isinstance(value, str):
        return SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_without_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {_without_surrogates(key): _without_surrogates(item) for key, item in value.items()}
    return value


def _finite(text: str) -> float | str:
    """A JSON number as a float, or as written where no float holds it (1e999): as NaN and the
    infinities, which no JSON column takes (PostgreSQL refuses the whole batch)."""
    number = float(text)
    return number if math.isfinite(number) else text


_DECODER = json.JSONDecoder(parse_float=_finite, parse_constant=str)  # built once: json.loads(**kw) builds one a call


def parse_json(value: Any) -> Any:
    """A structured value as is; a string that holds JSON object/array parsed; else the value.

    The attributes were cleaned as text (pipeline.ingest.write.sanitise), but JSON inside a string
    can still spell a lone surrogate as an escape ("\\ud800"): parsed, it is replaced too; and
    NaN, Infinity or 1e999, which are kept as text (`_finite`).
    """
    if isinstance(value, str):
        text = value.lstrip()
        # JSON that starts with { or [ ends with } or ] (only " \t\n\r" may follow): text that does not
        # ("{...} and more") is not tried: json.loads would only raise
        if text[:1] in ("{", "[") and value.rstrip(" \t\n\r").endswith(("}", "]")):
            try:
                parsed = _DECODER.decode(value)
                return _without_surrogates(parsed) if SURROGATE_ESCAPE.search(value) else parsed
            except (ValueError, RecursionError):  # RecursionError: nested too deeply to read; kept as text
                return value
    return value


def json_dict(value: Any) -> dict[str, Any]:
    parsed = parse_json(value)
    return parsed if isinstance(parsed, dict) else {}


def json_counts(value: Any) -> dict[str, Any]:
    """A JSON object of token counts (by context category): its integers kept within 0..MAX_COUNT,
    as every other count; its other values as sent (readers skip them)."""
    return {key: min(max(count, 0), MAX_COUNT) if isinstance(count, int) and not isinstance(count, bool) else count
            for key, count in json_dict(value).items()}


def to_text(value: Any) -> str:
    """A payload as the text a model would see: strings unchanged, anything else as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def dig(value: Any, *path: str) -> Any:
    """value[path[0]][path[1]]... through dicts, or None when a step is missing."""
    for step in path:
        if not isinstance(value, dict):
            return None
        value = value.get(step)
    return value
