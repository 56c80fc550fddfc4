"""Links between the rows of a round, as if recomputed over everything the round holds.

Spans arrive in any order and in separate requests, so nothing here trusts the batch alone:
the LLM calls of a round are numbered in start order (step), each tool call is tied to the LLM
call that asked for it (by tool_call_id, else by name and order, else by time), missing
tool_call_ids, arguments and observations are recovered from the LLM calls' messages, and a
round whose root states no answer shows its last LLM answer. The result depends only on the
set of rows, not on the order they came in. New rows are fixed in memory before they are
inserted; stored rows that change are written with one executemany each.

A batch reads only the stored rows its new ones can affect (`RoundRows.around`), so a batch
costs the same at the end of a long round as at its start: the round's calls and tools from
the batch's earliest new row on (the steps after it shift, the tools after it may change
owner), the call just before that point (its step continues the numbering; it owns the tools
that follow by time), the calls that asked for the batch's tool_call_ids or offer an unclaimed
tool of the same name (found in pipeline.models.ToolRequest), and the stored tools those new
calls ask for or that no call owns yet. After a placeholder conversation is merged or an
unfinished span replaced, the rounds are read whole (`RoundRows.load`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from datetime import datetime

from django.db import connection
from django.db.models import QuerySet

from pipeline.ingest.normalise.messages import call_id, last_text, tool_calls_of, tool_responses_of
from pipeline.ingest.write import sql
from pipeline.ingest.write.precount import counting_key
from pipeline.ingest.write.tool_levels import needs_levels
from pipeline.ingest.write.sql import update_rows
from pipeline.ingest.normalise.values import to_text
from pipeline.models import CompressionEvent, LLMCall, Round, ToolCall, ToolRequest, ToolResultCarry

# `model`: a tool counted up front for a stored call is kept when the call counts alike (precount.apply)
LLM_FIELDS = ("id", "round_id", "trace_id", "span_id", "started_at", "ended_at", "step", "output_messages", "model")
# `tokens_*`, `levels_pending`, `output_level`, `artifact_id`: a stored tool given to a call of another
# model is counted again for it (`_count_again`)
TOOL_FIELDS = ("id", "conversation_id", "round_id", "trace_id", "span_id", "started_at", "tool_name", "tool_call_id",
               "llm_call_id", "arguments", "observation", "tokens_pending", "tokens_reported", "levels_pending",
               "output_level", "artifact_id")
TOOL_LINK_FIELDS = ["llm_call", "tool_call_id", "arguments", "observation", "tokens_pending", "levels_pending"]
REQUEST_COLUMNS = ("llm_call_id", "round_id", "tool_call_id", "name")
# Values an IN list takes at most: a long round holds more rows than SQLite takes variables in one
# statement (32,766 by default), so lists built from what was loaded go a chunk at a time.
IN_CHUNK = 500


def _order(row: LLMCall | ToolCall) -> tuple:
    return row.started_at, row.span_id


def _requested_ids(call: LLMCall) -> set[str]:
    return {i for p in tool_calls_of(call.output_messages or []) if (i := call_id(p.get("id")))}


def _unique(rows: Iterable[Any]) -> list[Any]:
    return list({row.pk: row for row in rows}.values())


def _rows_in(query: QuerySet, name: str, values: Iterable[Any]) -> list[Any]:
    """The rows of `query` whose `name` is one of `values`, read IN_CHUNK values at a time."""
    return [row for chunk in sql.chunked(sorted(set(values)), IN_CHUNK) for row in query.filter(**{f"{name}__in": chunk})]


def _select_in_round(
    model: type[LLMCall | ToolCall | ToolRequest], names: Sequence[str], round_id: int, where: str = "",
    params: Sequence[Any] = (), *, among: tuple[str, Iterable[Any]] | None = None, tail: str = "",
) -> list[tuple]:
    """Raw rows (tuples of the columns `names`) of `model` in round `round_id` that match `where`
    (SQL whose `%s` take `params`) and, with `among=(column, values)`, whose column holds one of
    the values: IN_CHUNK values a query, and no query for none."""
    query = f"SELECT {sql.columns(names)} FROM {sql.table(model)} WHERE round_id = %s"
    query += f" AND {where}" if where else ""
    if among is None:
        return sql.fetch(query + tail, [round_id, *params])
    column, values = among
    return [row for chunk in sql.chunked(sorted(set(values)), IN_CHUNK)
            for row in sql.fetch(f"{query} AND {sql.quote(column)} IN ({sql.marks(chunk)}){tail}",
                                 [round_id, *params, *chunk])]


def _calls_in_round(round_id: int, where: str = "", params: Sequence[Any] = (), **options: Any) -> list[LLMCall]:
    """`_select_in_round` of LLMCall, as instances with LLM_FIELDS loaded."""
    return sql.instances(LLMCall, LLM_FIELDS, _select_in_round(LLMCall, LLM_FIELDS, round_id, where, params, **options))


def _in_rounds(model: type[LLMCall | ToolCall], names: Sequence[str], round_ids: Iterable[int]) -> list:
    """`model.objects.only(*names).filter(round_id__in=round_ids)` (in the models' order, by start),
    written out: it runs for most batches (the rounds of a conversation a placeholder merged into)."""
    out = []
    for chunk in sql.chunked(sorted(set(round_ids)), IN_CHUNK):
        rows = sql.fetch(f"SELECT {sql.columns(names)} FROM {sql.table(model)} WHERE round_id IN ({sql.marks(chunk)}) "
                         f"ORDER BY started_at", chunk)
        out += sql.instances(model, names, rows)
    return out


@dataclass
class RoundRows:
    """The LLM and tool calls of some rounds: stored ones (loaded) and new ones (not yet saved).

    `llm` holds the calls that are numbered: all of a round's, or (a round in `partial`) those
    from a point in time on, numbered from `first_step`. `context` holds stored calls read only
    to link tools to; `claimed` the tool_call_ids that stored tools not loaded already use.
    """

    llm: dict[int, list[LLMCall]] = field(default_factory=lambda: defaultdict(list))
    tools: dict[int, list[ToolCall]] = field(default_factory=lambda: defaultdict(list))
    changed_llm: dict[int, LLMCall] = field(default_factory=dict)
    changed_tools: dict[int, ToolCall] = field(default_factory=dict)
    context: dict[int, list[LLMCall]] = field(default_factory=lambda: defaultdict(list))
    first_step: dict[int, int] = field(default_factory=dict)
    claimed: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))
    partial: set[int] = field(default_factory=set)

    @classmethod
    def load(cls, round_ids: Iterable[int], rows: RoundRows | None = None) -> RoundRows:
        """Everything the rounds hold (added to `rows`, when given)."""
        rows = rows if rows is not None else cls()
        for call in _in_rounds(LLMCall, LLM_FIELDS, round_ids):
            rows.llm[call.round_id].append(call)
        for tool in _in_rounds(ToolCall, TOOL_FIELDS, round_ids):
            rows.tools[tool.round_id].append(tool)
        return rows

    @classmethod
    def around(
        cls, round_ids: Iterable[int], llm: Iterable[LLMCall], tools: Iterable[ToolCall],
        events: Iterable[CompressionEvent] = (), *, whole: set[int] = frozenset(),
    ) -> RoundRows:
        """What the stored rounds `round_ids` hold that the new rows `llm`, `tools` and `events`
        (unsaved, of any rounds) can change or need to be linked (see the module docstring);
        everything of those also in `whole`."""
        round_ids = set(round_ids)
        rows = cls.load(sorted(round_ids & whole))
        new_llm: dict[int, list[LLMCall]] = defaultdict(list)
        new_tools: dict[int, list[ToolCall]] = defaultdict(list)
        starts: dict[int, list[datetime]] = defaultdict(list)
        for call in llm:
            new_llm[call.round_id].append(call)
            starts[call.round_id].append(call.started_at)
        for tool in tools:
            new_tools[tool.round_id].append(tool)
            starts[tool.round_id].append(tool.started_at)
        for event in events:
            starts[event.round_id].append(event.occurred_at)
        for round_id in sorted(round_ids - whole):
            rows.partial.add(round_id)
            if starts[round_id]:
                rows._read_round(round_id, min(starts[round_id]), new_llm[round_id], new_tools[round_id])
        return rows

    def _read_round(self, round_id: int, since: datetime, new_llm: list[LLMCall], new_tools: list[ToolCall]) -> None:
        # Up to eleven reads for each stored round a batch adds to, written out (`_select_in_round`):
        # compiling them through the ORM cost more than running them. No ORDER BY unless needed,
        # so each read takes the index that finds its rows.
        at = connection.ops.adapt_datetimefield_value(since)  # as the ORM passes a datetime lookup
        self.llm[round_id] = _calls_in_round(round_id, "started_at >= %s", [at])
        before = _calls_in_round(round_id, "started_at < %s", [at],
                                 tail=" ORDER BY started_at DESC, span_id DESC LIMIT 1")
        self.first_step[round_id] = before[0].step + 1 if before else 0  # steps before `since` are 0..n-1
        self.context[round_id] = before

        asked = set().union(*(_requested_ids(c) for c in new_llm))
        answered = {i for c in new_llm for i in tool_responses_of(c.input_messages or [])}
        self.tools[round_id] = _unique(sql.instances(ToolCall, TOOL_FIELDS, [
            *_select_in_round(ToolCall, TOOL_FIELDS, round_id, "started_at >= %s", [at]),
            *_select_in_round(ToolCall, TOOL_FIELDS, round_id, "llm_call_id IS NULL"),
            *_select_in_round(ToolCall, TOOL_FIELDS, round_id, among=("tool_call_id", asked)),
            # results a new input holds
            *_select_in_round(ToolCall, TOOL_FIELDS, round_id, "observation = %s", [""],
                              among=("tool_call_id", answered)),
        ]))

        loaded = {c.pk for c in (*self.llm[round_id], *before)}
        linked = [*self.tools[round_id], *new_tools]
        ids = {t.tool_call_id for t in linked if t.tool_call_id}
        requesters = {pk for (pk,) in _select_in_round(ToolRequest, ["llm_call_id"], round_id,
                                                       among=("tool_call_id", ids))}
        self.context[round_id] += _calls_in_round(round_id, among=("id", requesters - loaded))
        known = asked.union(*(_requested_ids(c) for c in (*self.llm[round_id], *self.context[round_id])))
        names = {t.tool_name for t in linked if not (t.tool_call_id and t.tool_call_id in known)}
        # tools not requested by id take an unclaimed request of their name
        unclaimed = (f"NOT EXISTS (SELECT 1 FROM {sql.table(ToolCall)} t WHERE t.round_id = %s "
                     f"AND t.tool_call_id = {sql.table(ToolRequest)}.tool_call_id)")
        offering = {pk for (pk,) in _select_in_round(ToolRequest, ["llm_call_id"], round_id, unclaimed, [round_id],
                                                     among=("name", names))}
        offering -= loaded | {c.pk for c in self.context[round_id]}
        self.context[round_id] += _calls_in_round(round_id, among=("id", offering))
        offered = set().union(*(_requested_ids(c) for c in (*self.llm[round_id], *self.context[round_id])))
        if offered:
            self.claimed[round_id] = {
                i for (i,) in _select_in_round(ToolCall, ["tool_call_id"], round_id, among=("tool_call_id", offered))}

    def add(self, llm: Iterable[LLMCall], tools: Iterable[ToolCall]) -> None:
        for call in llm:
            self.llm[call.round_id].append(call)
        for tool in tools:
            self.tools[tool.round_id].append(tool)

    def calls(self) -> list[LLMCall]:
        """Every LLM call held, new and stored, of every round."""
        return [call for rows in (self.llm, self.context) for calls in rows.values() for call in calls]

    def number_steps(self) -> None:
        """LLM calls in start order; call before the new ones are inserted so they go in right."""
        for round_id, calls in self.llm.items():
            calls.sort(key=_order)
            for step, call in enumerate(calls, self.first_step.get(round_id, 0)):
                if call.step != step:
                    call.step = step
                    if call.pk:
                        self.changed_llm[call.pk] = call

    def link_tools(self) -> None:
        """Tie tools to their LLM calls; call after the new LLM calls are inserted (they need ids)."""
        for round_id, tools in self.tools.items():
            calls = sorted(_unique([*self.llm.get(round_id, ()), *self.context.get(round_id, ())]), key=_order)
            tools.sort(key=_order)
            if calls:
                whole = round_id if round_id in self.partial else None
                for tool in _link_tools(calls, tools, self.claimed.get(round_id, set()), whole):
                    if tool.pk:
                        self.changed_tools[tool.pk] = tool

    def fill_final_answers(self, rounds: Iterable[Round], stated: set[int] = frozenset()) -> list[Round]:
        """A round whose root states no answer shows its last LLM call's text answer.

        The stored answer is replaced only while it is empty or one of the round's own LLM
        answers (an earlier fallback), so an answer the root span states is never overwritten.
        A round read in part is looked at only when a call loaded now answers or a span of the
        batch stated its answer (`stated`): otherwise its answers are the ones it already had.
        """
        changed = []
        for round_ in rounds:
            calls = [*self.llm.get(round_.id, ()), *self.context.get(round_.id, ())]
            if round_.id in self.partial:
                if round_.id not in stated and not any(_answer(c) for c in calls):
                    continue
                calls += _answering_calls(round_.id, {c.pk for c in calls})
            answers = [(c.ended_at or c.started_at, c.span_id, a) for c in calls if (a := _answer(c))]
            if not answers:
                continue
            latest = max(answers)[2]
            if round_.final_answer != latest and (
                not round_.final_answer or round_.final_answer in {a for _, _, a in answers}
            ):
                round_.final_answer = latest
                changed.append(round_)
        return changed

    def save_changes(self) -> None:
        update_rows(LLMCall, sorted(self.changed_llm.values(), key=lambda c: c.pk), ["step"])
        update_rows(ToolCall, sorted(self.changed_tools.values(), key=lambda t: t.pk), TOOL_LINK_FIELDS)


def round_answers(round_id: int) -> set[str]:
    """The text answers the round's own LLM calls give: what `fill_final_answers` may have stored."""
    return {answer for call in _answering_calls(round_id, set()) if (answer := _answer(call))}


def _answering_calls(round_id: int, loaded: set[int]) -> list[LLMCall]:
    """The round's other stored calls that may hold an answer: those that ask for no tool."""
    asks_none = f"NOT EXISTS (SELECT 1 FROM {sql.table(ToolRequest)} r WHERE r.llm_call_id = {sql.table(LLMCall)}.id)"
    answering = {pk for (pk,) in _select_in_round(LLMCall, ["id"], round_id, asks_none)}
    return _calls_in_round(round_id, among=("id", answering - loaded))


def save_requests(calls: Iterable[LLMCall], *, replace: bool = False) -> None:
    """Index the tool calls that saved LLM calls ask for (`replace`: their messages changed)."""
    calls = list(calls)
    if replace:
        for chunk in sql.chunked([c.pk for c in calls], 500):
            ToolRequest.objects.filter(llm_call_id__in=chunk).delete()
    sql.insert_values(ToolRequest, REQUEST_COLUMNS, [
        (call.pk, call.round_id, key, str(part.get("name") or "")[:255])
        for call in calls for part in tool_calls_of(call.output_messages or []) if (key := call_id(part.get("id")))
    ])


def _answer(call: LLMCall) -> str:
    outputs = call.output_messages or []
    return "" if tool_calls_of(outputs) else last_text(outputs, "assistant")


def _better_arguments(stored: Any, requested: Any) -> bool:
    """The model's structured arguments beat a tool span that has none or only a bare string
    (OpenInference records `input.value = "Paris"` when LangChain invokes a tool with a ToolCall)."""
    if requested in (None, "", {}) or stored == requested:
        return False
    return stored in ({}, "", None) or (not isinstance(stored, dict) and isinstance(requested, dict))


def _link_tools(
    calls: list[LLMCall], tools: list[ToolCall], claimed_elsewhere: set[str] = frozenset(), whole_round: int | None = None
) -> list[ToolCall]:
    """Tie tools to the LLM call that requested them; returns the tool rows that changed.

    `claimed_elsewhere`: tool_call_ids of the round's tools not in `tools`; `whole_round`: the
    round, when `calls` are only part of it (observations are then looked for in all its calls).
    """
    requested: dict[str, tuple[LLMCall, dict[str, Any]]] = {}
    by_call: dict[int, list[dict[str, Any]]] = {}
    for call in calls:
        parts = tool_calls_of(call.output_messages or [])
        by_call[call.pk] = parts
        for part in parts:
            if key := call_id(part.get("id")):
                requested.setdefault(key, (call, part))
    claimed = {t.tool_call_id for t in tools if t.tool_call_id} | set(claimed_elsewhere)
    models = {call.pk: call.model for call in calls}
    changed = []
    for tool in tools:
        before = (tool.llm_call_id, tool.tool_call_id, tool.arguments, tool.observation)
        owner: LLMCall | None = None
        part: dict[str, Any] | None = None
        if tool.tool_call_id and tool.tool_call_id in requested:
            owner, part = requested[tool.tool_call_id]
        else:
            earlier = [c for c in calls if c.started_at <= tool.started_at]
            for candidate in reversed(earlier or calls):
                part = next(
                    (p for p in by_call[candidate.pk]
                     if p.get("name") == tool.tool_name and (key := call_id(p.get("id"))) and key not in claimed),
                    None,
                )
                if part is not None:
                    owner = candidate
                    break
            if owner is None:
                owner = earlier[-1] if earlier else None
            elif not tool.tool_call_id:
                tool.tool_call_id = call_id(part["id"])
                claimed.add(tool.tool_call_id)
        if owner is not None and tool.llm_call_id != owner.pk:
            if tool.pk and _counts_may_differ(tool.llm_call_id, owner, models):
                _count_again(tool)
            tool.llm_call_id = owner.pk
        if part is not None and _better_arguments(tool.arguments, part.get("arguments")):
            tool.arguments = part["arguments"]
        if before != (tool.llm_call_id, tool.tool_call_id, tool.arguments, tool.observation):
            changed.append(tool)
    missing_observation = [t for t in tools if not t.observation and t.tool_call_id]
    if missing_observation:
        _recover_observations(calls, missing_observation, changed, whole_round)
    return changed


def _counts_may_differ(previous: int | None, owner: LLMCall, models: dict[int, str]) -> bool:
    """Whether what was counted for a stored tool while it was linked to call `previous` may count
    otherwise for `owner`'s model: another encoding, margin or approximation, or a previous call
    whose model is unknown here (not among the calls read; none, perhaps because it was replaced)."""
    return previous not in models or counting_key(models[previous]) != counting_key(owner.model)


def _count_again(tool: ToolCall) -> None:
    """Leave a stored tool's counts to the deferred run, for the call it is being linked to: its
    observation's tokens unless its span reported them, its tokens at each output level."""
    if tool.observation and not tool.tokens_reported:
        tool.tokens_pending = True
    if needs_levels(tool):
        tool.levels_pending = True


def _recover_observations(
    calls: list[LLMCall], tools: list[ToolCall], changed: list[ToolCall], whole_round: int | None = None
) -> None:
    """Take a tool's observation from an LLM call's input (the tool message with its id), and leave
    its tokens (unless its span reported them) and its tokens at each level to the deferred run."""
    responses: dict[str, Any] = {}
    if whole_round is not None:  # only part of the round is loaded: read the calls that answer these tools
        calls = _answering_inputs(calls, tools, whole_round)
        loaded = []
    stored = [c.pk for c in calls if "input_messages" not in c.get_deferred_fields() and c.input_messages]
    for call in calls:
        if call.pk in stored:
            responses.update(tool_responses_of(call.input_messages))
    if whole_round is None:
        unread = [c.pk for c in calls if c.pk not in stored]
        inputs = dict(_rows_in(LLMCall.objects.order_by().values_list("pk", "input_messages"), "pk", unread))
        loaded = [inputs.get(pk) for pk in unread]  # in start order: the latest copy of a result wins
    for messages in loaded:
        responses.update(tool_responses_of(messages or []))
    for tool in tools:
        if tool.tool_call_id in responses:
            tool.observation = to_text(responses[tool.tool_call_id])
            tool.tokens_pending = bool(tool.observation) and not tool.tokens_reported
            # an artifact's levels come from the artifact, which a recovered observation does not change
            tool.levels_pending = tool.levels_pending or (tool.artifact_id is None and needs_levels(tool))
            if tool not in changed:
                changed.append(tool)


def _answering_inputs(calls: list[LLMCall], tools: list[ToolCall], round_id: int) -> list[LLMCall]:
    """The calls of round `round_id` (new ones in `calls`, stored ones found in the ledger of carried
    results, pipeline.models.ToolResultCarry) whose input answers one of `tools`, in start order.

    The ledger is kept by conversation: a later turn's copy of the result (cut short, say) or a
    reused id (call_0 in every turn) is carried by calls of other rounds, which are left out, as
    they are when the round is read whole."""
    new = [c for c in calls if "input_messages" not in c.get_deferred_fields()]
    keys = {(t.conversation_id, t.tool_call_id) for t in tools}
    carriers: set[tuple[str, str]] = set()
    for chunk in sql.chunked(sorted(keys), 500):
        carriers.update(ToolResultCarry.objects.filter(
            conversation_id__in={k[0] for k in chunk}, tool_call_id__in={k[1] for k in chunk}
        ).values_list("trace_id", "span_id"))
    carriers -= {(c.trace_id, c.span_id) for c in new}
    ids = [pk for _, _, pk, carrier_round in sql.by_spans(LLMCall, ["id", "round_id"], carriers)
           if carrier_round == round_id]
    stored: list[LLMCall] = []
    for chunk in sql.chunked(ids, 500):
        stored += LLMCall.objects.filter(pk__in=chunk).only("id", "span_id", "started_at", "input_messages")
    return sorted([*new, *stored], key=_order)


def link_compressions(new: list[CompressionEvent], rows: RoundRows, stored_round_ids: set[int]) -> None:
    """A compression belongs to the first LLM call of its round that starts after it."""
    for event in new:
        event.llm_call_id = next(
            (c.pk for c in rows.llm.get(event.round_id, ()) if c.started_at >= event.occurred_at), None
        )
    if stored_round_ids:  # the ORM's UPDATE … SET = (subquery), written out: it runs for most batches
        ids = sorted(stored_round_ids)
        events, calls = sql.table(CompressionEvent), sql.table(LLMCall)
        sql.execute(
            f"UPDATE {events} SET llm_call_id = (SELECT c.id FROM {calls} c WHERE c.round_id = {events}.round_id "
            f"AND c.started_at >= {events}.occurred_at ORDER BY c.started_at LIMIT 1) "
            f"WHERE round_id IN ({sql.marks(ids)})", ids,
        )


def relink_stored(round_ids: set[int], rounds: Iterable[Round]) -> bool:
    """Relink rounds whose stored rows changed outside a span batch (e.g. messages from logs);
    whether this left tool counts to the deferred run (an observation found, a tool counted again)."""
    rows = RoundRows.load(round_ids)
    rows.number_steps()
    rows.link_tools()
    rows.save_changes()
    update_rows(Round, rows.fill_final_answers(rounds), ["final_answer"])
    return any(tool.tokens_pending or tool.levels_pending for tool in rows.changed_tools.values())
