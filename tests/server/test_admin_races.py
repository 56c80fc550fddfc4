"""Admin edits racing other writers, on PostgreSQL (tests.concurrency)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.contrib import admin
from django.contrib.messages import get_messages
from django.db import connections, transaction
from django.http import HttpResponse
from django.test import Client
from django.urls import reverse

from pipeline.ingest.records import SpanRecord
from pipeline.ingest.write import sql
from pipeline.ingest.write.store import store_spans
from pipeline.models import Conversation, LLMCall, ToolCall
from pipeline.retention import delete_in_batches
from pipeline.rollups.compact import rebuild_rollups
from tests.admin_forms import change_form
from tests.concurrency import Held, PausedAt, deadlocks, finish, needs_postgres, run_until_it_waits
from tests.factories import make_conversation
from tests.stored_rollups import rollup_rows

pytestmark = [pytest.mark.django_db(transaction=True), needs_postgres]
TRACE = "5cf92f3577b34da6a3ce929d0e0e4799"


def a_call_and_its_tool() -> LLMCall:
    """One stored LLM call (recent: the rebuild compared with keeps the recent minutes) that asked
    for a tool, and the tool call that answered it."""
    now = time.time_ns()
    asks = [{"role": "assistant", "parts": [{"type": "tool_call", "id": "call_1", "name": "lookup", "arguments": {}}]}]
    common = {"gen_ai.conversation.id": "conv-race"}
    store_spans([
        SpanRecord(TRACE, "0000000000000001", "chat gpt-4o", now - 3 * 10**9, now - 2 * 10**9, attributes={
            **common, "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
            "gen_ai.usage.input_tokens": 1200, "gen_ai.usage.output_tokens": 30,
            "gen_ai.output.messages": json.dumps(asks)}),
        SpanRecord(TRACE, "0000000000000002", "execute_tool lookup", now - 2 * 10**9, now - 10**9, attributes={
            **common, "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup",
            "gen_ai.tool.call.id": "call_1"}),
    ])
    call = LLMCall.objects.get()
    assert ToolCall.objects.get().llm_call_id == call.pk
    return call


def delete_in_the_admin(call: LLMCall) -> None:
    admin.site._registry[LLMCall].delete_model(None, LLMCall.objects.get(pk=call.pk))


def delete_in_a_prune_batch(call: LLMCall) -> None:
    delete_in_batches(LLMCall.objects.filter(pk=call.pk))


def save_while_held(client: Client, url: str, data: dict, held_work: Callable[[], object]) -> HttpResponse:
    """POST the admin form while `held_work` is done and not yet committed by another connection;
    commit it once the save waits on a lock; the save's response."""
    held = Held(held_work)
    responses = []
    saving = run_until_it_waits(lambda: responses.append(client.post(url, data)))
    assert not responses, "the save did not wait for the other writer: the race this test is about did not happen"
    held.commit()
    finish(saving)
    return responses[0]


@pytest.mark.parametrize("deleted_by", [delete_in_the_admin, delete_in_a_prune_batch], ids=["admin", "prune"])
def test_an_llm_call_deleted_while_an_operator_saves_it_is_said_gone_and_stays_gone(client, alice, deleted_by):
    """Another operator or a prune batch (each locks the conversation, then the rows) deletes the
    call after this save has read it, and commits while the save waits: the save must not put the
    row back without its figures, nor fail with a 500."""
    call = a_call_and_its_tool()
    client.force_login(alice)
    url, data = change_form(client, call, input_tokens=5000)

    response = save_while_held(client, url, data, lambda: deleted_by(call))

    assert response.status_code == 302 and response.url == reverse("admin:index")
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        f"llm call with ID “{call.pk}” doesn’t exist. Perhaps it was deleted?"]
    assert not LLMCall.objects.exists()
    assert ToolCall.objects.get().llm_call_id is None
    incremental = rollup_rows()
    rebuild_rollups()
    assert rollup_rows() == incremental


def test_a_tool_call_saved_while_its_llm_call_is_deleted_keeps_what_the_delete_left(client, alice):
    """The delete of the call unlinks its tool calls; the tool call's form still names the call:
    the save writes what the operator changed, not the link it read before (a foreign key to a
    deleted row, refused at commit with a 500)."""
    call = a_call_and_its_tool()
    tool = ToolCall.objects.get()
    client.force_login(alice)
    url, data = change_form(client, tool, success=False)
    assert data["llm_call"] == call.pk

    response = save_while_held(client, url, data, lambda: delete_in_the_admin(call))

    assert response.status_code == 302 and response.url == reverse("admin:pipeline_toolcall_changelist")
    tool.refresh_from_db()
    assert (tool.success, tool.llm_call_id) == (False, None)
    assert Conversation.objects.get().error_count == 1
    incremental = rollup_rows()
    rebuild_rollups()
    assert rollup_rows() == incremental


