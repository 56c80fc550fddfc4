"""What one OTLP export came to, shared by the HTTP and gRPC clients."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ExportError(Exception):
    """The endpoint refused the data for good, or kept failing after every retry."""


@dataclass
class ExportResult:
    rejected: int = 0  # the spans, or log records, the endpoint refused
    message: str = ""
    attempts: int = 1


def accepted_but(partial: Any) -> ExportResult:
    """The result a reply's partial_success gives, of a traces or a logs request."""
    rejected = partial.rejected_log_records if hasattr(partial, "rejected_log_records") else partial.rejected_spans
    return ExportResult(rejected=rejected, message=partial.error_message)


class Retry(Exception):
    """A retryable failure of one attempt; `delay` is the endpoint's requested wait, if it gave one."""

    def __init__(self, reason: str, delay: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay = delay
