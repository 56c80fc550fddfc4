"""The tool protocol: what the agent asks a tool to do, and what comes back.

Five orthogonal concepts from the design documents meet here:
- the *observation* is what the model reads (a plain string);
- the *output level* (BRIEF / STANDARD / FULL) is how detailed that string is;
- the *carrier* is LangChain: a request is built from `AIMessage.tool_calls[i]` and a result
  goes back as a `ToolMessage` whose `tool_call_id` is the model's own id (never generated);
  the Claude-style `tool_result` content block is only a debug/export view.

Public API (used by the executor, skills and the agent loop):
- `OutputLevel` (with `format_observation(data, level)` and `effective_level(explicit, tool,
  usage)` in pipeline.runtime.observations)
- `ToolErrorType` (`.error_class`: retryable / permanent / needs a person; from
  pipeline.runtime.errors), `ToolError` (raise it from a tool to classify a failure),
  `classify_exception(exc)`, `format_error_observation(...)`
- `CachePolicy` (`.ttl_seconds`), `ToolInvocationRequest.from_tool_call(tool_call, ...)`,
  `ToolInvocationRequest.idempotency_key`
- `ToolExecutionResult` (`.content`, `.to_tool_message()`, `.to_content_block()`)
- `ContextModifier` (what an active skill allows), `ExecutionContext` (per-call agent state)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any

from langchain_core.messages import ToolMessage

# The error taxonomy lives in pipeline.runtime.errors (no LangChain there, for the server); re-exported.
from pipeline.runtime.errors import LEGACY_ERROR_TYPES, ToolErrorClass, ToolErrorType, canonical_error_type  # noqa: F401
from pipeline.runtime.observations import OutputLevel


class ToolError(Exception):
    """Raise from a tool to say why it failed: `raise ToolError(ToolErrorType.RATE_LIMIT, "slow down")`."""

    def __init__(self, error_type: ToolErrorType | str, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.error_type = ToolErrorType(error_type)
        self.message = message
        self.code = code or self.error_type.code


class MissingToolCallId(ValueError):
    """A tool call without the model's id cannot be answered: ids are never generated."""


def classify_exception(exc: BaseException) -> ToolErrorType:
    """Map an exception a tool raised onto a ToolErrorType."""
    if isinstance(exc, ToolError):
        return exc.error_type
    if isinstance(exc, TimeoutError):
        return ToolErrorType.TIMEOUT
    if isinstance(exc, ConnectionError):
        return ToolErrorType.NETWORK
    if isinstance(exc, PermissionError):
        return ToolErrorType.PERMISSION_DENIED
    if isinstance(exc, FileNotFoundError | LookupError):
        return ToolErrorType.NOT_FOUND
    if isinstance(exc, ValueError | TypeError):  # includes pydantic's ValidationError
        return ToolErrorType.INVALID_PARAMETERS
    return ToolErrorType.EXECUTION_ERROR


def format_error_observation(
    tool_call_id: str, error_type: ToolErrorType | str | None, error_code: str | None, error_message: str | None
) -> str:
    """The standard error observation every failed tool call shows the model."""
    kind = error_type.value if isinstance(error_type, ToolErrorType) else error_type
    return (
        "Operation failed.\n\n"
        f"Error Type: {kind or 'Unknown'}\n"
        f"Error Code: {error_code or 'UNKNOWN'}\n"
        f"Error Message: {error_message or 'An unknown error occurred'}\n\n"
        f"Tool Call ID: {tool_call_id}"
    )


class CachePolicy(str, Enum):
    """Whether a tool's results may be reused for an identical call. Tools with side effects: NO_CACHE.

    The seeds name CACHEABLE without a lifetime; it keeps results for one hour, the default
    lifetime of the seeds' IdempotencyCache.
    """

    NO_CACHE = "no_cache"
    CACHEABLE = "cacheable"  # 1 hour
    SHORT = "ttl_short"  # 5 minutes
    MEDIUM = "ttl_medium"  # 1 hour
    LONG = "ttl_long"  # 24 hours
    TTL_SHORT = "ttl_short"  # the seeds' names for the same three policies
    TTL_MEDIUM = "ttl_medium"
    TTL_LONG = "ttl_long"

    @property
    def ttl_seconds(self) -> int | None:
        return _CACHE_TTLS[self]