# The statement each admin change is paused before. Before the fix, against a prune batch:
# - the edit held the call's row there; prune took the rollup rows, then waited for the row;
# - the delete held the call's tool requests there; prune locked the call, then its cascade
#   waited for them;
# - the conversation's delete (Django's) had taken the rollup rows and deleted the rows; prune
#   held its conversation and waited for the rollup rows (prune paused there: a 500 for the
#   operator), or locked the conversation and waited for the rows (the admin paused: prune aborted).
PAUSED_BEFORE = {"edit": "pipeline_rollup", "delete": 'DELETE FROM "pipeline_llmcall"',
                 "delete conversation": 'DELETE FROM "pipeline_conversation"'}


@pytest.mark.parametrize("change", PAUSED_BEFORE)
def test_a_prune_batch_queues_behind_an_admin_change_of_the_same_call_instead_of_deadlocking(client, alice, change):
    """The operator's change of the call (or of its conversation) is paused before its last step;
    a prune batch deleting the same call waits for it, and no deadlock happens."""
    call = a_call_and_its_tool()
    client.force_login(alice)
    if change == "edit":
        url, data = change_form(client, call, input_tokens=5000)
    elif change == "delete":
        url, data = reverse("admin:pipeline_llmcall_delete", args=[call.pk]), {"post": "yes"}
    else:
        url, data = reverse("admin:pipeline_conversation_delete", args=[call.conversation_id]), {"post": "yes"}
    before = deadlocks()

    changing = PausedAt(PAUSED_BEFORE[change], lambda: client.post(url, data))
    pruning = run_until_it_waits(lambda: delete_in_a_prune_batch(call))
    assert pruning.is_alive()
    changing.go_on()
    response = changing.result()
    finish(pruning)
    changed = deadlocks(changing.backend, pruning.backend)

    listed = "conversation" if change == "delete conversation" else "llmcall"
    assert response.status_code == 302 and response.url == reverse(f"admin:pipeline_{listed}_changelist")
    assert not LLMCall.objects.exists()
    assert changed == before
    incremental = rollup_rows()
    rebuild_rollups()
    assert rollup_rows() == incremental


def test_an_admin_edit_queues_behind_ingest_replacing_the_call_and_finds_it_gone(client, alice):
    """Ingest of a finished span has deleted the rows its open version left and is about to take
    its next lock; an edit of the call waits for that ingest, then finds the row gone. (Ingest's
    next lock there was the conversation's, locked only after deleting: the edit held it and
    waited for the row, and PostgreSQL aborted the edit with a 500.)"""
    started = time.time_ns() - 10**9

    def chat(end: int) -> SpanRecord:
        return SpanRecord(TRACE, "0000000000000001", "chat gpt-4o", started, end, attributes={
            "gen_ai.conversation.id": "conv-race", "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "gpt-4o", "gen_ai.usage.input_tokens": 1200})
    store_spans([chat(0)])  # still running
    call = LLMCall.objects.get()
    client.force_login(alice)
    url, data = change_form(client, call, output_tokens=7)
    before = deadlocks()

    ingesting = PausedAt(" FOR UPDATE", lambda: store_spans([chat(started + 10**8)]),
                         after='DELETE FROM "pipeline_llmcall"')
    responses = []
    saving = run_until_it_waits(lambda: responses.append(client.post(url, data)))
    assert saving.is_alive()
    ingesting.go_on()
    assert ingesting.result().accepted == 1
    finish(saving)
    after = deadlocks(ingesting.backend, saving.backend)

    assert responses[0].status_code == 302 and responses[0].url == reverse("admin:index")
    assert [str(m) for m in get_messages(responses[0].wsgi_request)] == [
        f"llm call with ID “{call.pk}” doesn’t exist. Perhaps it was deleted?"]
    assert LLMCall.objects.get().duration_ms == 100.0
    assert after == before
    incremental = rollup_rows()
    rebuild_rollups()
    assert rollup_rows() == incremental


def test_a_transaction_aborted_to_end_a_deadlock_starts_again():
    """sql.retrying_deadlocks, as the admin's views and prune's batches run: two transactions lock
    two conversations in opposite orders; PostgreSQL aborts one, which runs again and completes."""
    first, second = make_conversation("conv-1"), make_conversation("conv-2")
    both_hold_one = threading.Barrier(2, timeout=30)
    attempts: list[str] = []

    def lock(name: str, one: Conversation, other: Conversation) -> None:
        def transaction_() -> None:
            with transaction.atomic():
                attempts.append(name)
                sql.lock_rows(Conversation, [one.pk])
                if attempts.count(name) == 1:
                    both_hold_one.wait()
                sql.lock_rows(Conversation, [other.pk])
        try:
            sql.retrying_deadlocks(transaction_)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(2) as pool:
        done = [pool.submit(lock, "a", first, second), pool.submit(lock, "b", second, first)]
        for future in done:
            future.result(30)

    assert sorted(attempts) in (["a", "a", "b"], ["a", "b", "b"])  # one of them twice
