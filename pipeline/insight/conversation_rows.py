"""What the insight checks read of a conversation's calls: a few columns and the digests, and
which call each call follows.

Streams. One conversation can hold several streams of LLM calls: the agent's own loop, a tool
that calls a model itself (to summarise a page, say), a sub-agent, or the same call recorded
twice (a framework's span and the provider SDK's span inside it). "The previous call" of a call
is therefore not the one just before it in time but the latest earlier call of its stream
(`read_streams`): the one whose input it extends, or failing that the latest that starts with
the same first message (the system prompt, or the first user message); failing that, the call
just before it in time when the two share a message (a stream whose system prompt was edited);
else none: the call opens a stream of its own. Only the STREAM_LOOKBACK latest calls with the
same first message are looked at, so a call costs a dict look-up and a few prefix comparisons.

Reading. An LLM call's input digest lists every message the call saw, so a conversation's
inputs together hold each message once per call that sees it: quadratic in its length.
`read_streams` reads an input whose JSON text extends an earlier input's (the same entries,
serialised the same way, then more) as the earlier entries plus the decoded additions, so only
what is new is decoded; the text comparison itself runs in C. The comparison needs an entry to
be printed the same way every time, which PostgreSQL's jsonb text does. On SQLite the text is as
written: by orjson on the ingest path (pipeline.ingest.write.sql.Prepare.json: no spaces), by
json.dumps where the ORM writes the row or orjson refuses a value (", " and ": "), so an input
written one way does not extend one written the other way as text; it is then decoded whole and
compared by its entries' hashes (`extends`), which links it all the same. An input that extends
no earlier input (a compression, an edit, a new stream) is decoded whole.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import groupby
from operator import itemgetter
from typing import Any

from django.db import connection
from django.db.models import ExpressionWrapper, F, FloatField, Q, Subquery, TextField
from django.db.models.functions import Cast, Coalesce, NullIf

from pipeline.ingest.write import sql
from pipeline.insight.diff import Compressions, extends, shares_a_message
from pipeline.models import CompressionEvent, LLMCall, ToolCall

CALL_FIELDS = ("id", "started_at", "input_tokens", "round_id", "model", "context_tokens", "context_window",
               "output_digest")
TOOL_FIELDS = ("round_id", "llm_call_id", "started_at", "tool_name", "tool_call_id", "arguments_text",
               "observation_tokens", "success", "error_type", "error_code", "error_message", "retry_count")
STREAM_LOOKBACK = 16  # earlier calls with the same first message a call may follow
# A window of a conversation's calls (a page of its turns) is read with this many calls before it:
# what its first calls follow. A stream whose previous call lies further back starts there.
WINDOW_LOOKBACK = 32
# read_conversations fetches the LLM calls of its conversations this many rows at a time: their
# input texts are the bulk of what is read, and only about one conversation's are kept at once.
CALL_ROWS_FETCHED = 200

Entry = dict[str, Any]
_DECODER = json.JSONDecoder()
_ARRAY_START = re.compile(r"\s*\[\s*")


@dataclass(slots=True, eq=False)
class CallRow:
    """What the checks read of an LLM call, and the call it follows in its stream (`previous`,
    None: it opens a stream). `added` holds the digest entries its input adds to `previous`'s when
    it extends that input, else None."""

    pk: int
    started_at: datetime
    input_tokens: int
    round_id: int | None = None
    model: str = ""
    context_tokens: int | None = None
    context_window: int | None = None
    output: list[Entry] = field(default_factory=list)
    input: list[Entry] = field(default_factory=list)
    added: list[Entry] | None = None
    previous: CallRow | None = field(default=None, repr=False)


@dataclass(slots=True)
class ToolRow:
    """What the checks read of a tool call: no observation, only its counted tokens; its arguments
    as JSON text (`arguments_text`), decoded by the one check that reads them, and only for the
    tools that may repeat (`arguments`)."""

    pk: int
    round_id: int | None
    llm_call_id: int | None
    started_at: datetime
    tool_name: str
    tool_call_id: str
    arguments_text: str | None
    observation_tokens: int
    success: bool
    error_type: str
    error_code: str
    error_message: str
    retry_count: int

    @property
    def arguments(self) -> Any:
        """The arguments as the ORM reads the JSON column: text that is not JSON reads as itself."""
        return ToolCall._meta.get_field("arguments").from_db_value(self.arguments_text, None, connection)


def _input_text() -> Cast:
    return Cast("input_digest", TextField())  # decoded by read_streams, only what is new


@dataclass(frozen=True)
class ConversationRows:
    """What `read_conversation` read: LLM calls and tool calls in time order, the compressions
    (from the first call read on, to the end), and how many LLM calls of the conversation come
    before the first call read."""

    calls: list[CallRow]
    tools: list[ToolRow]
    compressions: Compressions
    calls_before: int = 0


def up_to_latest_call(conversation_id: int) -> Q:
    """LLM calls started no later than the conversation's latest (true of all of them): a bound for
    a window open at its end. Without it, PostgreSQL's planner, which cannot tell that a long
    conversation's calls all precede most other conversations' calls, may walk the started_at
    index from the window's start to the newest call of any conversation."""
    latest = LLMCall.objects.filter(conversation_id=conversation_id).order_by("-started_at").values("started_at")[:1]
    return Q(started_at__lte=Subquery(latest))


