"""Each tool call's tokens at BRIEF, STANDARD and FULL, counted after the ingest response.

Formatting a result three times and tokenising each is too slow for the ingest response, so it
runs with the deferred token counting (pipeline.ingest.write.deferred): a tool call whose full
result may be stored — an artifact, or an observation at the full level — is marked
`levels_pending` when it is stored (`mark_pending`), and again when linking finds its result
in a later call's input or gives it to an LLM call that counts otherwise
(pipeline.ingest.write.linking); `count_some` reads a chunk of them and counts them outside any
transaction (pipeline.insight.levels), `write` stores the counts of the rows still pending and
unchanged, under the deferred writer's locks. A call without a readable
full result (an observation that only names an artifact the server does not hold, an expired
artifact, one over MAX_RESULT_BYTES) gets `{}`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.db.models import Q

from pipeline.artifacts.store import ArtifactError, open_artifact
from pipeline.ingest.write.sql import update_rows
from pipeline.insight.levels import is_reference, result_data, tokens_at_levels
from pipeline.models import ToolCall

logger = logging.getLogger(__name__)

MAX_RESULT_BYTES = 4 * 1024 * 1024  # as the runtime, which counts no artifact's tokens past this size
READ_COLUMNS = ("id", "round_id", "conversation_id", "observation", "output_level", "artifact_id", "tokens_at_level",
                "llm_call__model", "artifact__artifact_id", "artifact__size", "artifact__sha256", "artifact__mime")
WRITTEN = ["tokens_at_level", "levels_pending"]


def needs_levels(tool: ToolCall) -> bool:
    """Whether the trace may hold the tool call's full result: an artifact, or a full-level observation."""
    return tool.artifact_id is not None or (tool.output_level == "full" and tool.observation != "")


NEEDS_LEVELS = Q(artifact__isnull=False) | (Q(output_level="full") & ~Q(observation=""))  # needs_levels, as a filter


def mark_pending(tools: list[ToolCall]) -> bool:
    """Mark the tool calls just stored whose levels are to be counted; True when there are any."""
    pending = [t for t in tools if needs_levels(t)]
    for tool in pending:
        tool.levels_pending = True
    update_rows(ToolCall, pending, ["levels_pending"])
    return bool(pending)


def full_result(tool: ToolCall) -> tuple[str, str] | None:
    """(text, MIME type) of the tool's full result, or None when the trace does not hold it."""
    artifact = tool.artifact
    if artifact is not None:
        if artifact.size > MAX_RESULT_BYTES:
            return None
        try:
            with open_artifact(artifact) as handle:
                return handle.read().decode("utf-8", errors="replace"), artifact.mime
        except (ArtifactError, OSError):
            return None
    if tool.output_level == "full" and tool.observation and not is_reference(tool.observation):
        return tool.observation, ""
    return None


def levels_of(tool: ToolCall) -> dict[str, int]:
    """The tool's tokens at each level, counted for the model of the LLM call that asked for it;
    {} without a full result."""
    found = full_result(tool)
    if found is None:
        return {}
    model = tool.llm_call.model if tool.llm_call else None
    return tokens_at_levels(result_data(*found), model)


def count_some(limit: int) -> list[ToolCall]:
    """Read up to `limit` pending tool calls and count them (CPU work, outside any transaction)."""
    tools = list(ToolCall.objects.filter(levels_pending=True).select_related("llm_call", "artifact")
                 .only(*READ_COLUMNS).order_by("pk")[:limit])
    for tool in tools:
        tool.read = _content(tool)
        try:
            tool.tokens_at_level = levels_of(tool)
        except Exception:  # one bad result must not hold back the rows queued behind it
            logger.exception("could not count the output levels of tool call %s; leaving them blank", tool.pk)
            tool.tokens_at_level = {}
    return tools


def _content(tool: ToolCall) -> tuple:
    """What the levels are counted from: the result, and the model of the call the tool is linked to."""
    return tool.observation, tool.output_level, tool.artifact_id, tool.llm_call.model if tool.llm_call else None


def write(tools: Iterable[ToolCall]) -> list[ToolCall]:
    """Store the counts of `tools` that are still pending with the content they were counted
    from (inside the caller's transaction); returns the rows written. A row changed meanwhile (its
    result, or the model of the call it is linked to) stays pending and is counted again later."""
    counted = {t.pk: t for t in tools}
    if not counted:
        return []
    current = (ToolCall.objects.select_for_update(of=("self",)).filter(levels_pending=True, pk__in=list(counted))
               .select_related("llm_call")
               .only("id", "round_id", "conversation_id", "observation", "output_level", "artifact_id",
                     "llm_call__model").order_by("pk"))
    written = []
    for tool in current:
        done = counted[tool.pk]
        if _content(tool) == done.read:
            tool.tokens_at_level, tool.levels_pending = done.tokens_at_level, False
            written.append(tool)
    update_rows(ToolCall, written, WRITTEN)
    return written
