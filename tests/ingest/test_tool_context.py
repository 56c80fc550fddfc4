"""What a tool result costs the context: its tokens in every later LLM call that carried it, priced.

Conversations go in through the REST ingest API; the expected figures come from what ingest
stored of each carrying call (its input digest and token count), split by the digest's rule and
priced with the server's prices, so each test fails if a carry is missed, counted twice or
priced with the wrong call.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.urls import reverse

from pipeline.ingest.normalise.digest import message_tokens
from pipeline.ingest.write import deferred
from pipeline.insight.costs import cost_of_input
from pipeline.models import LLMCall, ToolCall, ToolResultCarry
from pipeline.models.apikeys import ApiKey, Scope
from tests.admin_forms import edit_in_the_admin
from tests.api_client import client_with

pytestmark = pytest.mark.django_db

URL = "/api/ingest/"
RESULT = "Top results: ctxlens dashboards, context windows explained, tool output levels. " * 4
QUESTION = {"role": "user", "content": "What is context debugging?"}
ASKS = {"role": "assistant", "tool_calls": [{"id": "call_ws", "name": "web_search", "arguments": {"q": "context"}}]}
ANSWER = {"role": "tool", "tool_call_id": "call_ws", "content": RESULT}


@pytest.fixture
def api():
    return client_with(ApiKey.generate("agent", scope=Scope.INGEST)[1])


@pytest.fixture
def reader(client, alice):
    client.force_login(alice)
    return client


def post(api, *events: dict) -> None:
    reply = api.post(URL, {"schema_version": "1.0", "events": list(events)}, format="json")
    assert reply.status_code == 200, reply.json()


def llm(call_id: str, second: int, messages: list[dict], *, tokens: int | None = 1000, model: str = "gpt-4o",
        round_id: str = "r1", output: list[dict] | None = None) -> dict:
    event = {"type": "llm_call", "conversation_id": "c1", "round_id": round_id, "call_id": call_id, "model": model,
             "provider": "openai", "started_at": f"2026-05-01T12:00:{second:02d}Z", "duration_ms": 500,
             "output_tokens": 10, "input_messages": messages,
             "output_messages": output or [{"role": "assistant", "content": f"thinking {call_id}"}]}
    if tokens is not None:
        event["input_tokens"] = tokens
    return event


def tool(second: int = 2, *, tool_call_id: str = "call_ws", round_id: str = "r1", **fields: object) -> dict:
    return {"type": "tool_call", "conversation_id": "c1", "round_id": round_id, "tool_name": "web_search",
            "tool_call_id": tool_call_id, "started_at": f"2026-05-01T12:00:{second:02d}Z", "duration_ms": 100,
            "observation": RESULT, "observation_tokens": 60, **fields}


def asking() -> dict:
    return llm("llm-0", 1, [QUESTION], tokens=40, output=[ASKS])


def carriers(n: int) -> list[dict]:
    """n LLM calls after the tool, each carrying its result, each input longer than the last."""
    history = [QUESTION, ASKS, ANSWER]
    events = []
    for i in range(n):
        history = [*history, {"role": "assistant", "content": f"step {i}: " + "reasoning " * (5 + i)}]
        events.append(llm(f"llm-{i + 1}", 3 + i, list(history), tokens=900 + 150 * i))
    return events


def share(call: LLMCall, tool_call_id: str = "call_ws") -> int:
    """The carried result's tokens in one stored call, by the digest's split of its input tokens."""
    tokens = message_tokens(call.input_digest, call.input_tokens)
    return sum(t for entry, t in zip(call.input_digest, tokens, strict=True) if tool_call_id in entry.get("answers", ()))


def expected(calls: list[LLMCall], tool_call_id: str = "call_ws") -> tuple[int, int, Decimal | None]:
    costs = [cost_of_input(c.model, c.provider, share(c, tool_call_id), c.started_at) for c in calls]
    priced = [c for c in costs if c is not None]
    return sum(share(c, tool_call_id) for c in calls), len(calls), sum(priced, Decimal(0)) if priced else None


def carrying_calls() -> list[LLMCall]:
    return [c for c in LLMCall.objects.order_by("started_at") if share(c)]


def figures(tool_call: ToolCall) -> tuple[int, int, Decimal | None]:
    tool_call.refresh_from_db()
    return tool_call.context_tokens, tool_call.context_carries, tool_call.context_cost_usd


def test_a_result_carried_by_three_later_calls_costs_its_share_of_each_of_their_inputs(api, reader):
    post(api, asking(), tool(), *carriers(3))

    calls = carrying_calls()
    assert [c.input_tokens for c in calls] == [900, 1050, 1200]
    tokens, carries, cost = figures(ToolCall.objects.get())
    assert (tokens, carries, cost) == expected(calls)
    assert carries == 3 and 0 < share(calls[0]) < 900 and cost > 0
    # gpt-4o's input price, $2.50 per million tokens, on each call's share
    assert cost == Decimal("2.5") * tokens / 1_000_000

    [stats] = reader.get("/api/tools/stats/").json()
    assert (stats["tool_name"], stats["context_tokens"], stats["avg_context_carries"]) == ("web_search", tokens, 3.0)
    assert stats["context_cost_usd"] == float(cost)


def test_re_sending_every_event_changes_nothing(api):
    events = [asking(), tool(), *carriers(2)]
    post(api, *events)
    first = figures(ToolCall.objects.get())
    ledger = list(ToolResultCarry.objects.order_by("pk").values_list("trace_id", "span_id", "tokens", "cost_usd"))

    post(api, *events)
    post(api, *reversed(events))

    assert figures(ToolCall.objects.get()) == first == expected(carrying_calls())
    assert list(ToolResultCarry.objects.order_by("pk").values_list("trace_id", "span_id", "tokens", "cost_usd")) == ledger
    assert len(ledger) == 2


def test_a_tool_call_that_arrives_after_its_carriers_gets_all_of_them(api):
    later = carriers(3)
    post(api, asking())
    post(api, later[2])  # the carrying calls first, in any order, each in a request of its own
    post(api, later[0])
    post(api, later[1])
    assert ToolResultCarry.objects.count() == 3

    post(api, tool())

    assert figures(ToolCall.objects.get()) == expected(carrying_calls())
    assert ToolCall.objects.get().context_carries == 3


def test_a_carrier_in_the_same_request_as_the_tool_is_counted_once(api):
    post(api, asking(), *carriers(1))
    post(api, tool(), *carriers(3)[1:])

    assert figures(ToolCall.objects.get()) == expected(carrying_calls())
    assert ToolCall.objects.get().context_carries == 3


def test_a_compression_that_drops_the_result_stops_the_count(api):
    kept = carriers(2)
    compressed = [{"role": "system", "content": "Summary: the user asked about context debugging."},
                  {"role": "user", "content": "Go on."}]
    post(api, asking(), tool(), *kept, {
        "type": "compression", "conversation_id": "c1", "round_id": "r1", "compression_id": "cmp-1",
        "timestamp": "2026-05-01T12:00:06Z", "strategy": "truncate", "tokens_before": 1200, "tokens_after": 300,
        "before_messages": kept[-1]["input_messages"], "after_messages": compressed, "dropped": [1, 2, 3, 4],
    }, llm("llm-after-1", 7, compressed, tokens=300), llm("llm-after-2", 8, compressed, tokens=320))

    calls = carrying_calls()
    assert [c.input_tokens for c in calls] == [900, 1050]  # the calls after the compression carry nothing
    assert figures(ToolCall.objects.get()) == expected(calls)
    assert ToolCall.objects.get().context_carries == 2


def test_a_result_carried_into_the_next_turn_counts_there_too(api):
    post(api, asking(), tool(), *carriers(1))
    history = [*carriers(1)[0]["input_messages"], {"role": "assistant", "content": "Done."},
               {"role": "user", "content": "And tool output levels?"}]
    post(api, llm("llm-r2", 10, history, tokens=1400, round_id="r2"))

    calls = carrying_calls()
    assert [c.round.key for c in calls] == ["r1", "r2"]
    assert figures(ToolCall.objects.get()) == expected(calls)


def test_a_carrier_deleted_in_the_admin_no_longer_counts_in_the_tool_calls_context_cost(api, reader):
    post(api, asking(), tool(), *carriers(3))
    calls = carrying_calls()
    tool_call = ToolCall.objects.get()
    assert figures(tool_call)[1] == 3

    response = reader.post(reverse("admin:pipeline_llmcall_delete", args=[calls[1].pk]), {"post": "yes"})

    assert response.status_code == 302
    assert figures(tool_call) == expected([calls[0], calls[2]])
    assert sorted(ToolResultCarry.objects.values_list("span_id", flat=True)) == sorted(
        [calls[0].span_id, calls[2].span_id])


def test_a_round_deleted_in_the_admin_takes_the_carries_of_its_calls_with_it(api, reader):
    post(api, asking(), tool(), *carriers(1))
    history = [*carriers(1)[0]["input_messages"], {"role": "assistant", "content": "Done."},
               {"role": "user", "content": "And tool output levels?"}]
    post(api, llm("llm-r2", 10, history, tokens=1400, round_id="r2"))
    first, later = carrying_calls()
    assert later.round.key == "r2" and figures(ToolCall.objects.get())[1] == 2

    response = reader.post(reverse("admin:pipeline_round_delete", args=[later.round_id]), {"post": "yes"})

    assert response.status_code == 302
    assert figures(ToolCall.objects.get()) == expected([first])
    assert list(ToolResultCarry.objects.values_list("span_id", flat=True)) == [first.span_id]


def test_calls_counted_after_the_response_are_priced_on_their_counted_tokens(api):
    post(api, asking(), tool(), *[{k: v for k, v in e.items() if k != "input_tokens"} for e in carriers(2)])
    estimated = figures(ToolCall.objects.get())
    # before the count: each message's size in bytes divided by four
    assert estimated[0] == 2 * (len(ANSWER["content"].encode()) // 4)

    deferred.complete_pending()

    calls = carrying_calls()
    assert all(c.input_tokens > 0 and not c.tokens_pending for c in calls)
    assert figures(ToolCall.objects.get()) == expected(calls)
    assert figures(ToolCall.objects.get())[0] != estimated[0]


def test_a_model_without_a_price_leaves_the_cost_null_and_a_priced_one_fills_it(api):
    unpriced = [{**e, "model": "acme-unknown-model"} for e in carriers(2)]
    post(api, asking(), tool(), *unpriced)
    tokens, carries, cost = figures(ToolCall.objects.get())
    assert (carries, cost) == (2, None) and tokens == expected(carrying_calls())[0]

    history = [*unpriced[-1]["input_messages"], {"role": "user", "content": "continue"}]
    post(api, llm("llm-priced", 9, history, tokens=1500))

    calls = carrying_calls()
    tokens, carries, cost = figures(ToolCall.objects.get())
    assert (tokens, carries, cost) == expected(calls)
    assert cost == cost_of_input("gpt-4o", "openai", share(calls[-1]), calls[-1].started_at)


def two_turns_asking_the_same_tool_call_id(api) -> tuple[ToolCall, ToolCall]:
    """Some frameworks number calls per turn ("call_0" again): two tool calls share an id, each
    carried by one later call of its turn."""
    post(api, asking(), tool(2), *carriers(1))
    again = [QUESTION, {"role": "user", "content": "Search again."}, ASKS, ANSWER]
    post(api, llm("llm-r2-0", 20, [QUESTION], tokens=40, round_id="r2", output=[ASKS]),
         tool(21, round_id="r2"), llm("llm-r2-1", 22, again, tokens=700, round_id="r2"))
    older, newer = ToolCall.objects.order_by("started_at")
    return older, newer


def test_two_tool_calls_sharing_an_id_each_get_the_calls_after_them(api):
    """A carry counts for the latest tool call with that id that started before the carrying call."""
    older, newer = two_turns_asking_the_same_tool_call_id(api)

    calls = carrying_calls()
    assert figures(older) == expected(calls[:1])
    assert figures(newer) == expected(calls[1:])


@pytest.mark.parametrize("deleted", ["tool_call", "round"])
def test_a_tool_call_left_sharing_an_id_with_a_deleted_one_owns_its_carries(api, reader, deleted):
    older, newer = two_turns_asking_the_same_tool_call_id(api)
    calls = carrying_calls()
    assert figures(older) == expected(calls[:1])
    target = (reverse("admin:pipeline_toolcall_delete", args=[newer.pk]) if deleted == "tool_call"
              else reverse("admin:pipeline_round_delete", args=[newer.round_id]))
    kept = calls if deleted == "tool_call" else calls[:1]  # the round takes its carrying call along

    response = reader.post(target, {"post": "yes"})

    assert response.status_code == 302
    assert list(ToolCall.objects.all()) == [older]
    assert figures(older) == expected(kept)


def test_a_carrier_whose_input_tokens_are_edited_in_the_admin_counts_its_new_share(api, reader):
    post(api, asking(), tool(), *carriers(2))
    edited = carrying_calls()[1]

    edit_in_the_admin(reader, edited, input_tokens=3000)

    calls = carrying_calls()
    assert calls[1].input_tokens == 3000
    assert figures(ToolCall.objects.get()) == expected(calls)


def test_the_admin_cannot_move_a_carrier_to_another_span(api, reader):
    post(api, asking(), tool(), *carriers(2))
    edited = carrying_calls()[1]

    edit_in_the_admin(reader, edited, span_id="ffffffffffffffff", input_tokens=3000)

    calls = carrying_calls()
    assert (calls[1].span_id, calls[1].input_tokens) == (edited.span_id, 3000)
    assert ToolResultCarry.objects.count() == 2  # one row per carrying call, none left behind
    assert figures(ToolCall.objects.get()) == expected(calls)


def test_a_tool_call_given_another_id_in_the_admin_leaves_its_carries_to_the_one_still_sharing_it(api, reader):
    older, newer = two_turns_asking_the_same_tool_call_id(api)
    calls = carrying_calls()
    assert figures(newer) == expected(calls[1:])

    edit_in_the_admin(reader, newer, tool_call_id="call_other")

    assert figures(older) == expected(calls)
    assert figures(newer) == (0, 0, None)


@pytest.mark.django_db(transaction=True)
def test_the_migration_fills_the_rows_stored_before_it_as_ingest_does(api):
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    from tests.otlp_support import wait_for_deferred_tokens

    first_turn = carriers(2)
    post(api, asking(), tool(2), *first_turn, {**tool(9), "call_id": "full", "tool_call_id": "call_full",
                                               "output_level": "full"})
    post(api, llm("llm-r2-0", 20, [QUESTION], tokens=40, round_id="r2", output=[ASKS]), tool(21, round_id="r2"),
         llm("llm-r2-1", 22, [QUESTION, ASKS, ANSWER], tokens=700, round_id="r2"))
    wait_for_deferred_tokens()  # the levels counted on the server's own thread, before the schema changes
    ingested = list(ToolCall.objects.order_by("pk").values_list("context_tokens", "context_carries", "context_cost_usd"))
    assert [carries for _, carries, _ in ingested] == [2, 0, 1]

    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    executor.migrate([("pipeline", "0010_findings")])  # as stored by a ctxlens without the ledger
    MigrationExecutor(connection).migrate(latest)

    assert list(ToolCall.objects.order_by("pk").values_list(
        "context_tokens", "context_carries", "context_cost_usd")) == ingested
    assert list(ToolCall.objects.order_by("pk").values_list("tool_call_id", "levels_pending")) == [
        ("call_ws", False), ("call_full", True), ("call_ws", False)]
