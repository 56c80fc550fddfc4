"""Which conversation and which round (turn) each span of a batch belongs to; found or created.

A trace belongs to one conversation: the one its earlier spans went to, else the one its root
(or, failing that, its earliest span) names (gen_ai.conversation.id, session.id, …), else a
placeholder named after the trace. When a span naming the conversation arrives after the
placeholder was made (children usually end, and are exported, before their root), the
placeholder is folded into the named conversation. A round is keyed by ctxlens.round.id, else
by the trace. Times only widen (min start, max end) and the turn's text comes from the span
that starts first, so the outcome does not depend on arrival order. A conversation-metadata
span (a REST `conversation` event) describes its conversation and belongs to no round; its
time is no activity. A title a span states (ctxlens.conversation.title) is kept: the first
stored one wins, and the first user message no longer names the conversation.

Rows are found with hand-written SELECTs (pipeline.ingest.write.sql) because this runs for every
ingest batch; creation is an INSERT that skips conflicts (sql.insert_new) and a re-read, so two
writers racing on PostgreSQL both end up with the same row, and only the writer whose INSERT
wrote it counts it in the rollups. A conversation is locked before it
is read for widening (first write wins, times only widen, however requests interleave), and
the traces of a batch are locked before their conversations are decided (`sql.lock_traces`),
so a trace whose root and children arrive in concurrent requests is not split in two. SQLite
has one writer (BEGIN IMMEDIATE), so there the rows read by external id are already the latest
and the new ones go in with one INSERT: no lock, no conflict to skip, no second read.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connection

from pipeline.ingest.write import sql, tool_context
from pipeline.ingest.write.linking import round_answers
from pipeline.ingest.normalise.messages import last_text
from pipeline.ingest.normalise.span import NormalisedSpan
from pipeline.models import (
    Artifact,
    CompressionEvent,
    Conversation,
    LLMCall,
    Round,
    SkillActivation,
    Span,
    Status,
    ToolCall,
    ToolRequest,
    ToolResultCarry,
)
from pipeline.rollups import track as rollups

PROFILE_FIELDS = ("agent_name", "user_id", "service_name")
CONVERSATION_COLUMNS = ("id", "external_id", "started_at", "last_activity_at", "title", "title_explicit",
                        *PROFILE_FIELDS)
CONVERSATION_WIDENED = ["started_at", "last_activity_at", "title", "title_explicit", *PROFILE_FIELDS]
ROUND_COLUMNS = ("id", "conversation_id", "key", "trace_id", "user_message", "final_answer", "status",
                 "started_at", "ended_at", "duration_ms")
ROUND_WIDENED = ["started_at", "ended_at", "duration_ms", "user_message", "final_answer", "status"]
CONVERSATION_ROWS = (Round, LLMCall, ToolCall, CompressionEvent, SkillActivation, Span, Artifact, ToolResultCarry)


def _group_by(items: Iterable[NormalisedSpan], key: Callable[[NormalisedSpan], Any]) -> dict[Any, list[NormalisedSpan]]:
    grouped: dict[Any, list[NormalisedSpan]] = defaultdict(list)
    for item in items:
        grouped[key(item)].append(item)
    return grouped


def _conversations_by_external_id(externals: list[str]) -> dict[str, Conversation]:
    rows = sql.fetch(
        f"SELECT {sql.columns(CONVERSATION_COLUMNS)} FROM {sql.table(Conversation)} "
        f"WHERE external_id IN ({sql.marks(externals)})", externals,
    )
    return {c.external_id: c for c in sql.instances(Conversation, CONVERSATION_COLUMNS, rows)}


def _stored_conversations(trace_ids: list[str]) -> dict[str, tuple[int, str]]:
    """{trace_id: (conversation id, external id)} for traces that already have stored spans."""
    stored: dict[str, tuple[int, str]] = {}
    for chunk in sql.chunked(trace_ids, sql.SPAN_CHUNK):
        # One span per trace with a conversation is enough (all of a trace's spans share it): an index
        # probe per trace, never a read of the whole trace.
        first = (f"SELECT v.column1 AS trace_id, (SELECT s.conversation_id FROM {sql.table(Span)} s "
                 f"WHERE s.trace_id = v.column1 AND s.conversation_id IS NOT NULL LIMIT 1) AS conversation_id "
                 f"FROM (VALUES {', '.join(['(%s)'] * len(chunk))}) AS v")
        for trace_id, conversation_id, external_id in sql.fetch(
            f"SELECT t.trace_id, c.id, c.external_id FROM ({first}) t "
            f"JOIN {sql.table(Conversation)} c ON c.id = t.conversation_id", list(chunk),
        ):
            stored[trace_id] = (conversation_id, external_id)
    return stored


def _locked_conversations(ids: list[int]) -> dict[str, Conversation]:
    """The conversations `ids`, locked in id order (PostgreSQL FOR UPDATE) and read under the lock:
    the copy widened and written back is the latest committed one, not one read before waiting."""
    ids = sorted(set(ids))
    if not ids:
        return {}
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    rows = sql.fetch(
        f"SELECT {sql.columns(CONVERSATION_COLUMNS)} FROM {sql.table(Conversation)} "
        f"WHERE id IN ({sql.marks(ids)}) ORDER BY id{lock}", ids,
    )
    return {c.external_id: c for c in sql.instances(Conversation, CONVERSATION_COLUMNS, rows)}


@dataclass
class DecidedConversations:
    """Each trace's conversation, as `decide_conversations` found, created and locked it."""

    target: dict[str, str]  # trace_id -> the external id of its conversation
    merges: dict[str, int]  # trace_id -> the placeholder conversation to fold into its target
    found: dict[str, Conversation]  # by external id; on PostgreSQL, read under the lock
    created: set[int]


