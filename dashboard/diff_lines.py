"""One line per LLM call saying what changed in its input since the previous call, for the
timeline and the LLM call page alike: "+2 messages, +1.2k tokens; prefix kept 12 messages /
8.1k tokens", the provider's cache-read tokens beside the kept prefix, and a cache break.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dashboard.templatetags.ctxlens import tokens
from pipeline.insight.calls import call_diffs
from pipeline.models import LLMCall


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def signed_tokens(n: int) -> str:
    """+1.2k, −180, ±0: a change in tokens."""
    if n == 0:
        return "±0"
    return f"{'+' if n > 0 else '−'}{tokens(abs(n))}"


@dataclass(frozen=True)
class DiffLine:
    previous_call_id: int | None
    added: int
    removed: int
    changed: int
    token_delta: int
    kept_prefix_messages: int
    kept_prefix_tokens: int
    cache_read_tokens: int  # what the provider reported reading from its prompt cache; 0: not reported
    cache_break: bool
    cache_break_reason: str | None
    uncacheable_tokens: int

    @property
    def first(self) -> bool:
        return self.previous_call_id is None

    @property
    def changes(self) -> str:
        """"+2 messages, −1 message, 1 changed, +1.2k tokens" (the conversation's first call: its size)."""
        if self.first:
            return f"{_count(self.added, 'message')}, {tokens(self.token_delta)} tokens"
        parts = [f"+{_count(self.added, 'message')}"] if self.added else []
        parts += [f"−{_count(self.removed, 'message')}"] if self.removed else []
        parts += [f"{self.changed} changed"] if self.changed else []
        return ", ".join([*(parts or ["no new messages"]), f"{signed_tokens(self.token_delta)} tokens"])

    @property
    def prefix(self) -> str:
        if not self.kept_prefix_messages:
            return "no prefix kept"
        return (f"prefix kept {_count(self.kept_prefix_messages, 'message')} / "
                f"{tokens(self.kept_prefix_tokens)} tokens")


def diff_line(diff: dict[str, Any], cache_read_tokens: int) -> DiffLine:
    """The line of one diff (pipeline.insight.diff.diff_inputs) of a call that read `cache_read_tokens`."""
    return DiffLine(
        previous_call_id=diff["previous_call_id"], added=len(diff["added"]), removed=len(diff["removed"]),
        changed=len(diff["changed"]), token_delta=diff["token_delta"],
        kept_prefix_messages=diff["kept_prefix_messages"], kept_prefix_tokens=diff["kept_prefix_tokens"],
        cache_read_tokens=cache_read_tokens or 0, cache_break=diff["cache_break"],
        cache_break_reason=diff["cache_break_reason"], uncacheable_tokens=diff["uncacheable_tokens"],
    )


def diff_lines(calls: Sequence[LLMCall]) -> dict[int, DiffLine]:
    """The line of every call in `calls` (loaded with pipeline.insight.calls.DIGEST_FIELDS and
    cache_read_tokens), by call id, in a few queries whatever their number."""
    diffs = call_diffs(calls)
    return {call.pk: diff_line(diffs[call.pk], call.cache_read_tokens) for call in calls}
