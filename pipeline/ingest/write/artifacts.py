"""Tool calls and their Artifacts: large observations become artifacts, named ones are linked.

- An observation over the artifact threshold is stored with `pipeline.artifacts.store.store_artifact`
  (the one writer of the sandbox: content-addressed, so a re-sent span finds the same artifact);
  the tool call keeps a preview and the artifact id. The sandbox path never leaves that module.
- A tool span that names an artifact (`ctxlens.tool.artifact_id`, e.g. the pipeline's FULL
  level output, stored by the agent before the span ended) is linked to that Artifact row, and
  the artifact gets the tool call's conversation when it has none yet. An id that names no
  stored artifact links nothing.
"""

from __future__ import annotations

from collections import defaultdict

from pipeline.artifacts.store import store_artifact
from pipeline.conf import ctxlens_config
from pipeline.models import Artifact, Conversation, ToolCall

PREVIEW_CHARS = 2000


def preview(text: str, artifact_id: str, size: int) -> str:
    return f"{text[:PREVIEW_CHARS]}\n… [{size} bytes in total, stored as {artifact_id}]"


def store_observation_artifacts(tool_calls: list[ToolCall], refs: dict[tuple[str, str], str]) -> None:
    """Move large observations of unsaved `tool_calls` into artifacts and link named ones.

    `refs` holds the artifact id each tool span names, by (trace_id, span_id).
    """
    threshold = ctxlens_config().artifact_threshold_bytes
    wanted: dict[str, list[ToolCall]] = defaultdict(list)
    for call in tool_calls:
        ref = refs.get((call.trace_id, call.span_id))
        if ref and Artifact.is_valid_id(ref):
            wanted[ref].append(call)
        elif len(call.observation) * 4 > threshold and len(content := call.observation.encode()) > threshold:
            # (the first test is a cheap bound before encoding: at most 4 bytes a character)
            artifact = store_artifact(content, summary=call.observation[:500],
                                      conversation=Conversation(id=call.conversation_id))
            call.observation = preview(call.observation, artifact.artifact_id, len(content))
            call.output_level = call.output_level or "full"
            call.artifact = artifact
    if wanted:
        _link_named(wanted)


def _link_named(wanted: dict[str, list[ToolCall]]) -> None:
    unowned: dict[int, list[int]] = defaultdict(list)  # conversation id -> artifacts to give it
    for artifact in Artifact.objects.filter(artifact_id__in=list(wanted)).only("id", "artifact_id", "conversation"):
        calls = wanted[artifact.artifact_id]
        for call in calls:
            call.artifact = artifact
        if artifact.conversation_id is None:
            unowned[min(c.conversation_id for c in calls)].append(artifact.pk)
    for conversation_id, ids in sorted(unowned.items()):
        # conversation IS NULL again in the UPDATE: an owner another writer just set is kept
        Artifact.objects.filter(pk__in=ids, conversation__isnull=True).update(conversation_id=conversation_id)