def decide_conversations(spans: list[NormalisedSpan], also: Iterable[int] = ()) -> DecidedConversations:
    """Decide which conversation each trace of `spans` belongs to, create the missing ones, and
    lock (PostgreSQL) every conversation the batch will write, its placeholders to fold included,
    and the conversations `also`, in one pass in id order: the caller does this before it touches
    any other row (the rows of the open spans the batch replaces belong to these same
    conversations), so no ingest, admin change or prune batch waits for a row while holding a
    conversation the other waits for.

    The caller holds the locks of the batch's traces (`sql.lock_traces`), so what is stored of
    each trace cannot change while its conversation is decided.
    """
    by_trace = _group_by(spans, lambda s: s.record.trace_id)
    named: dict[str, str] = {}
    for trace_id, group in by_trace.items():
        candidates = [s for s in group if s.conversation_key]
        if candidates:
            named[trace_id] = min(candidates, key=lambda s: (not s.is_root, s.started_at)).conversation_key
    stored = _stored_conversations(list(by_trace))

    target: dict[str, str] = {}
    merges: dict[str, int] = {}  # trace_id -> placeholder conversation id to fold in
    for trace_id in by_trace:
        if trace_id in stored:
            conversation_id, external = stored[trace_id]
            if external == trace_id and named.get(trace_id, trace_id) != trace_id:
                merges[trace_id] = conversation_id
                external = named[trace_id]
            target[trace_id] = external
        else:
            target[trace_id] = named.get(trace_id, trace_id)

    wanted = sorted(set(target.values()))
    # With one writer at a time (SQLite) nothing else writes between this read and the commit: the
    # rows read here are the ones to widen, and the missing ones can be inserted without conflict.
    one_writer = not connection.features.has_select_for_update
    found = _conversations_by_external_id(wanted)
    missing = set(wanted) - found.keys()
    created: set[int] = set()
    if missing:
        first: dict[str, Any] = {}
        for trace_id, group in by_trace.items():
            external, started = target[trace_id], min(s.started_at for s in group)
            if external in missing and (external not in first or started < first[external]):
                first[external] = started
        new = [Conversation(external_id=e, started_at=first[e], last_activity_at=first[e]) for e in sorted(missing)]
        if one_writer:  # one executemany; a conflict would be a bug, and raises
            sql.insert_rows(Conversation, new)
            rollups.inserted(Conversation, new)
        else:  # only the rows this insert wrote count in the rollups: a concurrent writer's were counted by it
            inserted = sql.insert_new(Conversation, new, "external_id")
            rollups.inserted(Conversation, [c for c in new if c.external_id in inserted])
        fresh = _conversations_by_external_id(sorted(missing))
        created = {c.id for c in fresh.values()}
        found.update(fresh)

    if not one_writer:
        # Lock, then read: ids found above are only used to lock (a lookup by external id never waits).
        found = _locked_conversations([*(c.id for c in found.values()), *merges.values(), *also])
        gone = set(wanted) - found.keys()
        if gone:  # deleted (pruned) between the lookup and the lock: the transaction is retried
            raise IntegrityError(f"conversations {sorted(gone)} vanished while being locked")
    return DecidedConversations(target, merges, found, created)


