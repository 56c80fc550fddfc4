"""POST /api/ingest/: REST JSON events stored through the one normaliser, whole or not at all."""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor
import json
from datetime import UTC, datetime

import httpx
import pytest
from rest_framework.test import APIClient

from pipeline.receivers.rest_schema import INGEST_EXAMPLE
from pipeline.models import (
    ApiKey,
    CompressionEvent,
    Conversation,
    LLMCall,
    Round,
    SkillActivation,
    Span,
    Status,
    ToolCall,
)
from pipeline.models.apikeys import Scope
from tests.api_client import client_with

URL = "/api/ingest/"
MODELS = (Conversation, Round, LLMCall, ToolCall, CompressionEvent, SkillActivation, Span)


def row_counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in MODELS}



@pytest.fixture
def ingest_key(db) -> str:
    return ApiKey.generate("agent", scope=Scope.INGEST)[1]


@pytest.fixture
def api(ingest_key) -> APIClient:
    return client_with(ingest_key)


def payload(*events: dict) -> dict:
    return {"schema_version": "1.0", "events": list(events)}


def turn_events(conversation: str = "c1", round_id: str = "r1") -> list[dict]:
    base = {"conversation_id": conversation, "round_id": round_id}
    return [
        {**base, "type": "round_start", "timestamp": "2026-05-01T12:00:00Z", "user_message": "What is 6 x 7?"},
        {**base, "type": "llm_call", "call_id": "llm-1", "model": "gpt-4o", "provider": "openai",
         "started_at": "2026-05-01T12:00:00.100Z", "ended_at": "2026-05-01T12:00:00.900Z",
         "input_tokens": 120, "output_tokens": 15, "cache_read_tokens": 100, "context_window": 128000,
         "context_composition": {"system": 20, "user": 100},
         "input_messages": [{"role": "user", "content": "What is 6 x 7?"}],
         "output_messages": [{"role": "assistant", "tool_calls": [
             {"id": "call_1", "name": "calculator", "arguments": {"expression": "6*7"}}]}]},
        {**base, "type": "tool_call", "tool_name": "calculator", "tool_call_id": "call_1",
         "arguments": {"expression": "6*7"}, "observation": "42", "started_at": "2026-05-01T12:00:01Z",
         "duration_ms": 12.5, "output_level": "brief", "retry_count": 1, "observation_tokens": 1,
         "cache_hit": True},
        {**base, "type": "llm_call", "call_id": "llm-2", "model": "gpt-4o", "started_at": "2026-05-01T12:00:01.100Z",
         "duration_ms": 400, "input_tokens": 140, "output_tokens": 8,
         "output_messages": [{"role": "assistant", "content": "6 x 7 = 42", "finish_reason": "stop"}]},
        {**base, "type": "round_end", "timestamp": "2026-05-01T12:00:02Z", "final_answer": "6 x 7 = 42"},
    ]


def test_it_stores_a_turn_with_its_llm_and_tool_calls(api):
    reply = api.post(URL, payload(
        {"type": "conversation", "conversation_id": "c1", "agent_name": "math-bot", "user_id": "u-1",
         "service_name": "calc-service"},
        *turn_events(),
    ), format="json")

    assert reply.status_code == 200, reply.json()
    body = reply.json()
    assert body["events"] == 6 and body["spans"] == 4 and body["stored"] == 4 and body["duplicates"] == 0
    conversation = Conversation.objects.get(external_id="c1")
    assert body["conversation_ids"] == [conversation.id]
    assert (conversation.agent_name, conversation.user_id, conversation.service_name) == (
        "math-bot", "u-1", "calc-service")
    round_ = Round.objects.get(conversation=conversation)
    assert round_.key == "r1"
    assert round_.status == Status.OK
    assert round_.user_message == "What is 6 x 7?"
    assert round_.final_answer == "6 x 7 = 42"
    assert round_.started_at == datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
    assert round_.duration_ms == pytest.approx(2000)
    first, second = LLMCall.objects.filter(round=round_).order_by("started_at")
    assert (first.model, first.provider, first.input_tokens, first.output_tokens, first.cache_read_tokens) == (
        "gpt-4o", "openai", 120, 15, 100)
    assert first.duration_ms == pytest.approx(800)
    assert first.context_window == 128000
    assert first.context_composition["user"] == 100
    assert first.input_messages == [{"role": "user", "parts": [{"type": "text", "content": "What is 6 x 7?"}]}]
    assert second.duration_ms == pytest.approx(400)
    assert second.finish_reason == "stop"
    tool = ToolCall.objects.get(round=round_)
    assert (tool.tool_name, tool.tool_call_id, tool.arguments, tool.observation) == (
        "calculator", "call_1", {"expression": "6*7"}, "42")
    assert (tool.output_level, tool.retry_count, tool.observation_tokens, tool.success) == ("brief", 1, 1, True)
    assert tool.cache_hit
    assert tool.duration_ms == pytest.approx(12.5)
    assert tool.llm_call_id == first.id
    assert set(Span.objects.values_list("source", flat=True)) == {"rest"}


