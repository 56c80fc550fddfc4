"""Observations and output levels: how detailed the text a tool call shows the model is.

The observation is WHAT a tool says; the OutputLevel is HOW detailed its text is (an
engineering knob for tokens, orthogonal to the content): BRIEF key facts only, STANDARD the
actionable part, FULL everything (stored as an artifact; the observation names its id and
a summary, never a path). `effective_level` picks the level of one call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import Enum
from typing import Any

from pipeline.runtime.settings import runtime_settings

BRIEF_CONTEXT_USAGE = 0.8  # above this share of the window, observations are forced to BRIEF
BRIEF_CHARS = 100
STANDARD_CHARS = 500
STANDARD_ITEMS = 3
SUMMARY_CHARS = 200
LEVEL_ARGUMENT = "output_level"  # the argument a model may add to any tool call to ask for a level


class OutputLevel(str, Enum):
    """How detailed an observation is: an engineering knob, orthogonal to what it says."""

    BRIEF = "brief"  # key facts only: "Found 10 items"
    STANDARD = "standard"  # actionable: count plus the first items, or the first 500 chars
    FULL = "full"  # complete data, stored as an artifact; the observation names its id

    @classmethod
    def parse(cls, value: OutputLevel | str) -> OutputLevel:
        """`OutputLevel` from a level or its name in any case; ValueError for anything else."""
        if isinstance(value, OutputLevel):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise ValueError(f"unknown output level {value!r}; use brief, standard or full") from None


def effective_level(
    explicit: OutputLevel | str | None,
    tool_name: str,
    context_usage: float = 0.0,
    *,
    tool_default: OutputLevel | str | None = None,
) -> OutputLevel:
    """The level one tool call is formatted at, by the seeds' chain:

    1. the explicit request: the `output_level` the model put in the call's arguments (or a
       request built with one);
    2. the tool configuration: `tool_default` (the executor's `output_levels`, then
       CTXLENS_TOOL_OUTPUT_LEVELS, then the tool's `ctxlens_output_level` metadata), or, when
       not given, CTXLENS_TOOL_OUTPUT_LEVELS;
    3. BRIEF when more than 80 % of the context window is used;
    4. CTXLENS_DEFAULT_OUTPUT_LEVEL.
    """
    if explicit is not None:
        return OutputLevel.parse(explicit)
    config = runtime_settings()
    configured = tool_default or config.tool_output_levels.get(tool_name)
    if configured:
        return OutputLevel.parse(configured)
    if context_usage > BRIEF_CONTEXT_USAGE:
        return OutputLevel.BRIEF
    return OutputLevel.parse(config.default_output_level)


CIRCULAR = "<circular reference>"


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__} object>"


def _safe_str(value: Any) -> str:
    try:
        return str(value)
    except Exception:
        return _safe_repr(value)


def _jsonable(value: Any, ancestors: frozenset[int] = frozenset()) -> Any:
    """`value` with what JSON cannot hold rendered as text: a key that is not a string or number
    (a tuple, say) becomes its repr, a container that contains itself becomes CIRCULAR, and
    any other object its str()."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Mapping | list | tuple):
        if id(value) in ancestors:
            return CIRCULAR
        inner = ancestors | {id(value)}
        if isinstance(value, Mapping):
            return {
                (key if key is None or isinstance(key, str | int | float | bool) else _safe_repr(key)):
                    _jsonable(item, inner)
                for key, item in value.items()
            }
        return [_jsonable(item, inner) for item in value]
    return _safe_str(value)


def to_json(data: Any, indent: int | None = None) -> str:
    """JSON text of `data`; what JSON cannot hold (tuple keys, cycles, odd objects) is shown as
    text (`_jsonable`) rather than raising."""
    try:
        return json.dumps(data, ensure_ascii=False, indent=indent, default=_safe_str)
    except (TypeError, ValueError, RecursionError):
        pass
    try:
        return json.dumps(_jsonable(data), ensure_ascii=False, indent=indent, default=_safe_str)
    except (TypeError, ValueError, RecursionError):  # nested too deep for the encoder
        return _safe_repr(data)


def to_text(data: Any) -> tuple[str, str]:
    """Serialise a tool's raw output: (text, mime). Strings stay as they are; the rest is JSON
    (`to_json`: never raises, whatever the tool returned)."""
    if isinstance(data, str):
        return data, "text/plain"
    if isinstance(data, bytes | bytearray):
        return bytes(data).decode("utf-8", errors="replace"), "text/plain"
    return to_json(data, indent=2), "application/json"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… [{len(text) - limit} more characters]"


def format_brief(data: Any) -> str:
    if isinstance(data, list | tuple):
        return f"Found {len(data)} items"
    if isinstance(data, Mapping):
        if "success" in data:
            status = "Success" if data["success"] else "Failed"
            return f"{status}: {data.get('message', 'Operation completed')}"
        return f"Result has {len(data)} fields: {', '.join(map(str, list(data)[:10]))}"
    return _clip(to_text(data)[0], BRIEF_CHARS)


def format_standard(data: Any) -> str:
    if isinstance(data, list | tuple):
        items = "\n".join(f"  - {to_json(item)}" for item in data[:STANDARD_ITEMS])
        more = f"\n  ... and {len(data) - STANDARD_ITEMS} more" if len(data) > STANDARD_ITEMS else ""
        return f"Found {len(data)} items:\n{items}{more}".rstrip(":\n")
    return _clip(to_text(data)[0], STANDARD_CHARS)


def format_full(data: Any) -> str:
    return to_text(data)[0]


def format_observation(data: Any, level: OutputLevel) -> str:
    """Format a tool's raw output at `level` (FULL results normally go to an artifact instead)."""
    return {OutputLevel.BRIEF: format_brief, OutputLevel.STANDARD: format_standard}.get(level, format_full)(data)


def summarize(data: Any) -> str:
    """A short description of a result, shown beside its artifact id."""
    if isinstance(data, list | tuple):
        first = data[0] if data else None
        keys = f" First item keys: {list(first)}" if isinstance(first, Mapping) else ""
        return f"List with {len(data)} items.{keys}"
    if isinstance(data, Mapping):
        return f"Dictionary with {len(data)} keys. Top keys: {', '.join(map(str, list(data)[:10]))}"
    text = to_text(data)[0]
    return f"Text of {len(text)} characters: {_clip(' '.join(text.split()), SUMMARY_CHARS)}"


def format_artifact_observation(artifact_id: str, summary: str) -> str:
    """The observation for a stored result: the artifact id and a summary, never a path."""
    return (
        f"Data stored as artifact: {artifact_id}\n\n"
        "Large dataset available for subsequent tool access.\n\n"
        "To access this data, reference the artifact_id in your next tool call.\n"
        "The system will securely retrieve the data for you.\n\n"
        f"Data summary: {summary}"
    )