def resolve_conversations(
    spans: list[NormalisedSpan], decided: DecidedConversations,
) -> tuple[dict[str, Conversation], set[int], set[int], set[int]]:
    """{trace_id: Conversation} for every trace in `spans`, the ids of conversations created, the
    ids of conversations a placeholder was merged into (their rounds may now hold rows that were
    never linked together), and the ids of the rounds a placeholder's rounds were folded into
    (rows of two rounds now in one, whether or not the batch has spans of it).

    `decided`: what `decide_conversations` settled (and locked) for these spans.
    """
    target, merges, found = decided.target, decided.merges, decided.found
    folded: set[int] = set()
    for trace_id, placeholder_id in merges.items():
        folded |= merge_conversation(placeholder_id, found[target[trace_id]])

    changed = []
    for external, group in _group_by(spans, lambda s: target[s.record.trace_id]).items():
        conversation = found[external]
        before = tuple(getattr(conversation, n) for n in CONVERSATION_COLUMNS)
        conversation.started_at = min(conversation.started_at, min(s.started_at for s in group))
        conversation.last_activity_at = max(
            [conversation.last_activity_at, *(s.ended_at or s.started_at for s in group if s.in_round)]
        )
        ordered = sorted(group, key=lambda s: s.started_at)
        for name in PROFILE_FIELDS:
            if not getattr(conversation, name):
                setattr(conversation, name, next((getattr(s, name) for s in ordered if getattr(s, name)), ""))
        title = next((s.title for s in ordered if s.title), "")
        if title and not conversation.title_explicit:
            conversation.title, conversation.title_explicit = title, True
        if before != tuple(getattr(conversation, n) for n in CONVERSATION_COLUMNS):
            changed.append(conversation)
    sql.update_rows(Conversation, sorted(changed, key=lambda c: c.id), CONVERSATION_WIDENED)
    merged_into = {found[target[trace_id]].id for trace_id in merges}
    return {trace_id: found[external] for trace_id, external in target.items()}, decided.created, merged_into, folded


