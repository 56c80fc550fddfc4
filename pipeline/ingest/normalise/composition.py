"""What filled an LLM call's context window, by category, from its input messages.

Categories are those of `pipeline.semconv.CONTEXT_CATEGORIES`: system, skills, user,
assistant, tool_observations, compressed_summaries, and free (window minus used).

Two ways to measure, chosen by what the span carries:
- it reported its input token count: that count is the truth and only its split is unknown,
  so the count is divided across categories in proportion to their UTF-8 size (an image, audio
  or file part takes what the count leaves over the text's tokens at the usual rate, up to what
  the runtime's rule counts it). This costs
  microseconds, so it is done while ingesting (tokenising the same text costs ~0.5 ms a call);
- it did not: each message is counted once by the runtime's rule
  (`pipeline.tokens.counting.count_messages`: per-message overhead, OTel GenAI parts, media
  blocks), after the response (pipeline.ingest.write.deferred), and those per-message counts
  give both the input total and this split.
"""

from __future__ import annotations

from typing import Any

from pipeline.ingest.normalise.messages import Message
from pipeline.tokens.counting import MEDIA_TOKENS, scale_to_total

ROLE_CATEGORY = {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool_observations"}
USED_CATEGORIES = ("system", "skills", "user", "assistant", "tool_observations", "compressed_summaries")
BYTES_PER_TOKEN = 4  # the usual rough rate of text


def digest_weights(digest: list[dict[str, Any]], input_tokens: int) -> list[float]:
    """Each message's weight, in bytes, in the split of a reported input token count, from its
    digest entry (pipeline.ingest.normalise.digest): its text's UTF-8 size; and, when the count
    leaves more than the text's tokens at BYTES_PER_TOKEN, a share of that rest for each media part,
    up to the MEDIA_TOKENS the runtime's rule counts one (an image's bytes in the span, a URL or
    base64 the model does not read as text, say nothing of its tokens; the rest also holds tool
    definitions and per-message overhead, which the text's split takes as before)."""
    text = [max(int(entry.get("bytes", 0)), 0) for entry in digest]
    media = [int(entry.get("media", 0)) for entry in digest]
    rest = input_tokens * BYTES_PER_TOKEN - sum(text)
    if rest <= 0 or not any(media):
        return text
    per_part = min(rest / sum(media), MEDIA_TOKENS * BYTES_PER_TOKEN)
    return [size + per_part * parts for size, parts in zip(text, media, strict=True)]


def category_of(message: Message) -> str:
    """The context category a message counts under, by its role."""
    return ROLE_CATEGORY.get(str(message.get("role", "")), "user")


def _with_free(used: dict[str, int], window: int | None) -> dict[str, int]:
    return {**used, "free": max(0, (window or 0) - sum(used.values()))}


def composition_from_sizes(digest: list[dict[str, Any]], input_tokens: int, window: int | None) -> dict[str, int]:
    """The reported input tokens split in proportion to each category's weight (`digest_weights`:
    its text's UTF-8 size, and what the count leaves to its media parts), read from the messages'
    digest (pipeline.ingest.normalise.digest), so the texts are not built and encoded a second time."""
    sizes: dict[str, float] = dict.fromkeys(USED_CATEGORIES, 0)  # counts stay ints when nothing is measured
    for entry, weight in zip(digest, digest_weights(digest, input_tokens), strict=True):
        sizes[entry["category"]] += weight
    return _with_free(scale_to_total(sizes, input_tokens), window)


def composition_from_counts(
    messages: list[Message], per_message: list[int], input_tokens: int, window: int | None
) -> dict[str, int]:
    """Per-message token counts summed by category; scaled to the reported input tokens when
    the span reported some (then they are the truth and only the split is ours)."""
    used = dict.fromkeys(USED_CATEGORIES, 0)
    for message, tokens in zip(messages, per_message, strict=True):
        used[category_of(message)] += tokens
    return _with_free(scale_to_total(used, input_tokens) if input_tokens else used, window)
