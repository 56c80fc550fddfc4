"""Each conversation's finding counts, stored for the list and the overview and kept up to date
off the request path.

The findings API computes findings fresh on every read (pipeline.insight.findings): exact, but
too much work to repeat for every row of a list. So Conversation keeps `finding_counts`
({code: n}) and `finding_count`, and `findings_stale`, a mark (0: current) that every
transaction changing the conversation sets to a fresh random value (`mark_stale`: the ingest transaction in
pipeline.ingest.write.store, and deferred token counting, pipeline.ingest.write.deferred,
whose counts decide `oversized_observation` and `near_window_limit`). Being in the database,
stale work is never lost with a process.

After such a commit, `ingest_committed` reaches `on_ingest_committed`, which schedules a
refresh: on a thread of its own it reads the stale conversations, computes their findings,
and queues only the write on the ingest writer thread (as the deferred token work does). The
write stores the counts it computed and clears `findings_stale` only if no change arrived
meanwhile (the mark is still the one read; with several workers, whichever refresh read the
latest mark stores its counts), so a conversation changed during the
refresh is refreshed again; then, for conversations whose counts changed, it sends
`ingest_committed` itself, which updates the pages live. Refreshes run at most once per
REFRESH_INTERVAL_S, each taking every stale conversation, so a conversation receiving spans
continuously is recomputed about once a second, not once per request; and a run that took long
(conversations whose every call breaks the cache are read whole, pipeline.insight.findings)
pushes the next one back by nine times its duration, so the refresh never takes more than a
tenth of a core from the ingest.

How stale the stored counts can be: about REFRESH_INTERVAL_S (1 s) plus the computation and the
writer's queue after the commit that changed the conversation — longer only when the runs are
slow, as above — and again after deferred token counting completes its counts (normally well
within a second). Work a stopped process left
behind is picked up by `resume()`, called by the OTLP receiver and the list and overview pages:
until the first of those runs in a new process, counts stay as the old process left them.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from django.db import connection, connections, transaction

from pipeline.ingest.write import sql
from pipeline.ingest.write.writer_threads import writer
from pipeline.insight.conversation_rows import ConversationRows, read_conversations
from pipeline.insight.findings import conversation_findings, finding_counts, findings_of
from pipeline.models import Conversation
from pipeline.signals import IngestChanges, empty_changes, ingest_committed

logger = logging.getLogger(__name__)

CHUNK = 50  # conversations computed per write
REFRESH_INTERVAL_S = 1.0
# The pause after a run is at least this many times the run's own duration: however heavy the
# conversations, refreshing takes at most 1/(1 + IDLE_SHARE) of a core from the ingest.
IDLE_SHARE = 9
STALE_MARKS = 2**31 - 2  # findings_stale holds 1..2**31-1 (0: current), any database's integer


def mark_stale(conversation_ids: Iterable[int]) -> None:
    """In the transaction that changes these conversations: their counts need a refresh."""
    ids = sorted(set(conversation_ids))
    if ids:
        # A fresh random mark, not a counter: a refresh that read mark m clears the flag only if it
        # still holds m. A counter could go back to a value a slow refresh read (1 → 0 by another
        # worker's refresh → 1 by a new change), and that refresh would then clear the new change.
        mark = secrets.randbelow(STALE_MARKS) + 1
        sql.execute(f"UPDATE {sql.table(Conversation)} SET findings_stale = %s "
                    f"WHERE id IN ({sql.marks(ids)})", [mark, *ids])


@dataclass(frozen=True)
class Counted:
    """One conversation's counts, and the `findings_stale` value they were computed at."""

    conversation_id: int
    stale: int
    counts: dict[str, int]


def count_some(limit: int = CHUNK) -> list[Counted]:
    """Compute the counts of up to `limit` stale conversations (reads only, outside any transaction):
    a constant number of queries for them all (read_conversations)."""
    stale = list(Conversation.objects.filter(findings_stale__gt=0).order_by("id")
                 .only("id", "model", "findings_stale")[:limit])
    by_id = {conversation.pk: conversation for conversation in stale}
    counts: dict[int, dict[str, int]] = {}
    try:
        for conversation_id, rows in read_conversations(by_id):
            counts[conversation_id] = _counts(by_id[conversation_id], rows)
    except Exception:  # a conversation whose rows cannot be read: it and those after it are read one by one
        logger.exception("reading the stale conversations %s together failed; reading them one by one", list(by_id))
    for conversation in stale:
        if conversation.pk not in counts:
            counts[conversation.pk] = _counts(conversation)
    return [Counted(c.pk, c.findings_stale, counts[c.pk]) for c in stale]


def _counts(conversation: Conversation, rows: ConversationRows | None = None) -> dict[str, int]:
    """The conversation's counts, from its `rows` when read already; none when that fails."""
    try:
        found = conversation_findings(conversation) if rows is None else findings_of(conversation, rows)
        return finding_counts(found)
    except Exception:  # one conversation that cannot be read must not hold up the others
        logger.exception("finding counts of conversation %s failed; stored as none", conversation.pk)
        return {}


