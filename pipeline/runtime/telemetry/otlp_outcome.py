"""What one OTLP export came to, shared by the HTTP and gRPC clients."""

from __future__ import annotations

from dataclasses import dataclass


class ExportError(Exception):
    """The endpoint refused the data for good, or kept failing after every retry."""


@dataclass
class ExportResult:
    rejected_spans: int = 0
    message: str = ""
    attempts: int = 1


class Retry(Exception):
    """A retryable failure of one attempt; `delay` is the endpoint's requested wait, if it gave one."""

    def __init__(self, reason: str, delay: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay = delay
