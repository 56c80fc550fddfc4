"""The context-window bar of one LLM call: what filled the window, by category, against its maximum.

The picture Claude Code's `/context` gives, for any agent: segments in the order of
pipeline.semconv.CONTEXT_CATEGORIES, each with tokens and its share of the window.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.ingest.normalise.values import MAX_COUNT
from pipeline.models import LLMCall
from pipeline.semconv import CONTEXT_CATEGORIES

LABELS = {
    "system": "System",
    "skills": "Skills",
    "user": "User",
    "assistant": "Assistant",
    "tool_observations": "Tool observations",
    "compressed_summaries": "Compressed summaries",
    "free": "Free",
    "other": "Other",
}
USED_CATEGORIES = tuple(c for c in CONTEXT_CATEGORIES if c != "free")


@dataclass(frozen=True)
class Segment:
    category: str
    label: str
    tokens: int
    percent: float  # of the bar's scale (the window when known)

    # Formatted here, not with the floatformat filter: a page of the timeline draws hundreds.
    @property
    def width(self) -> str:
        return f"{self.percent:.3f}"

    @property
    def share(self) -> str:
        return f"{self.percent:.1f}"


@dataclass(frozen=True)
class ContextBar:
    window: int | None
    used: int
    segments: list[Segment]  # categories with tokens, then free space
    approximate: bool = False  # counted with a tokenizer that only approximates the model's: "≈"

    @property
    def percent_used(self) -> float | None:
        return 100.0 * self.used / self.window if self.window else None

    @property
    def over_window(self) -> bool:
        return bool(self.window) and self.used > self.window

    @property
    def summary(self) -> str:
        """One line for screen readers and tooltips."""
        parts = ", ".join(f"{s.label} {s.tokens:,}" for s in self.segments)
        scale = f" of {self.window:,}" if self.window else ""
        about = "about " if self.approximate else ""
        return f"{about}{self.used:,}{scale} tokens used: {parts}"


def category_tokens(value: object) -> int:
    """A stored count of one category's tokens, as a count: 0..MAX_COUNT (what ingest keeps them
    within now; rows stored before may hold any JSON)."""
    return min(value, MAX_COUNT) if isinstance(value, int) and value > 0 else 0


def used_by_category(composition: dict, fallback_total: int) -> dict[str, int]:
    """Tokens per used category; what the composition does not explain counts as "other"."""
    used = {c: category_tokens(composition.get(c)) for c in USED_CATEGORIES}
    explained = sum(used.values())
    if fallback_total > explained:
        used["other"] = fallback_total - explained
    return {c: n for c, n in used.items() if n}


def context_bar(call: LLMCall) -> ContextBar:
    composition = call.context_composition if isinstance(call.context_composition, dict) else {}
    total = call.context_tokens or call.input_tokens or 0
    used = used_by_category(composition, total)
    used_total = sum(used.values())
    window = call.context_window if call.context_window and call.context_window > 0 else None
    scale = max(window or 0, used_total) or 1
    segments = [Segment(c, LABELS[c], n, 100.0 * n / scale) for c, n in used.items()]
    if window and window > used_total:
        free = window - used_total
        segments.append(Segment("free", LABELS["free"], free, 100.0 * free / scale))
    return ContextBar(window=window, used=used_total, segments=segments, approximate=call.tokens_approximate)


def usage_series(calls: list[LLMCall]) -> dict[str, object]:
    """Per-call tokens by category, for the conversation's context chart (stacked bars)."""
    datasets = {c: [] for c in (*USED_CATEGORIES, "other")}
    windows: list[int | None] = []
    for call in calls:
        composition = call.context_composition if isinstance(call.context_composition, dict) else {}
        used = used_by_category(composition, call.context_tokens or call.input_tokens or 0)
        for category, values in datasets.items():
            values.append(used.get(category, 0))
        windows.append(call.context_window)
    return {
        "labels": [f"#{i}" for i in range(1, len(calls) + 1)],
        "ids": [call.pk for call in calls],
        "categories": [
            {"key": c, "label": LABELS[c], "values": v} for c, v in datasets.items() if any(v)
        ],
        "window": windows,
    }