def write_counts(counted: list[Counted]) -> list[int]:
    """Store the counts; the ids of the conversations whose counts changed, announced after commit.

    Only counts computed at a conversation's latest mark are stored (and clear it); a conversation
    changed since keeps its mark and is counted again. Which those are is read under the rows'
    locks (PostgreSQL; SQLite's transactions take the one write lock at BEGIN), so no mark can
    change between that read and the UPDATE, which still checks the mark: one executemany.
    """
    ids = [c.conversation_id for c in counted]
    with transaction.atomic():
        sql.lock_rows(Conversation, ids)
        stored = {pk: (stale, counts) for pk, stale, counts in Conversation.objects.filter(pk__in=ids)
                  .values_list("id", "findings_stale", "finding_counts")}
        current = [c for c in counted if c.conversation_id in stored and stored[c.conversation_id][0] == c.stale]
        if current:
            as_json = sql.Prepare().json
            with connection.cursor() as cursor:
                cursor.executemany(
                    f"UPDATE {sql.table(Conversation)} SET finding_counts = %s, finding_count = %s, "
                    "findings_stale = 0 WHERE id = %s AND findings_stale = %s",
                    [(as_json(c.counts), sum(c.counts.values()), c.conversation_id, c.stale) for c in current])
        changed = [c.conversation_id for c in current if stored[c.conversation_id][1] != c.counts]
        if changed:
            changes = empty_changes()
            changes["conversation_ids"] = changed
            transaction.on_commit(lambda: _announce(changes))
    return changed


def _announce(changes: IngestChanges) -> None:
    for receiver, error in ingest_committed.send_robust(sender=write_counts, changes=changes):
        if isinstance(error, Exception):
            logger.error("ingest_committed receiver %r failed: %r", receiver, error)


def refresh_some(write: Callable[[list[Counted]], list[int]] = write_counts) -> bool:
    """Refresh one chunk of stale conversations; True when the chunk was full (there may be more)."""
    counted = count_some()
    if counted:
        write(counted)
    return len(counted) == CHUNK


def refresh_stale() -> None:
    """Refresh every stale conversation now, in this thread (tests, management commands)."""
    while refresh_some():
        pass


class _Runner:
    """Computes on a thread of its own, at most one run per REFRESH_INTERVAL_S (or nine times
    the last run's duration), and queues only the writes on the ingest writer thread, behind the
    ingest requests of this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued = False
        self._resumed = False
        self._next_run = 0.0  # time.monotonic() before which no run starts
        self._executor: ThreadPoolExecutor | None = None
        self._stopped = threading.Event()

    def schedule(self) -> None:
        with self._lock:
            if self._queued or self._stopped.is_set():
                return
            self._queued = True
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctxlens-findings")
        try:
            self._executor.submit(self._run)
        except RuntimeError:  # the interpreter is stopping: the conversations stay stale for resume()
            with self._lock:
                self._queued = False

    def resume(self) -> None:
        """The first call in a process looks for work an earlier process left unfinished."""
        with self._lock:
            first, self._resumed = not self._resumed, True
        if first:
            self.schedule()

    def stop(self) -> None:
        """No more refreshes in this process; waits for a run in progress (a waiting one ends at once)."""
        with self._lock:
            self._stopped.set()
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def _run(self) -> None:
        if self._stopped.wait(max(0.0, self._next_run - time.monotonic())):
            return
        with self._lock:
            self._queued = False
        started = time.monotonic()
        more = False
        try:
            more = refresh_some(write=lambda counted: writer().submit(write_counts, counted).result())
        except RuntimeError:  # the writer is stopping: the conversations stay stale for resume()
            return
        except Exception:  # they stay stale; the next schedule() retries them
            logger.exception("refreshing conversation finding counts failed; will retry")
        finally:
            connections.close_all()  # this thread's own connection: reads only, opened per run
            took = time.monotonic() - started
            self._next_run = started + max(REFRESH_INTERVAL_S, took * (1 + IDLE_SHARE))
        if more:
            self.schedule()


_runner = _Runner()


def schedule() -> None:
    """Queue a refresh of the stale conversations' counts (cheap; coalesced)."""
    _runner.schedule()


def resume() -> None:
    """Pick up stale conversations an earlier process left; only the first call per process acts."""
    _runner.resume()


def stop() -> None:
    """End this process's refreshes (tests, before their database goes); stale counts stay stale."""
    _runner.stop()


def on_ingest_committed(sender: object, changes: IngestChanges, **kwargs: object) -> None:
    """Receiver of `ingest_committed` (connected in PipelineConfig.ready): a commit that changed
    conversations schedules a refresh; the refresh's own announcement does not."""
    if sender is not write_counts and changes.get("conversation_ids"):
        schedule()