def test_a_re_sent_request_changes_nothing(api):
    body = payload(*turn_events())
    assert api.post(URL, body, format="json").status_code == 200
    before = row_counts()

    again = api.post(URL, body, format="json")

    assert again.status_code == 200
    assert again.json()["stored"] == 0
    assert again.json()["duplicates"] == 4
    assert row_counts() == before


def test_a_repeated_event_in_one_request_is_stored_once(api):
    events = turn_events()
    reply = api.post(URL, payload(*events, events[2]), format="json")

    assert reply.status_code == 200
    assert ToolCall.objects.count() == 1
    assert reply.json()["duplicates"] == 1


def test_a_round_start_shows_a_running_turn_that_round_end_completes(api):
    start, *calls, end = turn_events()
    start["agent_name"] = "math-bot"
    assert api.post(URL, payload(start, calls[0]), format="json").status_code == 200

    round_ = Round.objects.get(key="r1")
    assert round_.status == Status.RUNNING
    assert round_.duration_ms is None
    assert Conversation.objects.get(external_id="c1").status == Status.RUNNING

    # The end comes later, without repeating the start time or the user message.
    assert api.post(URL, payload(*calls[1:], end), format="json").status_code == 200

    round_.refresh_from_db()
    assert round_.status == Status.OK
    assert round_.started_at == datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
    assert round_.ended_at == datetime(2026, 5, 1, 12, 0, 2, tzinfo=UTC)
    assert round_.duration_ms == pytest.approx(2000)
    assert round_.user_message == "What is 6 x 7?"
    assert round_.final_answer == "6 x 7 = 42"
    assert (round_.llm_call_count, round_.tool_call_count) == (2, 1)
    turn_span = Span.objects.get(kind="agent")
    assert turn_span.start_time == datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
    assert turn_span.attributes["ctxlens.round.user_message"] == "What is 6 x 7?"
    assert turn_span.name == "invoke_agent math-bot"
    assert Conversation.objects.get(external_id="c1").status == Status.OK

    # A late re-send of the start does not reopen the finished turn.
    assert api.post(URL, payload(start), format="json").json()["stored"] == 0
    round_.refresh_from_db()
    assert round_.status == Status.OK


