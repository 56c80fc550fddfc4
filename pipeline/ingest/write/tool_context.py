"""What each tool result costs the context: kept at ingest, per tool call, from a ledger of carries.

A tool result is re-sent with every later LLM call until it is dropped or compressed. Each LLM
call's input digest (pipeline.ingest.normalise.digest) says which tool_call_ids its messages
answer and, with `message_tokens`, how many of its input tokens each message took; a message
answering several ids is split evenly between them. Those shares are written to the ledger
(pipeline.models.carries: one row per carrying call and tool_call_id, priced at what the
carrying call paid per input token, `input_rate`: cache reads at the cache price), and each tool call holds
the sums of the rows of its (conversation, tool_call_id): `context_tokens`, `context_carries`,
`context_cost_usd` (None while no carrying call has a price).

Why a ledger: the sums must stay exact however spans arrive. A re-sent span stores nothing, so
it adds nothing. A tool call that arrives after the calls that carried it finds their rows by
its key; calls that arrive in any order each add their own row. When a call's figures change
later (its input tokens counted after the response, its messages rebuilt from logs, its span
replaced by the finished version), the call's new rows are compared with its stored ones and
only the difference is applied, so the common paths cost O(results the call carries) and never
read a conversation's other calls. Where a difference is not a plain change of tokens (a
result no longer carried, a call moved in time), the tool calls of the keys involved are summed
again from the ledger. When two tool calls share an id, a carry counts for the latest of them
that started at or before the carrying call (the first of them when none did).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Context, Decimal
from typing import Any

from pipeline.ingest.normalise.digest import Digest, message_tokens
from pipeline.ingest.write import sql
from pipeline.insight.costs import cost_of_call
from pipeline.insight.pricing import Tokens
from pipeline.models import Conversation, LLMCall, ToolCall, ToolResultCarry

Key = tuple[int, str]  # (conversation id, tool_call_id)
CONTEXT_FIELDS = ["context_tokens", "context_carries", "context_cost_usd"]
CARRIER_FIELDS = ("id", "trace_id", "span_id", "conversation_id", "round_id", "started_at", "model", "provider",
                  "input_tokens", "cache_read_tokens", "cache_write_tokens", "input_digest")
TOOL_FIELDS = ("conversation_id", "tool_call_id", "id", "started_at", *CONTEXT_FIELDS)
ID_LENGTH = ToolCall._meta.get_field("tool_call_id").max_length
CARRY_FIELDS = ("conversation_id", "tool_call_id", "started_at", "tokens", "cost_usd")
LEDGER_COLUMNS = ("conversation_id", "tool_call_id", "trace_id", "span_id", "started_at", "tokens", "cost_usd")
COST_PLACES = Decimal(1).scaleb(-ToolResultCarry._meta.get_field("cost_usd").decimal_places)
FLOAT_DIGITS = Context(prec=15)


@dataclass(frozen=True)
class Carry:
    """One LLM call's input carrying one tool result (a ledger row's values)."""

    conversation_id: int
    tool_call_id: str
    started_at: datetime
    tokens: int
    cost: Decimal | None

    @property
    def key(self) -> Key:
        return self.conversation_id, self.tool_call_id


def carried_tokens(digest: Digest, input_tokens: int) -> dict[str, int]:
    """{tool_call_id: tokens} of the tool results in one call's input, from its digest."""
    if not any(entry.get("answers") for entry in digest):  # most inputs carry none: no shares to work out
        return {}
    carried: dict[str, int] = defaultdict(int)
    for entry, tokens in zip(digest, message_tokens(digest, input_tokens), strict=True):
        answers = list(dict.fromkeys(str(a)[:ID_LENGTH] for a in entry.get("answers") or () if a))
        if answers:
            share, rest = divmod(tokens, len(answers))
            for i, answer in enumerate(answers):
                carried[answer] += share + (1 if i < rest else 0)
    return dict(carried)


def carries_of(call: LLMCall) -> dict[str, Carry]:
    """The ledger rows one LLM call should have, by tool_call_id."""
    digest = call.input_digest if isinstance(call.input_digest, list) else []
    carries = {}
    carried = carried_tokens(digest, call.input_tokens or 0)
    rate = input_rate(call) if carried else None
    for answer, tokens in carried.items():
        carries[answer] = Carry(call.conversation_id, answer, call.started_at, tokens,
                                None if rate is None else (rate * tokens).quantize(COST_PLACES))
    return carries


