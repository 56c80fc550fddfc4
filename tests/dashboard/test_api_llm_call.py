"""GET /api/llm-calls/<id>/: one LLM call and the diff of its input against the previous call's,
on conversations sent through the REST ingest API (tests/call_diff_cases.py)."""

from __future__ import annotations

import pytest
from genai_prices import Usage, calc_price
from rest_framework.test import APIClient

from pipeline.models import ApiKey
from pipeline.models.apikeys import Scope
from tests import call_diff_cases as cases
from tests.api_client import client_with

pytestmark = pytest.mark.django_db


@pytest.fixture
def ingest() -> APIClient:
    return cases.ingest_api()


@pytest.fixture
def api(alice) -> APIClient:
    """A logged-in browser session, as the dashboard's pages call the API."""
    client = APIClient()
    client.force_login(alice)
    return client


def diff_of(api: APIClient, call_id: int) -> dict:
    reply = api.get(f"/api/llm-calls/{call_id}/")
    assert reply.status_code == 200, reply.content
    return reply.json()["diff"]


def item(index: int, role: str, category: str, tokens: int) -> dict:
    return {"index": index, "role": role, "category": category, "tokens": tokens}


def test_it_returns_the_call(api, ingest):
    case = cases.append_only(ingest)
    call = case.calls[1]

    body = api.get(f"/api/llm-calls/{call.pk}/").json()

    assert {key: body[key] for key in (
        "id", "conversation", "round", "trace_id", "span_id", "model", "provider", "started_at", "duration_ms",
        "status", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens",
        "context_window", "context_tokens",
    )} == {
        "id": call.pk, "conversation": case.conversation.pk, "round": call.round_id, "trace_id": call.trace_id,
        "span_id": call.span_id, "model": "gpt-4o", "provider": "openai", "started_at": "2026-05-01T12:00:03Z",
        "duration_ms": 500.0, "status": "ok", "input_tokens": 328, "output_tokens": 10, "cache_read_tokens": 100,
        "cache_write_tokens": 0, "reasoning_tokens": 0, "context_window": 128_000, "context_tokens": 328,
    }
    assert body["context_composition"] == {"system": 100, "skills": 0, "user": 20, "assistant": 8,
                                           "tool_observations": 200, "compressed_summaries": 0, "free": 127_672}
    assert [m["role"] for m in body["input_messages"]] == ["system", "user", "assistant", "tool"]
    assert body["input_messages"][3]["parts"] == [
        {"type": "tool_call_response", "id": "call_1", "response": cases.RESULT_OSLO["content"]}]
    assert body["output_messages"][0]["parts"][0]["name"] == "get_weather"
    # gpt-4o: 228 uncached input tokens at $2.50/M, 100 cache-read at $1.25/M, 10 output at $10/M.
    assert body["cost_usd"] == float(calc_price(
        Usage(input_tokens=328, cache_read_tokens=100, output_tokens=10), "gpt-4o", provider_id="openai",
        genai_request_timestamp=call.started_at).total_price) == 0.000795


def test_the_first_call_of_a_conversation_adds_all_it_sends(api, ingest):
    case = cases.append_only(ingest)

    assert diff_of(api, case.calls[0].pk) == {
        "previous_call_id": None, "kept_prefix_messages": 0, "kept_prefix_tokens": 0,
        "added": [item(0, "system", "system", 100), item(1, "user", "user", 20)],
        "removed": [], "changed": [], "token_delta": 120, "token_delta_by_category": {"system": 100, "user": 20},
        "cache_break": False, "cache_break_reason": None, "uncacheable_tokens": 0,
    }


