"""Admin edits racing other writers, on PostgreSQL (tests.concurrency)."""

from __future__ import annotations

import json
import time

import pytest
from django.contrib import admin
from django.contrib.messages import get_messages
from django.urls import reverse

from pipeline.ingest.records import SpanRecord
from pipeline.ingest.write.store import store_spans
from pipeline.models import Conversation, LLMCall, Rollup
from pipeline.rollups.compact import rebuild_rollups
from tests.admin_forms import change_form
from tests.concurrency import Held, finish, needs_postgres, run_until_it_waits

pytestmark = [pytest.mark.django_db(transaction=True), needs_postgres]


def rollup_rows() -> list[tuple]:
    return sorted(Rollup.objects.values_list("kind", "grain", "bucket_start", "name", "calls", "errors", "latency",
                                             "sums"))


def test_an_llm_call_deleted_while_an_operator_saves_it_is_said_gone_and_stays_gone(client, alice):
    """Another operator deletes the call after this one's save has read it, and commits while the
    save waits on the conversation's lock: the save must not put the row back without its
    figures, nor fail with a 500."""
    now = time.time_ns()  # the rebuild compared with keeps the recent minutes
    asks = [{"role": "assistant", "parts": [{"type": "tool_call", "id": "call_1", "name": "lookup", "arguments": {}}]}]
    store_spans([SpanRecord("5cf92f3577b34da6a3ce929d0e0e4799", "0000000000000001", "chat gpt-4o", now - 10**9, now,
                            attributes={"gen_ai.operation.name": "chat", "gen_ai.conversation.id": "conv-race",
                                        "gen_ai.request.model": "gpt-4o", "gen_ai.usage.input_tokens": 1200,
                                        "gen_ai.usage.output_tokens": 30,
                                        "gen_ai.output.messages": json.dumps(asks)})])
    call = LLMCall.objects.get()
    client.force_login(alice)
    url, data = change_form(client, call, input_tokens=5000)

    deleting = Held(lambda: admin.site._registry[LLMCall].delete_model(None, LLMCall.objects.get(pk=call.pk)))
    responses = []
    saving = run_until_it_waits(lambda: responses.append(client.post(url, data)))
    assert not responses, "the save did not wait for the delete: the race this test is about did not happen"
    deleting.commit()
    finish(saving)

    response = responses[0]
    assert response.status_code == 302 and response.url == reverse("admin:index")
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        f"llm call with ID “{call.pk}” doesn’t exist. Perhaps it was deleted?"]
    assert not LLMCall.objects.exists()
    conversation = Conversation.objects.get()
    assert (conversation.llm_call_count, conversation.input_tokens) == (0, 0)
    incremental = rollup_rows()
    rebuild_rollups()
    assert rollup_rows() == incremental