def test_a_round_end_before_its_round_start_is_completed_by_it(api):
    """The start arriving second still gives the turn its user message, start time and name."""
    start, *calls, end = turn_events()
    start["agent_name"] = "math-bot"
    assert api.post(URL, payload(*calls, end), format="json").status_code == 200
    assert Round.objects.get(key="r1").started_at == datetime(2026, 5, 1, 12, 0, 0, 100000, tzinfo=UTC)

    assert api.post(URL, payload(start), format="json").json()["stored"] == 1

    round_ = Round.objects.get(key="r1")
    assert (round_.status, round_.user_message, round_.final_answer) == (Status.OK, "What is 6 x 7?", "6 x 7 = 42")
    assert (round_.started_at, round_.duration_ms) == (datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC), pytest.approx(2000))
    assert (round_.llm_call_count, round_.tool_call_count) == (2, 1)
    turn_span = Span.objects.get(kind="agent")
    assert turn_span.name == "invoke_agent math-bot"
    assert turn_span.attributes["ctxlens.round.user_message"] == "What is 6 x 7?"
    assert turn_span.attributes["ctxlens.round.final_answer"] == "6 x 7 = 42"
    assert Conversation.objects.get(external_id="c1").title == "What is 6 x 7?"

    # re-sending either half, or both, changes nothing
    counts = row_counts()
    for events in ([start], [end], [start, *calls, end]):
        assert api.post(URL, payload(*events), format="json").json()["stored"] == 0
    assert row_counts() == counts
    assert Round.objects.get(key="r1").started_at == round_.started_at


def test_a_failed_turn_is_stored_as_an_error(api):
    start = turn_events()[0]
    end = {"type": "round_end", "conversation_id": "c1", "round_id": "r1", "timestamp": "2026-05-01T12:00:05Z",
           "status": "error", "error_type": "timeout", "error_message": "the agent gave up"}

    assert api.post(URL, payload(start, end), format="json").status_code == 200

    round_ = Round.objects.get(key="r1")
    assert round_.status == Status.ERROR
    assert round_.duration_ms == pytest.approx(5000)


def test_a_round_end_alone_takes_its_start_from_its_earliest_event(api):
    *_, tool, _, end = turn_events()
    assert api.post(URL, payload(end, tool), format="json").status_code == 200

    round_ = Round.objects.get(key="r1")
    assert round_.status == Status.OK
    assert round_.started_at == datetime(2026, 5, 1, 12, 0, 1, tzinfo=UTC)


def test_text_arguments_and_structured_observations_keep_their_shape(api):
    event = {"type": "tool_call", "conversation_id": "c1", "round_id": "r1", "call_id": "t1", "tool_name": "shell",
             "arguments": "ls -la", "observation": {"files": ["a.txt"], "count": 1},
             "started_at": "2026-05-01T12:00:00Z", "duration_ms": 3}

    assert api.post(URL, payload(event), format="json").status_code == 200

    tool = ToolCall.objects.get()
    assert tool.arguments == "ls -la"
    assert json.loads(tool.observation) == {"files": ["a.txt"], "count": 1}


def test_a_tool_call_naming_an_artifact_is_linked_to_it(api, artifact_dir):
    from pipeline.artifacts.store import store_artifact

    artifact = store_artifact("a,b\n1,2\n" * 1000, summary="sales.csv")
    events = turn_events()
    events[2]["artifact_id"] = artifact.artifact_id

    assert api.post(URL, payload(*events), format="json").status_code == 200

    tool = ToolCall.objects.get()
    artifact.refresh_from_db()
    assert (tool.artifact, artifact.conversation) == (artifact, tool.conversation)


def test_a_tool_call_keeps_its_argument_tokens(api):
    event = {"type": "tool_call", "conversation_id": "c1", "round_id": "r1", "call_id": "t1", "tool_name": "fetch",
             "started_at": "2026-05-01T12:00:00Z", "duration_ms": 30, "input_tokens": 14, "observation_tokens": 90}

    assert api.post(URL, payload(event), format="json").status_code == 200

    assert ToolCall.objects.values_list("input_tokens", "observation_tokens").get() == (14, 90)


def test_a_failed_tool_call_with_an_earlier_error_type_name_is_stored_under_the_documents_name(api):
    event = {"type": "tool_call", "conversation_id": "c1", "round_id": "r1", "call_id": "t1", "tool_name": "fetch",
             "started_at": "2026-05-01T12:00:00Z", "duration_ms": 30, "status": "error",
             "error_type": "resource_unavailable", "error_message": "pool exhausted"}

    assert api.post(URL, payload(event), format="json").status_code == 200

    assert ToolCall.objects.get().error_type == "resource_error"