def input_rate(call: LLMCall) -> Decimal | None:
    """USD per input token as this call paid for its input: cache reads at the cache price, the
    rest at the input price (a result re-sent in a cached prefix costs what the cache charges,
    not the full input price); None when the model has no price."""
    tokens = Tokens(input=call.input_tokens or 0, cache_read=call.cache_read_tokens or 0,
                    cache_write=call.cache_write_tokens or 0)
    billed = tokens.billed().input
    if not billed:
        return None
    paid = cost_of_call(call.model, call.provider, tokens, call.started_at)
    fee = cost_of_call(call.model, call.provider, Tokens(), call.started_at)
    if paid is None:
        return None
    return (paid - (fee or 0)) / billed


# ---- reading -------------------------------------------------------------------------------

def _decimal(value: Any) -> Decimal | None:
    """A cost as a raw query returns it (SQLite: a float; PostgreSQL: a Decimal), read as the
    ORM reads the field (Django's SQLite converter: 15 significant digits, then the field's places)."""
    if value is None:
        return None
    exact = FLOAT_DIGITS.create_decimal_from_float(value) if isinstance(value, float) else Decimal(value)
    return exact.quantize(COST_PLACES)


def _stored_carries(spans: Sequence[tuple[str, str]]) -> dict[tuple[str, str], dict[str, tuple[int, Carry]]]:
    """The ledger rows of the carrying calls `spans`: {(trace, span): {tool_call_id: (row id, Carry)}}."""
    wanted, found = set(spans), defaultdict(dict)
    for chunk in sql.chunked(sorted(wanted)):
        traces, span_ids = sorted({t for t, _ in chunk}), sorted({s for _, s in chunk})
        rows = sql.fetch(
            f"SELECT id, trace_id, span_id, {sql.columns(CARRY_FIELDS)} FROM {sql.table(ToolResultCarry)} "
            f"WHERE trace_id IN ({sql.marks(traces)}) AND span_id IN ({sql.marks(span_ids)})", [*traces, *span_ids])
        for pk, trace_id, span_id, conversation_id, answer, started_at, tokens, cost in rows:
            if (trace_id, span_id) in wanted:
                found[(trace_id, span_id)][answer] = (pk, Carry(
                    conversation_id, answer, sql.to_datetime(started_at), tokens, _decimal(cost)))
    return found


def _by_key(model: type[ToolCall] | type[ToolResultCarry], keys: Iterable[Key], fields: Sequence[str]) -> list[tuple]:
    """Rows (`fields`, the first two conversation_id and tool_call_id) of `model` whose
    (conversation, tool_call_id) is one of `keys`: one query per chunk, on the index of both."""
    wanted, rows = set(keys), []
    for chunk in sql.chunked(sorted(wanted)):
        conversations, ids = sorted({c for c, _ in chunk}), sorted({i for _, i in chunk})
        rows += [row for row in sql.fetch(
            f"SELECT {sql.columns(fields)} FROM {sql.table(model)} WHERE conversation_id IN ({sql.marks(conversations)}) "
            f"AND tool_call_id IN ({sql.marks(ids)})", [*conversations, *ids],
        ) if (row[0], row[1]) in wanted]
    return rows


@dataclass
class _Tool:
    """A tool call's key, start and sums: what the ledger reads and writes of it (a model
    instance per carried result would cost more than the rest of the work)."""

    conversation_id: int
    tool_call_id: str
    pk: int
    started_at: datetime
    context_tokens: int
    context_carries: int
    context_cost_usd: Decimal | None


def _tools_by_key(keys: Iterable[Key]) -> dict[Key, list[_Tool]]:
    tools: dict[Key, list[_Tool]] = defaultdict(list)
    for conversation_id, answer, pk, started_at, tokens, carries, cost in _by_key(ToolCall, keys, TOOL_FIELDS):
        tools[(conversation_id, answer)].append(
            _Tool(conversation_id, answer, pk, sql.to_datetime(started_at), tokens, carries, _decimal(cost)))
    for same_id in tools.values():
        same_id.sort(key=lambda t: (t.started_at, t.pk))
    return tools


def _owner(tools: list[Any], carried_at: datetime) -> Any:
    """Of the tool calls sharing one id (in start order), the one a call started at `carried_at` carried."""
    started = [t for t in tools if t.started_at <= carried_at]
    return started[-1] if started else (tools[0] if tools else None)


# ---- writing -------------------------------------------------------------------------------

@dataclass
class _Delta:
    carry: Carry
    tokens: int
    carries: int
    cost: Decimal | None