def test_an_append_only_call_keeps_the_whole_previous_input(api, ingest):
    case = cases.append_only(ingest)

    assert diff_of(api, case.calls[1].pk) == {
        "previous_call_id": case.calls[0].pk, "kept_prefix_messages": 2, "kept_prefix_tokens": 120,
        "added": [item(2, "assistant", "assistant", 8), item(3, "tool", "tool_observations", 200)],
        "removed": [], "changed": [], "token_delta": 208,
        "token_delta_by_category": {"assistant": 8, "tool_observations": 200},
        "cache_break": False, "cache_break_reason": None, "uncacheable_tokens": 0,
    }
    assert diff_of(api, case.calls[2].pk) == {
        "previous_call_id": case.calls[1].pk, "kept_prefix_messages": 4, "kept_prefix_tokens": 328,
        "added": [item(4, "assistant", "assistant", 8), item(5, "tool", "tool_observations", 100)],
        "removed": [], "changed": [], "token_delta": 108,
        "token_delta_by_category": {"assistant": 8, "tool_observations": 100},
        "cache_break": False, "cache_break_reason": None, "uncacheable_tokens": 0,
    }


def test_an_edit_in_the_middle_is_a_cache_break_of_reason_edit(api, ingest):
    case = cases.edit_in_the_middle(ingest)

    assert diff_of(api, case.calls[1].pk) == {
        "previous_call_id": case.calls[0].pk, "kept_prefix_messages": 3, "kept_prefix_tokens": 128,
        "added": [item(6, "assistant", "assistant", 10)],
        "removed": [],
        "changed": [{**item(3, "tool", "tool_observations", 10), "previous_index": 3, "previous_tokens": 200}],
        "token_delta": 256 - 436, "token_delta_by_category": {"assistant": 10, "tool_observations": -190},
        "cache_break": True, "cache_break_reason": "edit",
        "uncacheable_tokens": 108,  # the second call and its result: kept, but past the break
    }


def test_a_recorded_compression_is_the_reason_of_its_cache_break(api, ingest):
    case = cases.compression(ingest)

    assert diff_of(api, case.calls[1].pk) == {
        "previous_call_id": case.calls[0].pk, "kept_prefix_messages": 1, "kept_prefix_tokens": 100,
        "added": [item(4, "user", "user", 20)],
        "removed": [item(2, "assistant", "assistant", 8), item(3, "tool", "tool_observations", 200)],
        "changed": [{**item(1, "user", "user", 20), "previous_index": 1, "previous_tokens": 20}],
        "token_delta": 248 - 436, "token_delta_by_category": {"assistant": -8, "tool_observations": -200, "user": 20},
        "cache_break": True, "cache_break_reason": "compression", "uncacheable_tokens": 108,
    }


def test_a_system_prompt_change_keeps_no_prefix(api, ingest):
    case = cases.system_prompt_change(ingest)

    assert diff_of(api, case.calls[1].pk) == {
        "previous_call_id": case.calls[0].pk, "kept_prefix_messages": 0, "kept_prefix_tokens": 0,
        "added": [item(2, "assistant", "assistant", 10), item(3, "user", "user", 20)],
        "removed": [],
        "changed": [{**item(0, "system", "system", 100), "previous_index": 0, "previous_tokens": 100}],
        "token_delta": 30, "token_delta_by_category": {"assistant": 10, "user": 20},
        "cache_break": True, "cache_break_reason": "edit", "uncacheable_tokens": 20,
    }


def test_a_read_key_may_read_a_call_and_an_ingest_key_may_not(db, ingest):
    case = cases.append_only(ingest)
    url = f"/api/llm-calls/{case.calls[0].pk}/"

    assert client_with(ApiKey.generate("reader", scope=Scope.READ)[1]).get(url).status_code == 200
    refused = client_with(ApiKey.generate("agent", scope=Scope.INGEST)[1]).get(url)
    assert refused.status_code == 403
    assert client_with().get(url).json() == {"detail": "Authentication credentials were not provided."}


@pytest.mark.parametrize("call_id", ["999999", "abc", "99999999999999999999999999", "-1"])
def test_an_unknown_call_is_a_json_404(api, ingest, call_id):
    cases.append_only(ingest)

    reply = api.get(f"/api/llm-calls/{call_id}/")

    assert reply.status_code == 404
    assert reply["Content-Type"] == "application/json"
    assert reply.json() == {"detail": f"No LLM call with id {call_id!r}."}


def test_there_is_no_list_of_calls(api):
    reply = api.get("/api/llm-calls/")

    assert reply.status_code == 404
    assert reply.json() == {"detail": "No such API endpoint; see /api/schema/."}