def test_a_failed_tool_call_keeps_its_error(api):
    event = {"type": "tool_call", "conversation_id": "c1", "round_id": "r1", "call_id": "t1", "tool_name": "fetch",
             "started_at": "2026-05-01T12:00:00Z", "duration_ms": 3000, "status": "error",
             "error_type": "timeout", "error_code": "E_TIMEOUT", "error_message": "no answer in 3 s"}

    assert api.post(URL, payload(event), format="json").status_code == 200

    tool = ToolCall.objects.get()
    assert tool.success is False
    assert (tool.error_type, tool.error_code, tool.error_message) == ("timeout", "E_TIMEOUT", "no answer in 3 s")
    assert tool.tool_call_id == ""


def test_compressions_and_skill_activations_are_stored(api):
    before = [{"role": "system", "content": "rules"}, {"role": "user", "content": "old question"},
              {"role": "tool", "tool_call_id": "call_0", "content": "big output"}]
    after = [{"role": "system", "content": "rules"}, {"role": "user", "content": "summary: asked before"}]
    events = [
        {"type": "compression", "conversation_id": "c1", "round_id": "r1", "compression_id": "cmp-1",
         "timestamp": "2026-05-01T12:00:00Z", "strategy": "summarize", "tokens_before": 9000, "tokens_after": 2000,
         "context_window": 10000, "tokens_before_by_category": {"system": 500, "tool_observations": 8500},
         "tokens_after_by_category": {"system": 500, "compressed_summaries": 1500},
         "before_messages": before, "after_messages": after, "dropped": [2], "summarised": [1],
         "summary": "asked before", "estimated_costs": {"truncate": 0, "extract": 0.009, "summarize": 0.027},
         "selection": "auto: 62 messages ≥ 50"},
        {"type": "skill_activation", "conversation_id": "c1", "round_id": "r1", "activation_id": "s-1",
         "timestamp": "2026-05-01T12:00:01Z", "skill_name": "pdf", "level": 3, "chain": ["docs", "pdf"],
         "context_modifier": {"allowed_tools": ["read_pdf"]}, "tokens": 300,
         "resources": ["references/forms.md"], "messages": [
             {"kind": "metadata", "content": "pdf is loading"},
             {"kind": "instruction", "visibility": "hidden", "resource": "references/forms.md", "tokens": 290,
              "content": "<b>forms</b>"}]},
    ]

    assert api.post(URL, payload(*events), format="json").status_code == 200

    compression = CompressionEvent.objects.get()
    assert (compression.strategy, compression.tokens_before, compression.tokens_after) == ("summarize", 9000, 2000)
    assert (compression.messages_before, compression.messages_after) == (3, 2)
    assert compression.tokens_after_by_category == {"system": 500, "compressed_summaries": 1500}
    assert (compression.dropped, compression.summarised, compression.summary) == ([2], [1], "asked before")
    assert compression.estimated_costs == {"truncate": 0.0, "extract": 0.009, "summarize": 0.027}
    assert compression.selection == "auto: 62 messages ≥ 50"
    assert compression.before_messages[2] == {
        "role": "tool", "parts": [{"type": "tool_call_response", "id": "call_0", "response": "big output"}]}
    skill = SkillActivation.objects.get()
    assert (skill.skill_name, skill.load_level, skill.chain, skill.depth, skill.tokens) == (
        "pdf", 3, ["docs", "pdf"], 2, 300)
    assert skill.context_modifier == {"allowed_tools": ["read_pdf"]}
    assert skill.resources == ["references/forms.md"]
    assert skill.messages == [
        {"kind": "metadata", "visibility": "visible", "resource": None, "tokens": None, "content": "pdf is loading"},
        {"kind": "instruction", "visibility": "hidden", "resource": "references/forms.md", "tokens": 290,
         "content": "<b>forms</b>"}]
    assert compression.round_id == skill.round_id == Round.objects.get(key="r1").id


