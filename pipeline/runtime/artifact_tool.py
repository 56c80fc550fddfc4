"""The model's side of the artifact sandbox: a LangChain tool that reads an artifact by id.

    store = LocalArtifactStore()          # or the server's store
    executor = ToolExecutor([query_sales, read_artifact_tool(store, max_chars=8000)], artifact_store=store)

The agent loop (pipeline.runtime.agent) adds this tool by itself, reading from its executor's
store, whenever one of its tools can produce artifacts (`may_store_artifacts`) and none is
already called `read_artifact`: an artifact observation says "the system will securely
retrieve the data for you", and this tool is how.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool

from pipeline.runtime.artifacts import ArtifactNotFound, ArtifactStore, InvalidArtifactId, LocalArtifactStore
from pipeline.runtime.protocol import ToolError, ToolErrorType


READ_ARTIFACT = "read_artifact"


def may_store_artifacts(tool: BaseTool | Callable[..., Any]) -> bool:
    """Whether the executor may turn a result of `tool` into an artifact (FULL level or a large result)."""
    metadata = (tool.metadata or {}) if isinstance(tool, BaseTool) else getattr(tool, "ctxlens_metadata", {})
    return bool(metadata.get("ctxlens_store_artifacts", True))


def needs_artifact_reader(tools: Iterable[BaseTool | Callable[..., Any]]) -> bool:
    """True when some tool can produce artifacts and none of them reads them back."""
    tools = list(tools)
    names = {tool.name if isinstance(tool, BaseTool) else getattr(tool, "__name__", "") for tool in tools}
    return READ_ARTIFACT not in names and any(may_store_artifacts(tool) for tool in tools)


def read_artifact_tool(store: ArtifactStore | None = None, *, max_chars: int = 20_000) -> StructuredTool:
    """A tool that lets the model read an artifact of `store` by id, a window of characters at a time.

    `store` is the one the executor keeps artifacts in (default: a LocalArtifactStore). Its
    results are never stored as artifacts again (metadata ctxlens_store_artifacts=False) and are
    shown at FULL level by default, so a window is never clipped to a STANDARD excerpt.
    """
    artifacts = store if store is not None else LocalArtifactStore()

    def read_artifact_window(artifact_id: str, offset: int = 0, limit: int = max_chars) -> str:
        """Read part of a stored artifact. artifact_id comes from an earlier observation."""
        try:
            content = artifacts.read(artifact_id.strip())
        except InvalidArtifactId as exc:
            raise ToolError(ToolErrorType.INVALID_INPUT, str(exc)) from None
        except ArtifactNotFound as exc:
            raise ToolError(ToolErrorType.NOT_FOUND, str(exc)) from None
        text = content.text
        start = max(0, offset)
        end = min(len(text), start + max(1, min(limit, max_chars)))
        header = f"{content.artifact_id} characters {start}-{end} of {len(text)} ({content.mime})"
        more = f"\n[{len(text) - end} more characters: call again with offset={end}]" if end < len(text) else ""
        return f"{header}\n\n{text[start:end]}{more}"

    return StructuredTool.from_function(
        read_artifact_window,
        name=READ_ARTIFACT,
        description="Read a stored artifact (a large earlier tool result) by its artifact_id, "
        f"up to {max_chars} characters from offset.",
        # A window the model asked for is shown whole (max_chars bounds it), never clipped by a level.
        metadata={"ctxlens_store_artifacts": False, "ctxlens_output_level": "full"},
    )