def read_conversation(conversation_id: int, since: datetime | None = None,
                      until: datetime | None = None, lookback: int = 0) -> ConversationRows:
    """The conversation's LLM calls and tool calls in time order, with their inputs and streams
    read, and its compressions. With `since` / `until`, only those started in [since, until), plus
    the `lookback` LLM calls before `since` (and what started since the first of them), which give
    the first calls of the span the calls they follow: a few queries, whatever the conversation's
    length."""
    start = since if since is None or not lookback else lookback_start(conversation_id, Q(started_at__lt=since),
                                                                         lookback)
    span = Q()
    if start is not None:
        span &= Q(started_at__gte=start)
    if until is not None:
        span &= Q(started_at__lt=until)
    bounded = span if until is not None else span & up_to_latest_call(conversation_id)
    calls = call_rows(LLMCall.objects.filter(bounded, conversation_id=conversation_id).order_by("started_at", "id")
                      .annotate(input_text=_input_text()).values_list(*CALL_FIELDS, "input_text"))
    tools = [ToolRow(*row) for row in ToolCall.objects.filter(span, conversation_id=conversation_id)
             .order_by("started_at", "id").annotate(arguments_text=Cast("arguments", TextField()))
             .values_list("id", *TOOL_FIELDS)]
    before = 0 if start is None else LLMCall.objects.filter(conversation_id=conversation_id,
                                                             started_at__lt=start).count()
    return ConversationRows(calls, tools, read_compressions(conversation_id, start), before)