def test_a_conversation_event_alone_creates_the_conversation_without_a_turn(api):
    event = {"type": "conversation", "conversation_id": "fresh", "agent_name": "planner",
             "started_at": "2026-05-01T09:00:00Z"}

    assert api.post(URL, payload(event), format="json").status_code == 200

    conversation = Conversation.objects.get(external_id="fresh")
    assert conversation.agent_name == "planner"
    assert conversation.started_at == datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
    assert not Round.objects.exists() and conversation.round_count == 0

    assert api.post(URL, payload(*turn_events("fresh")), format="json").status_code == 200
    conversation.refresh_from_db()
    assert list(Round.objects.values_list("key", flat=True)) == ["r1"]
    assert (conversation.round_count, conversation.llm_call_count, conversation.status) == (1, 2, Status.OK)


def test_a_late_conversation_event_describes_the_conversation_and_leaves_its_turns_alone(api):
    start = turn_events()[0]
    end = {"type": "round_end", "conversation_id": "c1", "round_id": "r1", "timestamp": "2026-05-01T12:00:05Z",
           "status": "error", "error_type": "timeout"}
    assert api.post(URL, payload(start, end), format="json").status_code == 200
    before = Conversation.objects.get(external_id="c1")

    late = {"type": "conversation", "conversation_id": "c1", "agent_name": "math-bot", "user_id": "u-1"}
    assert api.post(URL, payload(late), format="json").status_code == 200

    conversation = Conversation.objects.get(external_id="c1")
    assert (conversation.agent_name, conversation.user_id) == ("math-bot", "u-1")
    assert Round.objects.count() == 1 and conversation.round_count == 1
    assert conversation.status == Status.ERROR  # still what its only turn says
    assert conversation.last_activity_at == before.last_activity_at  # metadata is not activity


@pytest.mark.parametrize("title_first", [True, False])
def test_a_conversation_title_wins_over_the_first_user_message(api, title_first):
    titled = {"type": "conversation", "conversation_id": "c1", "title": "Multiplication drill"}
    requests = [payload(titled), payload(*turn_events())]
    for body in requests if title_first else reversed(requests):
        assert api.post(URL, body, format="json").status_code == 200

    assert Conversation.objects.get(external_id="c1").title == "Multiplication drill"
    # Sent with the turn it is kept too, and a later, earlier-starting turn does not retitle it.
    assert api.post(URL, payload({**titled, "conversation_id": "c2"}, *turn_events("c2")), format="json").status_code == 200
    early = [{**e, "round_id": "r0"} for e in turn_events("c2")[:1]]
    early[0].update(timestamp="2026-05-01T11:00:00Z", user_message="Warm-up question")
    assert api.post(URL, payload(*early), format="json").status_code == 200
    assert Conversation.objects.get(external_id="c2").title == "Multiplication drill"


def test_without_a_title_the_earliest_user_message_names_the_conversation(api):
    assert api.post(URL, payload(*turn_events()), format="json").status_code == 200
    assert Conversation.objects.get().title == "What is 6 x 7?"
    early = turn_events(round_id="r0")[0]
    early.update(timestamp="2026-05-01T11:00:00Z", user_message="Warm-up question\nsecond line")
    assert api.post(URL, payload(early), format="json").status_code == 200
    assert Conversation.objects.get().title == "Warm-up question"


def test_events_without_a_round_id_share_one_implicit_turn(api):
    calls = [
        {"type": "tool_call", "conversation_id": "c9", "call_id": f"t{i}", "tool_name": "ls",
         "started_at": f"2026-05-01T12:00:0{i}Z", "duration_ms": 5}
        for i in range(3)
    ]

    assert api.post(URL, payload(*calls), format="json").status_code == 200

    assert Round.objects.filter(conversation__external_id="c9").count() == 1
    assert ToolCall.objects.filter(round__conversation__external_id="c9").count() == 3


def test_the_same_client_ids_in_two_conversations_do_not_collide(api):
    assert api.post(URL, payload(*turn_events("a"), *turn_events("b")), format="json").status_code == 200

    assert Round.objects.filter(key="r1").count() == 2
    assert ToolCall.objects.values("trace_id", "span_id").distinct().count() == 2


