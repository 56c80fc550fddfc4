"""What filled an LLM call's context window, by category, from its input messages.

Categories are those of `pipeline.semconv.CONTEXT_CATEGORIES`: system, skills, user,
assistant, tool_observations, compressed_summaries, and free (window minus used).

Two ways to measure, chosen by what the span carries:
- it reported its input token count: that count is the truth and only its split is unknown,
  so the count is divided across categories in proportion to their UTF-8 size. This costs
  microseconds, so it is done while ingesting (tokenising the same text costs ~0.5 ms a call);
- it did not: each message is tokenised (`pipeline.tokens.counting.count_tokens`), after the response
  (pipeline.ingest.write.deferred).
"""

from __future__ import annotations

from collections.abc import Callable

from pipeline.ingest.normalise.messages import Message, message_text

ROLE_CATEGORY = {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool_observations"}
USED_CATEGORIES = ("system", "skills", "user", "assistant", "tool_observations", "compressed_summaries")


def _by_category(messages: list[Message], measure: Callable[[str], int]) -> dict[str, int]:
    sizes = dict.fromkeys(USED_CATEGORIES, 0)
    for message in messages:
        category = ROLE_CATEGORY.get(str(message.get("role", "")), "user")
        sizes[category] += measure(message_text(message))
    return sizes


def _scaled(sizes: dict[str, int], total: int) -> dict[str, int]:
    """`sizes` rescaled to add up to `total` exactly (the rounding drift goes to the largest)."""
    measured = sum(sizes.values())
    if not measured:
        return sizes
    scaled = {k: round(v * total / measured) for k, v in sizes.items()}
    largest = max(scaled, key=scaled.__getitem__)
    scaled[largest] += total - sum(scaled.values())
    return scaled


def _with_free(used: dict[str, int], window: int | None) -> dict[str, int]:
    return {**used, "free": max(0, (window or 0) - sum(used.values()))}


def composition_from_sizes(messages: list[Message], input_tokens: int, window: int | None) -> dict[str, int]:
    """The reported input tokens split in proportion to each category's UTF-8 size."""
    return _with_free(_scaled(_by_category(messages, lambda text: len(text.encode())), input_tokens), window)


def composition_from_tokens(
    messages: list[Message], model: str, input_tokens: int, window: int | None
) -> dict[str, int]:
    """Each category tokenised; scaled to the reported input tokens when there are any."""
    from pipeline.tokens.counting import count_tokens

    used = _by_category(messages, lambda text: count_tokens(text, model))
    return _with_free(_scaled(used, input_tokens) if input_tokens else used, window)
