"""What a tool's observation would have cost at each output level, from its full result.

The runtime formats a tool's raw output at BRIEF, STANDARD or FULL
(pipeline.runtime.observations); given the full result a trace stored, the same formatters and
the same token counter (pipeline.tokens) say what the observation would have been at each
level. FULL is `format_observation(data, FULL)`: the complete text in the context, as a tool
whose results may not become artifacts shows it.

A full result is text: what the runtime's `to_text` made of the raw output. It is read back as
the raw output the formatters take: JSON when its MIME type says so (an artifact the runtime
stored), or, for an observation of unknown type, when it parses as a JSON array or object (the
runtime writes every non-text result that way); any other text stays text.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pipeline.runtime.observations import OutputLevel, format_artifact_observation, format_observation
from pipeline.tokens.counting import count_tokens_bounded

LEVELS = tuple(level.value for level in OutputLevel)  # ("brief", "standard", "full")
JSON_MIME = "application/json"
# The observation that names an artifact instead of holding the result, as the runtime writes
# it, and the preview the server keeps of an observation it moved into an artifact
# (pipeline.ingest.write.artifacts.preview): neither is the full result.
ARTIFACT_NOTE = format_artifact_observation("\0", "").partition("\0")[0]
PREVIEW_END = re.compile(r"\n… \[\d+ bytes in total, stored as artifact_[0-9a-f]+\]\Z")


def is_reference(observation: str) -> bool:
    """True when an observation stands in for a result stored elsewhere."""
    return observation.startswith(ARTIFACT_NOTE) or PREVIEW_END.search(observation) is not None


def result_data(text: str, mime: str = "") -> Any:
    """The raw output the runtime formatted, from its full text (see the module docstring)."""
    if mime.split(";")[0].strip().lower() == JSON_MIME:
        try:
            return json.loads(text)
        except ValueError:
            return text
    if mime or not text.lstrip().startswith(("[", "{")):
        return text
    try:
        data = json.loads(text)
    except ValueError:
        return text
    return data if isinstance(data, list | dict) else text


def tokens_at_levels(data: Any, model: str | None) -> dict[str, int]:
    """{"brief": n, "standard": n, "full": n}: the tokens of `data` formatted at each level."""
    return {level.value: count_tokens_bounded(format_observation(data, level), model)[0] for level in OutputLevel}
