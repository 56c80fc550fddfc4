"""Token work the ingest response does not wait for, done right after it and never lost.

Rows that arrive without token counts are stored with `tokens_pending=True`: LLM calls with
messages but without usage counts, and tool calls without `ctxlens.tool.observation_tokens`.
`complete_some()` tokenises a chunk of them (`pipeline.tokens.count_tokens`), fills the counts
and the context composition, clears the flag, re-aggregates the touched rounds and sends
`ingest_committed` again. `schedule()` queues that on the ingest writer thread after every
ingest commit that left pending rows (normally done well within a second). Because the flag
lives in the database, work a stopped process left behind is not lost: `resume()` — called by
the OTLP views, and cheap for read paths to call too — looks for it once per process.

LLM calls that report their input token count get their composition while being ingested
(pipeline.ingest.composition); only calls without counts are tokenised here.
"""

from __future__ import annotations

import logging
import threading

from django.db import OperationalError, transaction

from pipeline.ingest.composition import composition_from_tokens
from pipeline.ingest.messages import message_text
from pipeline.ingest import sql
from pipeline.ingest.sql import update_rows
from pipeline.ingest.writer import writer
from pipeline.models import Conversation, LLMCall, ToolCall
from pipeline.signals import ingest_committed

logger = logging.getLogger(__name__)

CHUNK = 200


LLM_COLUMNS = ("id", "model", "round_id", "conversation_id", "input_messages", "output_messages", "input_tokens",
               "output_tokens", "total_tokens", "context_window", "context_tokens", "context_composition")
LLM_FILLED = ["input_tokens", "output_tokens", "total_tokens", "context_window", "context_tokens",
              "context_composition", "tokens_pending"]


def _count_llm_call(call: LLMCall) -> tuple[int, int]:
    """Fill what the span did not count; returns the (input, output) tokens added."""
    from pipeline.tokens import context_window, count_tokens

    added_in = added_out = 0
    if not call.input_tokens and call.input_messages:
        call.input_tokens = added_in = sum(count_tokens(message_text(m), call.model) for m in call.input_messages)
    if not call.output_tokens and call.output_messages:
        call.output_tokens = added_out = sum(count_tokens(message_text(m), call.model) for m in call.output_messages)
    call.total_tokens = max(call.total_tokens, call.input_tokens + call.output_tokens)
    if not call.context_composition and call.input_messages:
        window = call.context_window or context_window(call.model)
        call.context_composition = composition_from_tokens(call.input_messages, call.model, call.input_tokens, window)
        call.context_tokens = call.context_tokens or sum(
            v for k, v in call.context_composition.items() if k != "free"
        )
        call.context_window = window
    call.tokens_pending = False
    return added_in, added_out


def complete_some() -> bool:
    """Fill one chunk of pending token counts; True when a chunk was full (there may be more).

    Tokenising happens before the transaction; the transaction only writes the results, with
    the conversations locked first like an ingest transaction, so the two never deadlock.
    """
    from pipeline.ingest.counters import recompute_counters
    from pipeline.ingest.store import empty_changes
    from pipeline.tokens import count_tokens

    calls = list(LLMCall.objects.filter(tokens_pending=True).only(*LLM_COLUMNS)[:CHUNK])
    tools = list(ToolCall.objects.filter(tokens_pending=True).only(
        "id", "round_id", "conversation_id", "observation", "observation_tokens", "llm_call__model"
    ).select_related("llm_call")[:CHUNK])
    if not calls and not tools:
        return False
    added_in = added_out = 0
    for call in calls:
        more_in, more_out = _count_llm_call(call)
        added_in, added_out = added_in + more_in, added_out + more_out
    for tool in tools:
        tool.observation_tokens = count_tokens(tool.observation, tool.llm_call.model if tool.llm_call else None)
        tool.tokens_pending = False
    rounds = {row.round_id for row in (*calls, *tools) if row.round_id}
    conversations = {row.conversation_id for row in (*calls, *tools)}
    with transaction.atomic():
        sql.lock_rows(Conversation, conversations)
        update_rows(LLMCall, sorted(calls, key=lambda c: c.pk), LLM_FILLED)
        update_rows(ToolCall, sorted(tools, key=lambda t: t.pk), ["observation_tokens", "tokens_pending"])
        if added_in or added_out:
            recompute_counters(rounds, conversations)
        changes = empty_changes()
        changes.update(round_ids=sorted(rounds), conversation_ids=sorted(conversations),
                       input_tokens=added_in, output_tokens=added_out)
        transaction.on_commit(lambda: ingest_committed.send_robust(sender=complete_some, changes=changes))
    return len(calls) == CHUNK or len(tools) == CHUNK


def complete_pending() -> None:
    """Fill every pending token count now, in this thread (tests, management commands)."""
    while complete_some():
        pass


class _Runner:
    """Runs the pending work on the ingest writer thread, one chunk per turn, so it queues behind
    (and never competes with) the ingest requests of this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued = False
        self._resumed = False

    def schedule(self) -> None:
        with self._lock:
            if self._queued:
                return
            self._queued = True
        try:
            writer().submit(self._run)
        except RuntimeError:  # the writer is stopping: the rows stay pending for resume()
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
            more = complete_some()
        except OperationalError as error:  # deadlocked with a writer of another process: go again
            more = sql.is_deadlock(error)
            if not more:
                logger.exception("deferred token work failed; will retry")
        except Exception:  # the rows stay pending; the next schedule() retries them
            logger.exception("deferred token work failed; will retry")
        if more:
            self.schedule()


_runner = _Runner()


def schedule() -> None:
    """Queue the completion of pending token counts on the writer thread (cheap; coalesced)."""
    _runner.schedule()


def resume() -> None:
    """Pick up pending work left by an earlier process; only the first call per process acts."""
    _runner.resume()
