"""Token work the ingest response does not wait for, done right after it and never lost.

Rows that arrive without token counts are stored with `tokens_pending=True`: LLM calls with
messages but without usage counts, and tool calls without `ctxlens.tool.observation_tokens`
whose observation the ingest could not count before its transaction (the requesting LLM call
not in the batch: pipeline.ingest.write.precount), or counted for the model of one LLM call
and then linked to another that counts otherwise (pipeline.ingest.write.linking, and admin
edits: pipeline.admin.counts).
`complete_some()` tokenises a chunk of them (`pipeline.tokens.counting.count_tokens`), fills the counts,
the context composition and the cost, clears the flag, re-aggregates the touched rounds and sends
`ingest_committed` again. `schedule()` counts on a thread of its own and queues only the write
on the ingest writer thread, after every ingest commit that left pending rows (normally done
well within a second). A message is tokenised exactly up to MAX_EXACT_CHARS; past that the
count is estimated from the head and the row is marked `tokens_estimated`, so a 20 MB prompt
costs what 100 KB does. Because the flag
lives in the database, work a stopped process left behind is not lost: `resume()` — called by
the OTLP views, and cheap for read paths to call too — looks for it once per process.

Counting runs outside the transaction, so ingest may change a row in between (a log batch
rebuilds an LLM call's messages, linking gives a tool to another call): the write re-reads the
still-pending rows under lock and writes the counts only of rows whose content is unchanged,
counting the others again.

LLM calls that report their input token count get their composition while being ingested
(pipeline.ingest.normalise.composition); only calls without counts are tokenised here.

The same runs count each tool call's tokens at every output level (pipeline.ingest.write.tool_levels),
and bring the context cost of the tool results a call carried up to date once its input tokens
are known (pipeline.ingest.write.tool_context).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from django.db import OperationalError, connections, transaction

from pipeline.ingest.normalise.composition import composition_from_counts
from pipeline.ingest.write import sql, tool_context, tool_levels
from pipeline.ingest.write.precount import count_observation
from pipeline.ingest.write.sql import update_rows
from pipeline.ingest.write.writer_threads import writer
from pipeline.insight.costs import price_llm_call
from pipeline.insight.finding_counts import mark_stale
from pipeline.models import Conversation, LLMCall, ToolCall
from pipeline.rollups import track as rollups
from pipeline.signals import empty_changes, ingest_committed
from pipeline.tokens.counting import MessageCounts

logger = logging.getLogger(__name__)

CHUNK = 200


LLM_COLUMNS = ("id", "model", "round_id", "conversation_id", "input_messages", "output_messages", "input_tokens",
               "output_tokens", "total_tokens", "context_window", "context_tokens", "context_composition",
               "tokens_estimated", "tokens_approximate",
               # what pricing reads besides (pipeline.insight.costs.PricedCall)
               "request_model", "provider", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens", "started_at",
               "cost_usd")
LLM_FILLED = ["input_tokens", "output_tokens", "total_tokens", "context_window", "context_tokens",
              "context_composition", "tokens_estimated", "tokens_approximate", "cost_usd", "tokens_pending"]
# What the counts are computed from: a row whose content changed after it was counted is counted again.
LLM_CONTENT = ("model", "input_messages", "output_messages", *LLM_FILLED[:-1])
TOOL_COLUMNS = ("id", "round_id", "conversation_id", "observation", "observation_tokens", "tokens_estimated",
                "tokens_approximate", "llm_call__model")
TOOL_FILLED = ["observation_tokens", "tokens_estimated", "tokens_approximate", "tokens_pending"]


def _llm_content(call: LLMCall) -> tuple:
    return tuple(getattr(call, name) for name in LLM_CONTENT)


def _tool_content(tool: ToolCall) -> tuple:
    return tool.observation, tool.llm_call.model if tool.llm_call else None


def _count_llm_call(call: LLMCall) -> tuple[int, int]:
    """Fill what the span did not count; returns the (input, output) tokens added. Each message
    is tokenised once, by the runtime's rule (pipeline.tokens.counting.count_messages), and
    those per-message counts give both the input total and the composition."""
    from pipeline.tokens.counting import MAX_EXACT_CHARS, context_window, count_messages

    added_in = added_out = 0
    counted_in = None
    if call.input_messages and (not call.input_tokens or not call.context_composition):
        counted_in = count_messages(call.input_messages, call.model, max_chars=MAX_EXACT_CHARS, exact=False)
    if not call.input_tokens and counted_in is not None:
        call.input_tokens = added_in = counted_in.tokens
        _mark(call, counted_in)
    if not call.output_tokens and call.output_messages:
        counted_out = count_messages(call.output_messages, call.model, max_chars=MAX_EXACT_CHARS, exact=False)
        call.output_tokens = added_out = counted_out.tokens
        _mark(call, counted_out)
    call.total_tokens = max(call.total_tokens, call.input_tokens + call.output_tokens)
    if not call.context_composition and counted_in is not None:
        window = call.context_window or context_window(call.model)
        call.context_composition = composition_from_counts(
            call.input_messages, counted_in.per_message, call.input_tokens, window)
        call.context_tokens = call.context_tokens or sum(
            v for k, v in call.context_composition.items() if k != "free"
        )
        call.context_window = window
        call.tokens_approximate = call.tokens_approximate or counted_in.approximate
    call.repriced = price_llm_call(call)  # the cost of the counts just filled in
    call.tokens_pending = False
    return added_in, added_out


def _mark(call: LLMCall, counted: MessageCounts) -> None:
    call.tokens_estimated = call.tokens_estimated or counted.estimated
    call.tokens_approximate = call.tokens_approximate or counted.approximate


def _count_tool_call(tool: ToolCall) -> None:
    model = tool.llm_call.model if tool.llm_call else None
    tool.observation_tokens, tool.tokens_estimated, tool.tokens_approximate = count_observation(tool.observation, model)
    tool.tokens_pending = False


@dataclass
class Counted:
    """One chunk of pending rows with their counts filled in, not yet written; `read` holds the
    content each row had when it was read, by id."""

    calls: list[LLMCall]
    tools: list[ToolCall]
    read: dict[tuple[str, int], tuple] = field(default_factory=dict)
    levels: list[ToolCall] = field(default_factory=list)  # tool calls with their tokens at each output level

    @property
    def full(self) -> bool:
        return CHUNK in (len(self.calls), len(self.tools), len(self.levels))


def count_some() -> Counted:
    """Read one chunk of pending rows and count their tokens (CPU work, outside any transaction)."""
    # in id order: the partial indexes on the pending rows find them (by start time would walk every row)
    calls = list(LLMCall.objects.filter(tokens_pending=True).only(*LLM_COLUMNS).order_by("pk")[:CHUNK])
    tools = list(ToolCall.objects.filter(tokens_pending=True).only(*TOOL_COLUMNS).select_related("llm_call")
                 .order_by("pk")[:CHUNK])
    counted = Counted(calls, tools)
    for call in calls:
        counted.read[("llm", call.pk)] = _llm_content(call)
        call.added = _guarded_count(call, _count_llm_call, (0, 0))
    for tool in tools:
        counted.read[("tool", tool.pk)] = _tool_content(tool)
        _guarded_count(tool, _count_tool_call, None)
    counted.levels = tool_levels.count_some(CHUNK)
    return counted


def _guarded_count(row: LLMCall | ToolCall, count: Callable, uncounted: Any) -> Any:
    """Count one row; a row that cannot be counted is logged and left uncounted (not pending,
    marked estimated), so it never holds back the rows queued behind it."""
    try:
        return count(row)
    except Exception:
        logger.exception("could not count the tokens of %s %s; leaving them uncounted", type(row).__name__, row.pk)
        row.tokens_pending, row.tokens_estimated = False, True
        return uncounted


def _current(counted: Counted) -> tuple[list[LLMCall], list[ToolCall]]:
    """The rows of `counted` that are still pending, read again under lock (PostgreSQL FOR UPDATE;
    SQLite's write lock is already held), carrying the counts: those counted before when their
    content is unchanged, else counted again now (a log batch rebuilt the messages meanwhile)."""
    before = {c.pk: c for c in counted.calls}
    calls = list(LLMCall.objects.select_for_update().filter(pk__in=list(before), tokens_pending=True)
                 .only(*LLM_COLUMNS).order_by("pk"))
    for call in calls:
        if _llm_content(call) == counted.read[("llm", call.pk)]:
            done = before[call.pk]
            for name in LLM_FILLED:
                setattr(call, name, getattr(done, name))
            call.added, call.repriced = done.added, getattr(done, "repriced", False)
        else:
            call.added = _guarded_count(call, _count_llm_call, (0, 0))
    before_tools = {t.pk: t for t in counted.tools}
    tools = list(ToolCall.objects.select_for_update(of=("self",)).filter(pk__in=list(before_tools), tokens_pending=True)
                 .only(*TOOL_COLUMNS).select_related("llm_call").order_by("pk"))
    for tool in tools:
        if _tool_content(tool) == counted.read[("tool", tool.pk)]:
            done = before_tools[tool.pk]
            for name in TOOL_FILLED:
                setattr(tool, name, getattr(done, name))
        else:
            _guarded_count(tool, _count_tool_call, None)
    return calls, tools


def _any_still_pending(counted: Counted) -> bool:
    """Whether any row of `counted` still waits for its counts: one statement (it runs after every
    ingest that left work, so the ORM's per-query cost is worth saving here)."""
    parts: list[str] = []
    params: list = []
    for model, flag, rows in ((LLMCall, "tokens_pending", counted.calls), (ToolCall, "tokens_pending", counted.tools),
                              (ToolCall, "levels_pending", counted.levels)):
        if rows:
            ids = [row.pk for row in rows]
            parts.append(f"SELECT 1 FROM {sql.table(model)} WHERE id IN ({sql.marks(ids)}) AND {sql.quote(flag)} = %s")
            params += [*ids, True]
    return bool(parts) and bool(sql.fetch(" UNION ALL ".join(parts) + " LIMIT 1", params))


def write_counted(counted: Counted) -> None:
    """Write the counts of `counted`, with the conversations locked first like an ingest
    transaction, so the two never deadlock. Rows that are no longer pending are left alone;
    rows whose content changed since they were counted are counted again (issue #10)."""
    from pipeline.ingest.write.counters import recompute_counters

    if not _any_still_pending(counted):  # another run (PostgreSQL has several writer threads) wrote them
        return
    # The rollups' changes written once, in key order, like an ingest batch's: no deadlock between them.
    with transaction.atomic(), sql.shared_cursor(), rollups.batched():
        sql.lock_rows(Conversation, {row.conversation_id for row in (*counted.calls, *counted.tools, *counted.levels)})
        calls, tools = _current(counted)
        # a placeholder merged meanwhile moved rows to another conversation: lock that one too
        sql.lock_rows(Conversation, {row.conversation_id for row in (*calls, *tools)})
        update_rows(LLMCall, calls, LLM_FILLED)
        update_rows(ToolCall, tools, TOOL_FILLED)
        tool_context.update_for_calls(c.pk for c in calls if c.added[0])
        leveled = tool_levels.write(counted.levels)
        added_in = sum(c.added[0] for c in calls)
        added_out = sum(c.added[1] for c in calls)
        rounds = {row.round_id for row in (*calls, *tools, *leveled) if row.round_id}
        conversations = {row.conversation_id for row in (*calls, *tools, *leveled)}
        if added_in or added_out or any(getattr(c, "repriced", False) for c in calls):
            recompute_counters(rounds, conversations)
        mark_stale(conversations)  # token counts decide findings (oversized observations, a full window)
        changes = empty_changes()
        changes.update(round_ids=sorted(rounds), conversation_ids=sorted(conversations),
                       input_tokens=added_in, output_tokens=added_out)
        transaction.on_commit(lambda: ingest_committed.send_robust(sender=complete_some, changes=changes))


def complete_some(write: Callable[[Counted], None] = write_counted) -> bool:
    """Fill one chunk of pending token counts; True when a chunk was full (there may be more).
    `write` runs the transaction (the background runner hands it to the writer thread)."""
    counted = count_some()
    if not counted.calls and not counted.tools and not counted.levels:
        return False
    write(counted)
    return counted.full


def complete_pending() -> None:
    """Fill every pending token count now, in this thread (tests, management commands)."""
    while complete_some():
        pass


class _Runner:
    """Counts one chunk at a time on a counting thread of its own and queues only the write on
    the ingest writer thread, behind (never ahead of) the ingest requests of this process:
    tokenising, bounded per message by MAX_EXACT_CHARS, never holds the writer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued = False
        self._resumed = False
        self._counter: ThreadPoolExecutor | None = None

    def schedule(self) -> None:
        with self._lock:
            if self._queued:
                return
            self._queued = True
            if self._counter is None:
                self._counter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctxlens-token-counter")
        try:
            self._counter.submit(self._run)
        except RuntimeError:  # the interpreter is stopping: the rows stay pending for resume()
            with self._lock:
                self._queued = False

    def resume(self) -> None:
        """The first call in a process looks for work an earlier process left unfinished."""
        with self._lock:
            first, self._resumed = not self._resumed, True
        if first:
            self.schedule()

    def _run(self) -> None:
        with self._lock:
            self._queued = False
        more = False
        try:
            more = complete_some(write=lambda counted: writer().submit(write_counted, counted).result())
        except RuntimeError:  # the writer is stopping: the rows stay pending for resume()
            return
        except OperationalError as error:  # deadlocked with a writer of another process: go again
            more = sql.is_deadlock(error)
            if not more:
                logger.exception("deferred token work failed; will retry")
        except Exception:  # the rows stay pending; the next schedule() retries them
            logger.exception("deferred token work failed; will retry")
        finally:
            connections.close_all()  # the counting thread's own connection: reads only, opened per chunk
        if more:
            self.schedule()


_runner = _Runner()


def schedule() -> None:
    """Queue the completion of pending token counts on the writer thread (cheap; coalesced)."""
    _runner.schedule()


def resume() -> None:
    """Pick up pending work left by an earlier process; only the first call per process acts."""
    _runner.resume()
