"""What changed in an LLM call's input since the previous call of its stream.

Works on digests (pipeline.ingest.normalise.digest), never on the messages themselves: the kept prefix
is what a provider's prompt cache can reuse; past it, messages are matched by content hash into
added, removed and changed ones. A cache break is an input that does not extend the previous
one (the previous input is not its prefix); a compression recorded between the two calls
explains it (`Compressions.explain`), anything else is an edit.

Which call is "the previous" one is the stream's business (pipeline.insight.conversation_rows.
read_streams); `extends` and `shares_a_message` are the digest tests it decides with.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from difflib import SequenceMatcher
from functools import cached_property
from typing import Any, Protocol

from pipeline.ingest.normalise.digest import Digest, message_tokens


class Timed(Protocol):
    """A call as `Compressions.explain` reads it (an LLMCall or an insight CallRow)."""

    @property
    def pk(self) -> int: ...

    @property
    def started_at(self) -> datetime: ...


@dataclass(frozen=True)
class CallInput:
    """What a diff needs of one call: its id, its input digest and its input token count."""

    id: int
    digest: Digest
    input_tokens: int

    @cached_property
    def tokens(self) -> list[int]:
        """Each message's tokens; kept, as a call is diffed twice (with its predecessor and successor)."""
        return message_tokens(self.digest, self.input_tokens)


def _item(digest: Digest, tokens: list[int], index: int) -> dict[str, Any]:
    entry = digest[index]
    return {"index": index, "role": entry.get("role", ""), "category": entry.get("category", ""),
            "tokens": tokens[index]}


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _by_category(digest: Digest, tokens: list[int]) -> Counter:
    sums: Counter = Counter()
    for entry, n in zip(digest, tokens, strict=True):
        sums[entry.get("category", "")] += n
    return sums


def extends(previous: Digest, current: Digest) -> bool:
    """Whether `current` starts with every message of `previous` (by hash): a prompt cache that
    held `previous` serves all of it to `current`."""
    return len(previous) <= len(current) and all(
        a is b or a.get("hash") == b.get("hash") for a, b in zip(previous, current, strict=False))


def shares_a_message(a: Digest, b: Digest) -> bool:
    """Whether any message of `a` is also in `b` (by hash)."""
    return not {entry.get("hash") for entry in a}.isdisjoint(entry.get("hash") for entry in b)


@dataclass(frozen=True)
class Compressions:
    """A conversation's recorded compressions: when each happened (sorted) and the LLM calls
    ingest linked them to (pipeline.ingest.write.linking.link_compressions)."""

    times: list[datetime]
    linked_call_ids: frozenset[int]

    @classmethod
    def of(cls, rows: Iterable[tuple[datetime, int | None]]) -> Compressions:
        """From (occurred_at, llm_call_id) rows, in any order."""
        rows = list(rows)
        return cls(sorted(at for at, _ in rows), frozenset(call_id for _, call_id in rows if call_id is not None))

    def explain(self, previous: Timed, current: Timed) -> bool:
        """Whether a compression explains that `current`'s input breaks `previous`'s prefix: one
        linked to `current`, or one that happened after `previous` started and no later than
        `current` did. The one rule of the diff and the findings alike."""
        if current.pk in self.linked_call_ids:
            return True
        after = bisect_right(self.times, previous.started_at)
        return after < len(self.times) and self.times[after] <= current.started_at


def diff_inputs(previous: CallInput | None, current: CallInput, compressed_between: bool = False) -> dict[str, Any]:
    """The diff of `current`'s input against `previous`'s (None: the first call of its stream).

    Indexes of `added` and `changed` are positions in the current input, of `removed` in the
    previous one; a changed item also names its `previous_index` and `previous_tokens`.
    `token_delta` is the change in reported input tokens; `token_delta_by_category` sums the
    listed messages (added +, removed −, changed new − old), so messages both inputs keep never
    show as a change even though each call's count is split over its messages anew.
    `uncacheable_tokens` are the current tokens of messages both inputs share that sit past the
    broken prefix: what a prompt cache held and can no longer serve.
    A current call without input messages (none recorded) lists no message changes.
    """
    cur_tokens = current.tokens
    if previous is None:
        return {
            "previous_call_id": None, "kept_prefix_messages": 0, "kept_prefix_tokens": 0,
            "added": [_item(current.digest, cur_tokens, i) for i in range(len(current.digest))],
            "removed": [], "changed": [], "token_delta": current.input_tokens,
            "token_delta_by_category": {k: v for k, v in _by_category(current.digest, cur_tokens).items() if v},
            "cache_break": False, "cache_break_reason": None, "uncacheable_tokens": 0,
        }
    if not current.digest and previous.digest:
        # The span carried no input messages (content capture off, or not sent): nothing is
        # known to have been kept, dropped or edited, so no cache break is claimed either.
        return {
            "previous_call_id": previous.id, "kept_prefix_messages": 0, "kept_prefix_tokens": 0,
            "added": [], "removed": [], "changed": [], "token_delta": current.input_tokens - previous.input_tokens,
            "token_delta_by_category": {}, "cache_break": False, "cache_break_reason": None,
            "uncacheable_tokens": 0,
        }
    prev_tokens = previous.tokens
    prev_hashes = [e.get("hash") for e in previous.digest]
    cur_hashes = [e.get("hash") for e in current.digest]
    kept = _common_prefix(prev_hashes, cur_hashes)
    added, removed, changed = [], [], []
    uncacheable = 0
    matcher = SequenceMatcher(None, prev_hashes[kept:], cur_hashes[kept:], autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        i1, i2, j1, j2 = i1 + kept, i2 + kept, j1 + kept, j2 + kept
        if op == "equal":
            uncacheable += sum(cur_tokens[j1:j2])
            continue
        pairs = min(i2 - i1, j2 - j1) if op == "replace" else 0
        for k in range(pairs):
            item = _item(current.digest, cur_tokens, j1 + k)
            changed.append({**item, "previous_index": i1 + k, "previous_tokens": prev_tokens[i1 + k]})
        removed += [_item(previous.digest, prev_tokens, i) for i in range(i1 + pairs, i2)]
        added += [_item(current.digest, cur_tokens, j) for j in range(j1 + pairs, j2)]
    by_category: Counter = Counter()
    for item in added:
        by_category[item["category"]] += item["tokens"]
    for item in removed:
        by_category[item["category"]] -= item["tokens"]
    for item in changed:
        by_category[item["category"]] += item["tokens"]
        by_category[previous.digest[item["previous_index"]].get("category", "")] -= item["previous_tokens"]
    cache_break = kept < len(previous.digest)
    return {
        "previous_call_id": previous.id,
        "kept_prefix_messages": kept,
        "kept_prefix_tokens": sum(cur_tokens[:kept]),
        "added": added,
        "removed": removed,
        "changed": changed,
        "token_delta": current.input_tokens - previous.input_tokens,
        "token_delta_by_category": {k: v for k, v in sorted(by_category.items()) if v},
        "cache_break": cache_break,
        "cache_break_reason": ("compression" if compressed_between else "edit") if cache_break else None,
        "uncacheable_tokens": uncacheable if cache_break else 0,
    }
