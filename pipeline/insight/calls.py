"""Each LLM call's input against the previous call of its stream, one call or many at once.

"Previous" is what the findings take too: the latest earlier call of the same stream
(pipeline.insight.conversation_rows.read_streams), so a tool's own LLM call or a second span of
one call is never compared with the agent's loop; a compression explains a broken prefix by the
findings' rule as well (pipeline.insight.diff.Compressions.explain).

Only digests and token counts are read, never the messages: the timeline asks for the diff of
every call it shows, and one call's input can be megabytes. A stream can start long before the
calls asked about, so every earlier call's input digest is read, as text, and only what an
input adds to the one it extends is decoded: two queries per conversation. One call that extends
the input of the call just before it (most do) needs only the two. Many calls at once (a page of
the timeline) are read from WINDOW_LOOKBACK calls before the first of them, so a page costs what
it shows, not what came before it: a stream whose previous call lies further back than that
shows as starting there.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from django.db.models import Q

from pipeline.insight.conversation_rows import (WINDOW_LOOKBACK, CallRow, lookback_start, read_compressions,
                                                read_inputs_until)
from pipeline.insight.diff import CallInput, Compressions, diff_inputs
from pipeline.models import LLMCall

# What call_diffs reads of the calls it is given (it reads their digests itself); callers load at
# least these (a deferred one would cost a query per call).
DIGEST_FIELDS = ("id", "conversation_id", "started_at")


def _call_input(row: CallRow) -> CallInput:
    return CallInput(row.pk, row.input, row.input_tokens or 0)


def _diff(row: CallRow, compressions: Compressions) -> dict[str, Any]:
    previous = row.previous
    if previous is None:
        return diff_inputs(None, _call_input(row))
    return diff_inputs(_call_input(previous), _call_input(row), compressions.explain(previous, row))


def _row(call: LLMCall) -> CallRow | None:
    """`call` read with its stream. Most calls extend the input of the call just before them,
    which is then the latest call they extend (read_streams takes it): the two calls settle it, as
    they do for the conversation's first call and for a call whose input was not recorded. Else
    every call before it is read, as its stream may have begun anywhere."""
    rows = read_inputs_until(call, latest=2)
    if rows and rows[-1].pk == call.pk and (len(rows) == 1 or rows[-1].added is not None or not rows[-1].input):
        return rows[-1]
    return next((row for row in reversed(read_inputs_until(call)) if row.pk == call.pk), None)


def previous_call_id(call: LLMCall) -> int | None:
    """The id of the call `call` follows in its stream (None: it opens one)."""
    row = _row(call)
    return row.previous.pk if row is not None and row.previous is not None else None


def call_diff(call: LLMCall) -> dict[str, Any]:
    """`call`'s input against the previous call's of its stream (pipeline.insight.diff.diff_inputs):
    two queries for a call that extends the call just before it, three for another."""
    row = _row(call)
    if row is None:  # deleted since the caller loaded it (retention): nothing left to compare
        return diff_inputs(None, CallInput(call.pk, [], 0))
    return _diff(row, read_compressions(call.conversation_id))


def _conversation_diffs(calls: list[LLMCall]) -> dict[int, dict[str, Any]]:
    """Diffs of `calls`, all of one conversation: three queries."""
    first = min(calls, key=lambda call: (call.started_at, call.pk))
    last = max(calls, key=lambda call: (call.started_at, call.pk))
    # started_at <= first, then the tie broken by pk: a bound an index on started_at can seek to.
    before = Q(started_at__lte=first.started_at) & (Q(started_at__lt=first.started_at) | Q(pk__lt=first.pk))
    since = lookback_start(last.conversation_id, before, WINDOW_LOOKBACK)
    rows = {row.pk: row for row in read_inputs_until(last, since=since)}
    compressions = read_compressions(last.conversation_id, since)
    # A call deleted since the caller loaded it (retention) has nothing left to compare.
    return {call.pk: _diff(rows[call.pk], compressions) if call.pk in rows
            else diff_inputs(None, CallInput(call.pk, [], 0)) for call in calls}


def call_diffs(calls: Sequence[LLMCall]) -> dict[int, dict[str, Any]]:
    """The diff of every call in `calls` (loaded with at least DIGEST_FIELDS), by call id, in three
    queries per conversation whatever the number of calls."""
    by_conversation: dict[int, list[LLMCall]] = defaultdict(list)
    for call in calls:
        by_conversation[call.conversation_id].append(call)
    diffs: dict[int, dict[str, Any]] = {}
    for group in by_conversation.values():
        diffs.update(_conversation_diffs(group))
    return diffs