def _diff(old: dict[str, Carry], new: dict[str, Carry]) -> list[_Delta] | None:
    """What changed between a call's stored and current rows, as amounts to add; None when it is
    not a plain change of amounts (a result dropped, the call moved, its price appeared)."""
    if old and (old.keys() != new.keys() or any(
        (o.conversation_id, o.started_at, o.cost is None) != (n.conversation_id, n.started_at, n.cost is None)
        for o, n in ((old[k], new[k]) for k in new)
    )):
        return None
    deltas = []
    for answer, carry in new.items():
        before = old.get(answer)
        cost = None if carry.cost is None else carry.cost - (before.cost if before else 0)
        deltas.append(_Delta(carry, carry.tokens - (before.tokens if before else 0), 0 if before else 1, cost))
    return deltas


def update_tool_context(carriers: Iterable[LLMCall], tool_keys: Iterable[Key] = (), *, forced: Iterable[Key] = ()) -> None:
    """Bring the ledger and the tool calls' sums up to date, inside the caller's transaction.

    `carriers`: LLM calls stored or changed now (CARRIER_FIELDS loaded); `tool_keys`: the keys
    of tool calls stored or given an id now, whose sums are taken from the ledger when it has
    rows for them; `forced`: keys to sum again from the ledger whatever it holds.
    """
    forced, tool_keys = set(forced), set(tool_keys)
    calls = {(c.trace_id, c.span_id): c for c in carriers}
    # The sums are read, added to and written back: lock their conversations first, as every
    # ingest transaction does (in id order), so a batch of log events and a batch of spans of the
    # same conversation (which lock nothing else in common) cannot both add to a stale sum.
    sql.lock_rows(Conversation, {c.conversation_id for c in calls.values()}
                  | {key[0] for key in (*tool_keys, *forced)})
    stored = _stored_carries(list(calls)) if calls else {}
    deltas: list[_Delta] = []
    stale: list[int] = []
    fresh: list[list[Any]] = []
    prepare = sql.Prepare()
    for span, call in calls.items():
        old = {answer: carry for answer, (_, carry) in stored.get(span, {}).items()}
        new = carries_of(call)
        if old == new:
            continue
        stale += [pk for pk, _ in stored.get(span, {}).values()]
        fresh += [[c.conversation_id, c.tool_call_id, *span, prepare.datetime(c.started_at), c.tokens, c.cost]
                  for c in new.values()]
        changed = _diff(old, new)
        if changed is None:
            forced |= {c.key for c in (*old.values(), *new.values())}
        else:
            deltas += changed
    for chunk in sql.chunked(stale, 500):
        ToolResultCarry.objects.filter(pk__in=chunk).delete()
    sql.insert_values(ToolResultCarry, LEDGER_COLUMNS, fresh)
    summed = _sum_again({k for k in tool_keys if k[1]}, forced)
    _add(d for d in deltas if d.carry.key not in summed)


def _sum_again(checked: set[Key], forced: set[Key]) -> set[Key]:
    """Sum the tool calls of `forced`, and of the `checked` keys the ledger has rows for, from the
    ledger; returns the keys summed."""
    if not checked and not forced:
        return set()
    rows: dict[Key, list[tuple]] = defaultdict(list)
    for row in _by_key(ToolResultCarry, checked | forced, CARRY_FIELDS):
        conversation_id, answer, started_at, tokens, cost = row
        rows[(conversation_id, answer)].append((sql.to_datetime(started_at), tokens, _decimal(cost)))
    keys = forced | (checked & rows.keys())
    if not keys:
        return set()
    changed = []
    for key, tools in _tools_by_key(keys).items():
        totals: dict[int, list] = {t.pk: [0, 0, None] for t in tools}
        for started_at, tokens, cost in rows.get(key, ()):
            owner = _owner(tools, started_at)
            total = totals[owner.pk]
            total[0] += tokens
            total[1] += 1
            if cost is not None:
                total[2] = (total[2] or 0) + cost
        for tool in tools:
            if _set(tool, *totals[tool.pk]):
                changed.append(tool)
    sql.update_rows(ToolCall, sorted(changed, key=lambda t: t.pk), CONTEXT_FIELDS)
    return keys


def _add(deltas: Iterable[_Delta]) -> None:
    """Add each delta to the tool call that carry belongs to (tools not stored yet get theirs
    from the ledger when they arrive)."""
    deltas = list(deltas)
    if not deltas:
        return
    tools = _tools_by_key({d.carry.key for d in deltas})
    changed: dict[int, _Tool] = {}
    for delta in deltas:
        owner = _owner(tools.get(delta.carry.key, []), delta.carry.started_at)
        if owner is None:
            continue
        cost = owner.context_cost_usd
        if delta.cost is not None:
            cost = (cost or 0) + delta.cost
        if _set(owner, owner.context_tokens + delta.tokens, owner.context_carries + delta.carries, cost):
            changed[owner.pk] = owner
    sql.update_rows(ToolCall, sorted(changed.values(), key=lambda t: t.pk), CONTEXT_FIELDS)