# --- bad input: a clear 4xx and nothing stored --------------------------------------------


def test_an_unknown_major_schema_version_is_refused(api):
    reply = api.post(URL, {"schema_version": "2.0", "events": turn_events()}, format="json")

    assert reply.status_code == 400
    assert "accepts 1.x" in reply.json()["schema_version"][0]
    assert set(row_counts().values()) == {0}


def test_a_newer_minor_schema_version_is_accepted(api):
    assert api.post(URL, {"schema_version": "1.7", "events": turn_events()}, format="json").status_code == 200
    assert (ToolCall.objects.count(), LLMCall.objects.count()) == (1, 2)


def test_one_invalid_event_stores_nothing_and_names_the_field(api):
    events = turn_events()
    del events[2]["tool_name"]
    events[3]["input_tokens"] = -5

    reply = api.post(URL, payload(*events), format="json")

    assert reply.status_code == 400
    errors = reply.json()["events"]
    assert errors["2"] == {"tool_name": ["This field is required."]}
    assert errors["3"] == {"input_tokens": ["Ensure this value is greater than or equal to 0."]}
    assert set(row_counts().values()) == {0}


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"type": "telepathy"}, "type", "Unknown event type"),
        ({"started_at": "yesterday"}, "started_at", "Datetime has wrong format"),
        ({"duration_ms": None}, "ended_at", "Give ended_at or duration_ms."),
        ({"ended_at": "2026-05-01T11:00:00Z"}, "ended_at", "before started_at"),
        ({"output_level": "verbose"}, "output_level", "is not a valid choice"),
        ({"tool_call_id": None}, "call_id", "Give call_id or tool_call_id."),
        ({"conversation_id": "x" * 256}, "conversation_id", "no more than 255"),
    ],
)
def test_it_explains_a_bad_tool_call_event(api, change, field, message):
    event = copy.deepcopy(turn_events()[2])
    event.update(change)
    event = {k: v for k, v in event.items() if v is not None}

    reply = api.post(URL, payload(event), format="json")

    assert reply.status_code == 400
    assert message in " ".join(reply.json()["events"]["0"][field])
    assert set(row_counts().values()) == {0}


def test_a_time_before_1970_is_refused_as_such(api):
    events = turn_events()
    events[3]["started_at"] = "1969-12-31T23:59:59Z"

    reply = api.post(URL, payload(*events), format="json")

    assert reply.status_code == 400
    assert "before 1970" in json.dumps(reply.json())
    assert set(row_counts().values()) == {0}


def test_context_categories_are_checked(api):
    events = turn_events()
    events[1]["context_composition"] = {"system": 1, "vibes": 2}

    reply = api.post(URL, payload(*events), format="json")

    assert reply.status_code == 400
    assert "Unknown categories vibes" in reply.json()["events"]["1"]["context_composition"][0]
    assert set(row_counts().values()) == {0}


def test_compression_indexes_must_point_into_the_messages(api):
    event = {"type": "compression", "conversation_id": "c1", "compression_id": "x", "timestamp": "2026-05-01T12:00Z",
             "strategy": "truncate", "tokens_before": 10, "tokens_after": 5,
             "before_messages": [{"role": "user", "content": "hi"}], "dropped": [0, 4]}

    reply = api.post(URL, payload(event), format="json")

    assert reply.status_code == 400
    assert "[4]" in reply.json()["events"]["0"]["dropped"][0]
    assert set(row_counts().values()) == {0}


@pytest.mark.parametrize("costs", [{"compact": 0.1}, {"extract": -1}, {"extract": "cheap"}])
def test_estimated_costs_must_name_a_strategy_and_a_non_negative_amount(api, costs):
    event = {"type": "compression", "conversation_id": "c1", "compression_id": "x", "timestamp": "2026-05-01T12:00Z",
             "strategy": "truncate", "tokens_before": 10, "tokens_after": 5, "estimated_costs": costs}

    reply = api.post(URL, payload(event), format="json")

    assert reply.status_code == 400 and "estimated_costs" in reply.json()["events"]["0"]
    assert set(row_counts().values()) == {0}