def merge_conversation(placeholder_id: int, into: Conversation) -> set[int]:
    """Move everything of a placeholder conversation into `into` and delete the placeholder.

    Returns the ids of the rounds of `into` that a placeholder round with the same key was folded
    into: their rows must be numbered, linked and counted again."""
    rows = sql.fetch(f"SELECT {sql.columns(CONVERSATION_COLUMNS)} FROM {sql.table(Conversation)} WHERE id = %s",
                     [placeholder_id])
    if not rows or placeholder_id == into.id:
        return set()
    placeholder = sql.instances(Conversation, CONVERSATION_COLUMNS, rows)[0]
    results = tool_context.results_in(placeholder_id)
    select_keys = f"SELECT {sql.quote('key')}, id FROM {sql.table(Round)} WHERE conversation_id = %s"
    taken = dict(sql.fetch(select_keys, [into.id]))
    folded = set()
    for key, round_id in sql.fetch(select_keys, [placeholder_id]):
        if key in taken:  # the same turn already started in the target: fold its rows into that round
            folded.add(taken[key])
            _fold_round(round_id, taken[key])  # before the rows move: the target's own answers are read
            for model in (LLMCall, ToolCall, CompressionEvent, SkillActivation, ToolRequest):
                sql.execute(f"UPDATE {sql.table(model)} SET round_id = %s WHERE round_id = %s", [taken[key], round_id])
            sql.execute(f"DELETE FROM {sql.table(Round)} WHERE id = %s", [round_id])
    for model in CONVERSATION_ROWS:
        sql.execute(f"UPDATE {sql.table(model)} SET conversation_id = %s WHERE conversation_id = %s",
                    [into.id, placeholder_id])
    rollups.deleting(Conversation, [placeholder_id])
    sql.execute(f"DELETE FROM {sql.table(Conversation)} WHERE id = %s", [placeholder_id])  # nothing refers to it now
    tool_context.update_after_merge(into.id, results)
    into.started_at = min(into.started_at, placeholder.started_at)
    into.last_activity_at = max(into.last_activity_at, placeholder.last_activity_at)
    for name in PROFILE_FIELDS:
        if not getattr(into, name):
            setattr(into, name, getattr(placeholder, name))
    if placeholder.title_explicit and not into.title_explicit:
        into.title, into.title_explicit = placeholder.title, True
    sql.update_rows(Conversation, [into], CONVERSATION_WIDENED)
    return folded


def _fold_round(placeholder_round: int, into_round: int) -> None:
    """Before a placeholder's round is folded into `into_round`, what it brings that would have won
    had its spans come with the target's (`_widen_round`): its start and end where they widen the
    target's; its status when it held the turn's root, finished; its user message when it started
    first or the target has none; its final answer when the target's is none or only one of its
    LLM calls' answers (a fallback: `fill_final_answers` then picks the latest of them all)."""
    columns = ["id", "started_at", "ended_at", "duration_ms", "status", "user_message", "final_answer"]
    rows = sql.instances(Round, columns, sql.fetch(
        f"SELECT {sql.columns(columns)} FROM {sql.table(Round)} WHERE id IN (%s, %s)", [placeholder_round, into_round]))
    by_id = {r.id: r for r in rows}
    placeholder, into = by_id[placeholder_round], by_id[into_round]
    if placeholder.user_message and (not into.user_message or placeholder.started_at < into.started_at):
        into.user_message = placeholder.user_message
    if placeholder.final_answer and (not into.final_answer or into.final_answer in round_answers(into_round)):
        into.final_answer = placeholder.final_answer
    into.started_at = min(into.started_at, placeholder.started_at)
    if placeholder.ended_at and (into.ended_at is None or placeholder.ended_at > into.ended_at):
        into.ended_at = placeholder.ended_at
    if placeholder.status != Status.RUNNING and (into.status == Status.RUNNING or placeholder.status == Status.ERROR):
        into.status = placeholder.status  # the placeholder held the turn's root, finished
    if into.ended_at and into.status != Status.RUNNING:
        into.duration_ms = (into.ended_at - into.started_at).total_seconds() * 1000
    sql.update_rows(Round, [into], ["started_at", "ended_at", "duration_ms", "status", "user_message", "final_answer"])


def _rounds_by_key(keys: list[tuple[int, str]]) -> dict[tuple[int, str], Round]:
    rows: list[tuple] = []
    for chunk in sql.chunked(sorted(keys)):
        conversation_ids = sorted({k[0] for k in chunk})
        names = sorted({k[1] for k in chunk})
        rows += sql.fetch(
            f"SELECT {sql.columns(ROUND_COLUMNS)} FROM {sql.table(Round)} WHERE conversation_id IN "
            f"({sql.marks(conversation_ids)}) AND {sql.quote('key')} IN ({sql.marks(names)})",
            [*conversation_ids, *names],
        )
    wanted = set(keys)
    return {
        (r.conversation_id, r.key): r for r in sql.instances(Round, ROUND_COLUMNS, rows)
        if (r.conversation_id, r.key) in wanted
    }