def _set(tool: _Tool, tokens: int, carries: int, cost: Decimal | None) -> bool:
    """Give `tool` these sums; True when they differ from what it had."""
    cost = None if cost is None else Decimal(cost).quantize(COST_PLACES)
    if (tool.context_tokens, tool.context_carries, tool.context_cost_usd) == (tokens, carries, cost):
        return False
    tool.context_tokens, tool.context_carries, tool.context_cost_usd = tokens, carries, cost
    return True


# ---- the write path's entry points ---------------------------------------------------------

def tool_keys(tools: Iterable[ToolCall]) -> set[Key]:
    return {(t.conversation_id, t.tool_call_id) for t in tools if t.tool_call_id}


def update_for_calls(call_ids: Iterable[int]) -> None:
    """LLM calls whose input or input token count changed after they were stored (deferred counts)."""
    ids = sorted(set(call_ids))
    for chunk in sql.chunked(ids, 500):
        update_tool_context(LLMCall.objects.filter(pk__in=chunk).only(*CARRIER_FIELDS).order_by("pk"))


def update_for_rounds(round_ids: Iterable[int]) -> None:
    """Rounds whose rows changed outside a span batch (messages rebuilt from logs, tools relinked)."""
    ids = sorted(set(round_ids))
    if ids:
        calls = LLMCall.objects.filter(round_id__in=ids).only(*CARRIER_FIELDS).order_by("pk")
        tools = ToolCall.objects.filter(round_id__in=ids).exclude(tool_call_id="").only("conversation_id", "tool_call_id")
        update_tool_context(calls, tool_keys(tools))


def forget_carriers(spans: Iterable[tuple[str, str]], results: Iterable[Key] = ()) -> None:
    """Rows deleted (in the admin): LLM calls by (trace_id, span_id), whose ledger rows go, and
    tool calls by key. The tool calls of every key involved are summed again from what the ledger
    still holds (a tool call sharing its id with a deleted one now owns the carries it had)."""
    keys = {carry.key for carries in _delete_carries(spans).values() for _, carry in carries.values()} | set(results)
    if keys:
        update_tool_context((), forced=keys)


def forget_replaced(spans: Sequence[tuple[str, str]], uncalled: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
    """Open spans about to be replaced by their finished versions, before their rows go: the ledger
    rows of those finished as something other than an LLM call (`uncalled`) go. Returns the tool
    results to sum again once the batch's rows are in, as (trace_id, tool_call_id): those rows',
    and those of the spans' tool calls (another tool call sharing an id may now own its carries).
    By trace, not conversation: the batch may yet merge the trace's conversation into another."""
    stored = _delete_carries(uncalled)
    tools = sql.by_spans(ToolCall, ["tool_call_id"], spans)
    return ({(trace_id, answer) for (trace_id, _), carries in stored.items() for answer in carries}
            | {(trace_id, answer) for trace_id, _, answer in tools if answer})


def _delete_carries(spans: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict[str, tuple[int, Carry]]]:
    """Delete the ledger rows of the carrying calls `spans`; the rows deleted, as `_stored_carries` reads them."""
    stored = _stored_carries(sorted(set(spans)))
    gone = [pk for carries in stored.values() for pk, _ in carries.values()]
    for chunk in sql.chunked(gone, 500):
        ToolResultCarry.objects.filter(pk__in=chunk).delete()
    return stored


def results_in(conversation_id: int) -> set[str]:
    """The tool_call_ids a conversation's tool calls and ledger rows name (before it is merged away)."""
    rows = sql.fetch(
        f"SELECT tool_call_id FROM {sql.table(ToolResultCarry)} WHERE conversation_id = %s "
        f"UNION SELECT tool_call_id FROM {sql.table(ToolCall)} WHERE conversation_id = %s AND tool_call_id <> ''",
        [conversation_id, conversation_id],
    )
    return {answer for (answer,) in rows}


def update_after_merge(into_id: int, results: set[str]) -> None:
    """A placeholder's rows (ledger included) moved into conversation `into_id`: the tool calls of
    the ids they name now share a conversation with carries they did not see."""
    update_tool_context((), {(into_id, answer) for answer in results})