@pytest.mark.parametrize(("event", "field", "value"), [
    (0, "context_composition", {"user": 10**400}), (0, "input_tokens", 2**31), (1, "tokens_before", 2**40),
    (1, "tokens_before_by_category", {"system": 10**400}), (1, "estimated_costs", {"truncate": 10**400}),
])
def test_a_count_past_what_a_column_holds_is_refused_by_name(api, event, field, value):
    """As over OTLP such counts are kept within 0..MAX_COUNT; over REST the client is told."""
    base = {"conversation_id": "c1", "round_id": "r1"}
    events = [{**base, "type": "llm_call", "call_id": "l1", "model": "gpt-4o", "started_at": "2026-05-01T12:00Z",
               "duration_ms": 5, "input_tokens": 10, "output_tokens": 1},
              {**base, "type": "compression", "compression_id": "x", "timestamp": "2026-05-01T12:00Z",
               "strategy": "truncate", "tokens_before": 10, "tokens_after": 5}]
    events[event][field] = value

    reply = api.post(URL, payload(*events), format="json")

    assert reply.status_code == 400 and field in reply.json()["events"][str(event)]
    assert set(row_counts().values()) == {0}


def test_malformed_json_is_a_400(api):
    reply = api.post(URL, b'{"schema_version": "1.0", "events": [', content_type="application/json")

    assert reply.status_code == 400
    assert "JSON parse error" in reply.json()["detail"]


def test_a_body_that_is_not_json_is_a_415(api):
    reply = api.post(URL, b"schema_version=1.0", content_type="application/x-www-form-urlencoded")

    assert reply.status_code == 415
    assert "Unsupported media type" in reply.json()["detail"]


def test_a_gzipped_body_is_refused_with_415(api):
    reply = api.post(URL, b"\x1f\x8b", content_type="application/json", HTTP_CONTENT_ENCODING="gzip")

    assert reply.status_code == 415
    assert "gzip" in reply.json()["detail"]


def test_a_body_over_the_limit_is_a_413(api, settings):
    settings.CTXLENS_MAX_INGEST_BYTES = 2000
    events = turn_events()
    events[2]["observation"] = "x" * 3000

    reply = api.post(URL, payload(*events), format="json")

    assert reply.status_code == 413
    assert "CTXLENS_MAX_INGEST_BYTES" in reply.json()["detail"]
    assert set(row_counts().values()) == {0}


def test_a_key_over_its_rate_is_told_to_retry_later(api, settings):
    settings.CTXLENS_INGEST_RATE_LIMIT = 1
    settings.CTXLENS_INGEST_RATE_WINDOW = 3  # 3 spans per window
    assert api.post(URL, payload(*turn_events("c1")), format="json").status_code == 200  # crosses the line

    reply = api.post(URL, payload(*turn_events("c2")), format="json")

    assert reply.status_code == 429
    assert 1 <= int(reply["Retry-After"]) <= 3
    assert not Conversation.objects.filter(external_id="c2").exists()


# --- who may ingest --------------------------------------------------------------------------


def test_ingest_without_a_key_is_a_401(db):
    reply = client_with().post(URL, payload(*turn_events()), format="json")

    assert reply.status_code == 401
    assert reply["WWW-Authenticate"].startswith("Bearer")
    assert Conversation.objects.count() == 0


def test_a_wrong_key_is_a_401(db):
    reply = client_with("ctx_not-a-real-key").post(URL, payload(*turn_events()), format="json")

    assert reply.status_code == 401
    assert reply.json()["detail"] == "invalid or revoked API key"  # the words OTLP and gRPC use too
    assert set(row_counts().values()) == {0}


def test_a_revoked_key_is_refused(db):
    key, raw = ApiKey.generate("old", scope=Scope.INGEST)
    key.revoke()

    reply = client_with(raw).post(URL, payload(*turn_events()), format="json")

    assert reply.status_code == 401
    assert Conversation.objects.count() == 0