def read_conversations(conversation_ids: Iterable[int]) -> Iterator[tuple[int, ConversationRows]]:
    """(id, what `read_conversation(id)` reads) for each of the conversations, whole, in id order:
    three queries for them all, one per table. The LLM calls come in one query ordered by
    conversation and time, fetched CALL_ROWS_FETCHED rows at a time, and each conversation is
    yielded as soon as its calls are read, so only about one conversation's inputs are held at once
    (its tool calls and compressions are read for all of them up front: they hold no digests).

    The queries are written here, not built by the ORM: for the finding counts of a chunk of
    conversations, building three querysets and converting each value of each row cost as much as
    the checks. The values read are those read_conversation reads: datetimes as sql.to_datetime
    makes them, JSON columns as text."""
    ids = sorted(set(conversation_ids))
    if not ids:
        return
    among = f"conversation_id IN ({sql.marks(ids)})"
    tools: dict[int, list[ToolRow]] = defaultdict(list)
    for conversation_id, pk, round_id, llm_call_id, started_at, *rest in sql.fetch(
            "SELECT conversation_id, id, round_id, llm_call_id, started_at, tool_name, tool_call_id, "
            "CAST(arguments AS text), observation_tokens, success, error_type, error_code, error_message, retry_count "
            f"FROM {sql.table(ToolCall)} WHERE {among} ORDER BY conversation_id, started_at, id", ids):
        tools[conversation_id].append(ToolRow(pk, round_id, llm_call_id, sql.to_datetime(started_at), *rest))
    compressions: dict[int, list[tuple[datetime, int | None]]] = defaultdict(list)
    for conversation_id, occurred_at, llm_call_id in sql.fetch(
            f"SELECT conversation_id, occurred_at, llm_call_id FROM {sql.table(CompressionEvent)} WHERE {among}", ids):
        compressions[conversation_id].append((sql.to_datetime(occurred_at), llm_call_id))
    rows = _fetched("SELECT conversation_id, id, started_at, input_tokens, round_id, model, context_tokens, "
                    "context_window, CAST(output_digest AS text), CAST(input_digest AS text) "
                    f"FROM {sql.table(LLMCall)} WHERE {among} ORDER BY conversation_id, started_at, id", ids)
    by_conversation = groupby(rows, key=itemgetter(0))
    group = next(by_conversation, None)
    for conversation_id in ids:
        calls: list[CallRow] = []
        if group is not None and group[0] == conversation_id:
            calls = call_rows((pk, sql.to_datetime(started_at), *rest) for _, pk, started_at, *rest in group[1])
            group = next(by_conversation, None)
        yield conversation_id, ConversationRows(calls, tools.pop(conversation_id, []),
                                                Compressions.of(compressions.pop(conversation_id, ())))


def _fetched(query: str, params: Sequence[Any]) -> Iterator[tuple]:
    """The rows of `query`, fetched CALL_ROWS_FETCHED at a time (from a server-side cursor on
    PostgreSQL, as the ORM's iterator() fetches them)."""
    with connection.chunked_cursor() as cursor:
        cursor.execute(query, params)
        while batch := cursor.fetchmany(CALL_ROWS_FETCHED):
            yield from batch


def call_rows(rows: Iterable[tuple]) -> list[CallRow]:
    """CallRows, with their inputs and streams read, from rows of CALL_FIELDS and the input's
    JSON text, in time order."""
    calls, texts = [], []
    for *columns, output, text in rows:
        calls.append(CallRow(*columns, entries(output)))
        texts.append(text)
    read_streams(calls, texts)
    return calls


def lookback_start(conversation_id: int, before: Q, lookback: int) -> datetime | None:
    """When the `lookback`-th latest LLM call of the conversation matching `before` started; None
    when fewer match (read from the beginning)."""
    earlier = (LLMCall.objects.filter(before, conversation_id=conversation_id).order_by("-started_at", "-id")
               .values_list("started_at", flat=True))
    return next(iter(earlier[lookback - 1:lookback]), None)


def read_inputs_until(call: LLMCall, latest: int | None = None, since: datetime | None = None) -> list[CallRow]:
    """The LLM calls of `call`'s conversation up to `call` itself (only the `latest` of them, or
    those started from `since` on, when given), in time order, with their inputs and streams read
    (no outputs): one query."""
    # started_at <= the call's, then the tie broken by pk: a bound an index on started_at can seek to.
    up_to = Q(started_at__lte=call.started_at) & (Q(started_at__lt=call.started_at) | Q(pk__lte=call.pk))
    if since is not None:
        up_to &= Q(started_at__gte=since)
    rows = (LLMCall.objects.filter(up_to, conversation_id=call.conversation_id).order_by("-started_at", "-id")
            .annotate(input_text=_input_text()).values_list("id", "started_at", "input_tokens", "input_text"))
    calls, texts = [], []
    for pk, started_at, input_tokens, text in list(rows if latest is None else rows[:latest])[::-1]:
        calls.append(CallRow(pk, started_at, input_tokens or 0))
        texts.append(text)
    read_streams(calls, texts)
    return calls


