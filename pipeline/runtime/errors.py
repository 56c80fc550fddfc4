"""Why a tool call failed: the design documents' ToolErrorType names in their three classes.

Its own module, free of LangChain, so the server's ingest and models read the same taxonomy the
runtime writes without loading the runtime's protocol (`pipeline.runtime.protocol` re-exports it).
"""

from __future__ import annotations

from enum import Enum


class ToolErrorClass(str, Enum):
    """The design documents' three kinds of failure: worth another attempt, never worth one, or
    one that a person has to look at (their "执行错误 (需人工介入)")."""

    RETRYABLE = "retryable"
    PERMANENT = "permanent"
    NEEDS_HUMAN = "needs_human"


class ToolErrorType(str, Enum):
    """Why a tool call failed: the design documents' ToolErrorType names and classes.

    `network` and `input_too_large` are ctxlens's own members. The names ctxlens used before
    (`rate_limited`, `transient`, `resource_unavailable`, `invalid_input`, `internal`) still
    parse (`ToolErrorType("rate_limited") is ToolErrorType.RATE_LIMIT`), so results in a shared
    cache and spans from older agents stay readable; their member names stay as aliases.
    """

    # Retryable: another attempt may succeed.
    TIMEOUT = "timeout"
    RATE_LIMIT = "rate_limit"
    RESOURCE_ERROR = "resource_error"
    TRANSIENT_ERROR = "transient_error"
    NETWORK = "network"
    # Permanent: the same call fails the same way.
    PERMISSION_DENIED = "permission_denied"
    INVALID_PARAMETERS = "invalid_parameters"
    NOT_FOUND = "not_found"
    VALIDATION_ERROR = "validation_error"
    INPUT_TOO_LARGE = "input_too_large"
    # Needs a person: the tool or what it depends on is broken.
    EXECUTION_ERROR = "execution_error"
    INTERNAL_ERROR = "internal_error"
    DEPENDENCY_ERROR = "dependency_error"

    # ctxlens's earlier member names (aliases of the members above).
    RATE_LIMITED = "rate_limit"
    TRANSIENT = "transient_error"
    RESOURCE_UNAVAILABLE = "resource_error"
    INVALID_INPUT = "invalid_parameters"
    INTERNAL = "internal_error"

    @classmethod
    def _missing_(cls, value: object) -> ToolErrorType | None:
        if isinstance(value, str):
            name = value.strip().lower()
            name = LEGACY_ERROR_TYPES.get(name, name)
            return cls._value2member_map_.get(name)  # type: ignore[return-value]
        return None

    @classmethod
    def parse(cls, value: str | None) -> ToolErrorType | None:
        """The member a stored or received name stands for (any case, old names too), else None."""
        try:
            return cls(value) if value else None
        except ValueError:
            return None

    @property
    def error_class(self) -> ToolErrorClass:
        return _CLASSES[self]

    @property
    def is_retryable(self) -> bool:
        return self.error_class is ToolErrorClass.RETRYABLE

    @property
    def is_permanent(self) -> bool:
        return self.error_class is ToolErrorClass.PERMANENT

    @property
    def needs_human(self) -> bool:
        return self.error_class is ToolErrorClass.NEEDS_HUMAN

    @property
    def code(self) -> str:
        """The default error code: the type's name, e.g. RATE_LIMIT."""
        return self.name


# ctxlens's earlier names → the design documents' names.
LEGACY_ERROR_TYPES = {
    "rate_limited": "rate_limit",
    "transient": "transient_error",
    "resource_unavailable": "resource_error",
    "invalid_input": "invalid_parameters",
    "internal": "internal_error",
}

_CLASSES = {
    **dict.fromkeys(
        (ToolErrorType.TIMEOUT, ToolErrorType.RATE_LIMIT, ToolErrorType.RESOURCE_ERROR,
         ToolErrorType.TRANSIENT_ERROR, ToolErrorType.NETWORK),
        ToolErrorClass.RETRYABLE,
    ),
    **dict.fromkeys(
        (ToolErrorType.PERMISSION_DENIED, ToolErrorType.INVALID_PARAMETERS, ToolErrorType.NOT_FOUND,
         ToolErrorType.VALIDATION_ERROR, ToolErrorType.INPUT_TOO_LARGE),
        ToolErrorClass.PERMANENT,
    ),
    **dict.fromkeys(
        (ToolErrorType.EXECUTION_ERROR, ToolErrorType.INTERNAL_ERROR, ToolErrorType.DEPENDENCY_ERROR),
        ToolErrorClass.NEEDS_HUMAN,
    ),
}


def canonical_error_type(name: str) -> str:
    """A received error type under the design documents' name (old ctxlens names renamed); any
    other name (an exception class, an instrumentation's own) unchanged."""
    member = ToolErrorType.parse(name)
    return member.value if member else name