def resolve_rounds(
    spans: list[NormalisedSpan], conversations: dict[str, Conversation]
) -> tuple[dict[tuple[int, str], Round], set[int]]:
    """{(conversation id, round key): Round} updated from `spans`, and the ids of rounds created now."""
    grouped = _group_by((s for s in spans if s.in_round), lambda s: (conversations[s.record.trace_id].id, s.round_key))
    if not grouped:
        return {}, set()
    existing = _rounds_by_key(list(grouped))
    missing = [k for k in grouped if k not in existing]
    created: set[int] = set()
    if missing:
        sql.insert_rows(
            Round, [Round(conversation_id=c, key=key, trace_id=grouped[(c, key)][0].record.trace_id,
                          started_at=min(s.started_at for s in grouped[(c, key)])) for c, key in missing],
            ignore_conflicts=True,
        )
        fresh = _rounds_by_key(missing)
        created = {r.id for r in fresh.values()}
        existing.update(fresh)
    changed = []
    for key, group in grouped.items():
        round_ = existing[key]
        before = tuple(getattr(round_, name) for name in ROUND_WIDENED)
        _widen_round(round_, group)
        if before != tuple(getattr(round_, name) for name in ROUND_WIDENED):
            changed.append(round_)
    sql.update_rows(Round, sorted(changed, key=lambda r: r.id), ROUND_WIDENED)
    return existing, created


def fill_user_messages(round_ids: set[int]) -> None:
    """Rounds still without a user message take the last user text of their earliest LLM call's
    input, as a batch takes it from its spans (`_widen_round`), once that call holds it: its
    messages were rebuilt from event logs, or a fold brought the call in."""
    r, c = sql.table(Round), sql.table(LLMCall)
    changed = []
    for chunk in sql.chunked(sorted(round_ids)):
        earliest = sql.fetch(
            f"SELECT x.round_id, x.input_messages FROM {c} x WHERE x.id IN (SELECT (SELECT y.id FROM {c} y "
            f"WHERE y.round_id = r.id ORDER BY y.started_at, y.id LIMIT 1) FROM {r} r "
            f"WHERE r.id IN ({sql.marks(chunk)}) AND r.user_message = %s)", [*chunk, ""])
        for call in sql.instances(LLMCall, ["round_id", "input_messages"], earliest):
            if text := last_text(call.input_messages or [], "user"):
                changed.append(Round(id=call.round_id, user_message=text))
    sql.update_rows(Round, sorted(changed, key=lambda r: r.id), ["user_message"])


def _widen_round(round_: Round, group: list[NormalisedSpan]) -> None:
    ordered = sorted(group, key=lambda s: (s.started_at, not s.is_root))
    first = ordered[0]
    if first.started_at <= round_.started_at or not round_.user_message:
        text = next((s.user_message for s in ordered if s.user_message), "") or next(
            (last_text(s.llm["input_messages"], "user") for s in ordered if s.llm), ""
        )
        if text:
            round_.user_message = text
    round_.started_at = min(round_.started_at, first.started_at)
    finished = [s.ended_at for s in group if s.ended_at]
    if finished and (round_.ended_at is None or max(finished) > round_.ended_at):
        round_.ended_at = max(finished)
    # The turn's answer as its root (or ctxlens.round.final_answer) states it; rounds whose root
    # says nothing get the last LLM answer from pipeline.ingest.write.linking.
    stated = next((s.final_answer for s in group if s.final_answer), "")
    if stated:
        round_.final_answer = stated
    for root in (s for s in group if s.is_root):
        round_.status = Status.RUNNING if root.ended_at is None else (Status.ERROR if root.status == "error" else Status.OK)
    if round_.ended_at and round_.status != Status.RUNNING:
        round_.duration_ms = (round_.ended_at - round_.started_at).total_seconds() * 1000