def test_a_read_key_cannot_ingest(db):
    raw = ApiKey.generate("reader", scope=Scope.READ)[1]

    reply = client_with(raw).post(URL, payload(*turn_events()), format="json")

    assert reply.status_code == 403
    assert "does not have the 'ingest' scope" in reply.json()["detail"]
    assert Conversation.objects.count() == 0


def test_a_logged_in_user_still_needs_a_key_to_ingest(alice):
    client = APIClient()
    client.force_login(alice)

    reply = client.post(URL, payload(*turn_events()), format="json")

    assert reply.status_code == 401
    assert reply["WWW-Authenticate"].startswith("Bearer")
    assert Conversation.objects.count() == 0


def test_an_all_scope_key_can_ingest(db):
    raw = ApiKey.generate("both", scope=Scope.ALL)[1]

    assert client_with(raw).post(URL, payload(*turn_events()), format="json").status_code == 200
    assert Round.objects.get().status == Status.OK


def test_the_key_records_when_it_was_last_used(api, ingest_key):
    api.post(URL, payload(*turn_events()), format="json")

    assert ApiKey.objects.get(prefix=ingest_key[:12]).last_used_at is not None


# --- end to end through a real server -------------------------------------------------------


def test_ingest_end_to_end_through_uvicorn(live_uvicorn):
    ingest_raw = ApiKey.generate("agent", scope=Scope.INGEST)[1]
    read_raw = ApiKey.generate("reader", scope=Scope.READ)[1]
    with httpx.Client(base_url=live_uvicorn.url, timeout=30) as http:
        events = INGEST_EXAMPLE["events"]
        start, rest = events[:2], events[2:]
        first = http.post(URL, json=payload(*start), headers={"Authorization": f"Bearer {ingest_raw}"})
        assert first.status_code == 200, first.text
        running = http.get("/api/conversations/", headers={"Authorization": f"Bearer {read_raw}"})
        assert running.json()["results"][0]["status"] == "running"

        second = http.post(URL, json=payload(*rest), headers={"Authorization": f"Bearer {ingest_raw}"})
        resend = http.post(URL, json=INGEST_EXAMPLE, headers={"Authorization": f"Bearer {ingest_raw}"})
        bad = http.post(URL, json={"schema_version": "9.0", "events": []},
                        headers={"Authorization": f"Bearer {ingest_raw}"})
        listing = http.get("/api/conversations/", headers={"Authorization": f"Bearer {read_raw}"})

    assert second.status_code == 200, second.text
    assert resend.json()["stored"] == 0
    assert bad.status_code == 400
    (conversation,) = listing.json()["results"]
    assert conversation["external_id"] == "support-42"
    assert conversation["status"] == "ok"
    assert conversation["tool_call_count"] == 1
    assert conversation["input_tokens"] == 1200
    tool = ToolCall.objects.get()
    assert (tool.tool_name, tool.tool_call_id, tool.observation) == ("order_status", "call_abc", "Shipped on 30 April.")


def test_a_turn_whose_start_and_end_arrive_together_keeps_both(live_uvicorn):
    """Each turn's round_start and round_end sent at once, in concurrent requests: whichever the
    server stores second is merged with the first (under the trace's lock on PostgreSQL)."""
    raw = ApiKey.generate("agent", scope=Scope.INGEST)[1]
    turns = 24
    halves = [payload(event) for i in range(turns) for event in turn_events(f"c{i}")[::4]]
    with httpx.Client(base_url=live_uvicorn.url, timeout=60, headers={"Authorization": f"Bearer {raw}"}) as http, \
            ThreadPoolExecutor(max_workers=8) as pool:
        replies = list(pool.map(lambda body: http.post(URL, json=body), halves))
    assert [r.status_code for r in replies] == [200] * len(halves)
    rounds = Round.objects.filter(key="r1")
    assert sorted(rounds.values_list("user_message", "final_answer", "status", "duration_ms").distinct()) == [
        ("What is 6 x 7?", "6 x 7 = 42", Status.OK, 2000.0)]
    assert rounds.count() == turns