_CACHE_TTLS = {
    CachePolicy.NO_CACHE: None,
    CachePolicy.CACHEABLE: 3600,
    CachePolicy.SHORT: 300,
    CachePolicy.MEDIUM: 3600,
    CachePolicy.LONG: 86400,
}


def canonical_json(value: Any) -> str:
    """Stable JSON for hashing: sorted keys, no whitespace, non-JSON values as str."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


@dataclass(frozen=True)
class ContextModifier:
    """What an active skill changes: the tools the model may call, the model, whether it may be invoked.

    `allowed_tools=None` means every tool is allowed; an empty set means none is.
    """

    allowed_tools: frozenset[str] | None = None
    model: str | None = None
    disable_model_invocation: bool = False

    def allows(self, tool_name: str) -> bool:
        return self.allowed_tools is None or tool_name in self.allowed_tools

    def narrow(self, inner: ContextModifier) -> ContextModifier:
        """The modifier of a nested activation: tools intersect, the inner model wins, disabling sticks."""
        if self.allowed_tools is None or inner.allowed_tools is None:
            tools = inner.allowed_tools if self.allowed_tools is None else self.allowed_tools
        else:
            tools = self.allowed_tools & inner.allowed_tools
        return ContextModifier(
            allowed_tools=tools,
            model=inner.model or self.model,
            disable_model_invocation=self.disable_model_invocation or inner.disable_model_invocation,
        )

    def to_dict(self) -> dict[str, Any]:
        tools = None if self.allowed_tools is None else sorted(self.allowed_tools)
        return {"allowed_tools": tools, "model": self.model, "disable_model_invocation": self.disable_model_invocation}


@dataclass(frozen=True)
class ExecutionContext:
    """Agent-side state one tool call runs in; every field is optional.

    `conversation` is handed to the artifact store as it is (the server's store links its
    artifacts to that conversation record; the local store keeps a string id),
    `context_usage` the share (0..1) of the model's window in use, `model` the name used to
    count observation tokens (the modifier's model wins).
    """

    modifier: ContextModifier | None = None
    context_usage: float = 0.0
    model: str | None = None
    conversation: Any = None


@dataclass(frozen=True)
class ToolInvocationRequest:
    """One tool call the model asked for. Build it with `from_tool_call`, never with an invented id."""

    tool_call_id: str
    tool_name: str
    parameters: dict[str, Any]
    tool_version: str = "1.0.0"
    output_level: OutputLevel | None = None
    timeout_ms: int | None = 120_000  # None runs the tool inline, without a deadline
    retry_on_timeout: bool = True
    caller_id: str = "agent"
    permission_level: str = "default"
    cache_policy: CachePolicy = CachePolicy.NO_CACHE

    def __post_init__(self) -> None:
        if not isinstance(self.tool_call_id, str) or not self.tool_call_id:
            raise MissingToolCallId("a tool call needs the id the model gave it")

    @classmethod
    def from_tool_call(cls, tool_call: Mapping[str, Any], **options: Any) -> ToolInvocationRequest:
        """From `AIMessage.tool_calls[i]` ({"id", "name", "args"}); options are the other fields.

        Raises MissingToolCallId when the model's id is absent or empty.
        """
        call_id = tool_call.get("id")
        if not call_id:
            raise MissingToolCallId(f"tool call {tool_call.get('name')!r} has no id; ids are never generated")
        args = tool_call.get("args") or {}
        if not isinstance(args, Mapping):
            raise ValueError(f"tool call {call_id!r} has non-object arguments")
        if options.get("output_level") is not None:
            options["output_level"] = OutputLevel.parse(options["output_level"])
        return cls(tool_call_id=str(call_id), tool_name=str(tool_call.get("name") or ""), parameters=dict(args), **options)

    @property
    def idempotency_key(self) -> str:
        """sha256 of tool name, version, parameters, caller and permission level — not the call id,
        so an identical call in a later round can reuse the result."""
        identity = {
            "tool": self.tool_name,
            "version": self.tool_version,
            "parameters": self.parameters,
            "caller": self.caller_id,
            "permission": self.permission_level,
        }
        return hashlib.sha256(canonical_json(identity).encode()).hexdigest()

    @property
    def input_bytes(self) -> int:
        return len(canonical_json(self.parameters).encode())


@dataclass
class ToolExecutionResult:
    """The single result model (v2.0.1): the observation plus everything recorded about the call."""

    tool_call_id: str
    tool_name: str
    observation: str
    success: bool
    output_level: OutputLevel = OutputLevel.STANDARD
    artifact_id: str | None = None
    data_size_bytes: int = 0
    data_hash: str | None = None
    data_summary: str | None = None
    retry_count: int = 0
    last_error: str | None = None
    error_type: ToolErrorType | None = None
    error_code: str | None = None
    error_message: str | None = None
    duration_ms: float = 0.0
    observation_tokens: int = 0
    observation_tokens_approximate: bool = False  # counted with a tokenizer that approximates the model's
    cache_hit: bool = False
    partial: bool = False  # a timeout that still carries what the tool yielded before it (in observation)
    attempts: list[dict[str, Any]] = field(default_factory=list)  # per attempt: error type and timeout

    @classmethod
    def failure(
        cls,
        tool_call_id: str,
        tool_name: str,
        error_type: ToolErrorType,
        message: str,
        *,
        code: str | None = None,
        output_level: OutputLevel = OutputLevel.STANDARD,
        **extra: Any,
    ) -> ToolExecutionResult:
        """A failed call; its observation is the standard error text."""
        code = code or error_type.code
        return cls(
            tool_call_id=tool_call_id,
            tool_name=tool_name,
            observation=format_error_observation(tool_call_id, error_type, code, message),
            success=False,
            output_level=output_level,
            error_type=error_type,
            error_code=code,
            error_message=message,
            last_error=message,
            **extra,
        )

    @property
    def status(self) -> str:
        return "success" if self.success else "error"

    @property
    def content(self) -> str:
        """What the model reads: the observation, or the standard error text for a failure
        (followed by the partial observation when a timed-out tool had yielded some items)."""
        if self.success:
            return self.observation
        error = format_error_observation(self.tool_call_id, self.error_type, self.error_code, self.error_message)
        return f"{error}\n\n{self.observation}" if self.partial else error

    def to_tool_message(self) -> ToolMessage:
        """The LangChain carrier: a ToolMessage answering the model's tool call by its id."""
        return ToolMessage(
            content=self.content,
            tool_call_id=self.tool_call_id,
            name=self.tool_name or None,
            status=self.status,
            artifact={"artifact_id": self.artifact_id} if self.artifact_id else None,
        )

    def to_content_block(self) -> dict[str, Any]:
        """Claude-style `tool_result` block: a debug/export view only."""
        return {"type": "tool_result", "tool_use_id": self.tool_call_id, "content": self.content, "is_error": not self.success}

    def for_call(self, tool_call_id: str, **changes: Any) -> ToolExecutionResult:
        """This result answering another call (a cache hit): the new id, nothing else shared by reference."""
        copy = replace(self, tool_call_id=tool_call_id, attempts=[], **changes)
        if not copy.success and not copy.partial:
            copy.observation = format_error_observation(tool_call_id, copy.error_type, copy.error_code, copy.error_message)
        return copy

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (for a shared cache, e.g. Redis, and telemetry)."""
        data = asdict(self)
        data["output_level"] = self.output_level.value
        data["error_type"] = self.error_type.value if self.error_type else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolExecutionResult:
        values = dict(data)
        values["output_level"] = OutputLevel(values.get("output_level") or "standard")
        values["error_type"] = ToolErrorType(values["error_type"]) if values.get("error_type") else None
        return cls(**values)