def full_call_from(conversation_id: int, since: datetime, share: float) -> bool:
    """Whether an LLM call started from `since` on filled `share` of its stored context window: one
    query, by the conversation's time index. A call whose window ingest has not stored yet (tokens
    are counted after the reply) does not count."""
    used = Coalesce(NullIf("context_tokens", 0), "input_tokens")
    limit = ExpressionWrapper(F("context_window") * share, output_field=FloatField())
    return (LLMCall.objects.filter(conversation_id=conversation_id, started_at__gte=since, context_window__gt=0)
            .alias(used=used).filter(used__gte=limit).exists())


def read_compressions(conversation_id: int, since: datetime | None = None) -> Compressions:
    """The conversation's compressions (those from `since` on, when given)."""
    events = CompressionEvent.objects.filter(conversation_id=conversation_id)
    if since is not None:
        events = events.filter(occurred_at__gte=since)
    return Compressions.of(events.values_list("occurred_at", "llm_call_id"))


def entries(value: Any) -> list[Entry]:
    """A digest's entries, from the list or its JSON text (anything else reads as no entries)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    return [entry for entry in value if isinstance(entry, dict)] if isinstance(value, list) else []


def first_hash(text: str) -> str | None:
    """The hash of the first entry of a digest's JSON text, decoding only that entry."""
    opening = _ARRAY_START.match(text)
    if opening is None:
        return None
    try:
        first, _ = _DECODER.raw_decode(text, opening.end())
    except ValueError:  # "[]", or not JSON
        return None
    value = first.get("hash") if isinstance(first, dict) else None
    return value if isinstance(value, str) else None


def read_streams(calls: list[CallRow], texts: Iterable[str | None]) -> None:
    """Fill each call's `input`, `added` and `previous` from its digest's JSON text; `calls` in
    time order (see the module docstring)."""
    same_first: dict[str, deque[tuple[CallRow, str]]] = defaultdict(lambda: deque(maxlen=STREAM_LOOKBACK))
    before: CallRow | None = None
    for call, text in zip(calls, texts, strict=True):
        text = text or "[]"
        first = first_hash(text)
        group = same_first[first] if first is not None else deque()
        call.previous = _extended(call, text, group)
        if call.previous is None:
            call.previous = group[-1][0] if group else _time_previous(before, call)
        if first is not None:
            group.append((call, text))
        before = call


def _extended(call: CallRow, text: str, group: deque[tuple[CallRow, str]]) -> CallRow | None:
    """The latest call of `group` whose input `call`'s extends (by hash), with `call.input` and
    `call.added` read; None when it extends none. The input is decoded whole only once the text
    of a candidate's input is not a prefix of its text."""
    decoded: list[Entry] | None = None
    for earlier, earlier_text in reversed(group):
        if decoded is None:
            tail = added_text(earlier_text, text)
            if tail is not None:
                call.added = entries(f"[{tail}]") if tail else []
                call.input = earlier.input + call.added
                return earlier
            decoded = entries(text)
        if extends(earlier.input, decoded):  # also when the same messages are printed differently
            call.input, call.added = decoded, decoded[len(earlier.input):]
            return earlier
    call.input = entries(text) if decoded is None else decoded
    return None


def _time_previous(before: CallRow | None, call: CallRow) -> CallRow | None:
    """`before`, the call just before `call`, when `call` shares a message with it (a stream whose
    first message changed: an edited system prompt) or has no input recorded; else None: `call`
    opens a stream (a tool's or a sub-agent's own model call)."""
    if before is not None and (not call.input or shares_a_message(before.input, call.input)):
        return before
    return None


def added_text(previous: str, text: str) -> str | None:
    """The JSON text of the array elements `text` has after those of `previous`, when `text`
    starts with every element of `previous`; None when it does not."""
    body = previous.rstrip()
    if not body.endswith("]"):
        return None
    body = body[:-1].rstrip()
    if not text.startswith(body):
        return None
    rest = text[len(body):].strip()
    if not rest.endswith("]"):
        return None
    if body.endswith("["):  # the previous array was empty
        return rest[:-1].strip()
    if rest == "]":
        return ""
    return rest[1:-1].strip() if rest.startswith(",") else None
