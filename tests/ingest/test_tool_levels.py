"""A tool call's tokens at BRIEF, STANDARD and FULL, from its stored full result, and the what-if.

The results come from the runtime's own executor (an artifact in the server's store, or a full
observation of a tool that may not make artifacts) and go in through the REST ingest API; the
counts must equal what the runtime's formatters and token counter give for the raw output.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from langchain_core.tools import StructuredTool

from pipeline.artifacts.store import ServerArtifactStore
from pipeline.ingest.write import deferred
from pipeline.models import ToolCall
from pipeline.models.apikeys import ApiKey, Scope
from pipeline.runtime.executor import ToolExecutor
from pipeline.runtime.observations import OutputLevel, format_artifact_observation, format_observation
from pipeline.tokens.counting import count_tokens
from tests.api_client import client_with

pytestmark = pytest.mark.django_db

ROWS = [{"title": f"Result {i}", "url": f"https://example.org/{i}", "snippet": "context windows " * (i + 3)}
        for i in range(8)]


def search(query: str = "") -> list[dict]:
    return ROWS


@pytest.fixture
def api():
    return client_with(ApiKey.generate("agent", scope=Scope.INGEST)[1])


@pytest.fixture
def reader(client, alice):
    client.force_login(alice)
    return client


def run(tool_name: str, *, store_artifacts: bool, artifact_dir=None):
    tool = StructuredTool.from_function(search, name=tool_name, description="search the web",
                                        metadata={"ctxlens_store_artifacts": store_artifacts})
    executor = ToolExecutor([tool], artifact_store=ServerArtifactStore() if artifact_dir else None)
    result = executor.execute_tool_call({"id": f"call_{tool_name}", "name": tool_name, "args": {"query": "ctx"},
                                         "type": "tool_call"}, output_level="full")
    assert result.success and result.output_level is OutputLevel.FULL
    return result


def turn(tool_name: str, result, *, carriers: int = 0, round_id: str = "r1") -> list[dict]:
    """The LLM call asking for the tool, the tool call as the runtime reported it, and `carriers`
    later calls whose input carries its observation."""
    base = {"conversation_id": "c1", "round_id": round_id}
    asks = {"role": "assistant", "tool_calls": [{"id": result.tool_call_id, "name": tool_name, "arguments": {}}]}
    events = [
        {**base, "type": "llm_call", "call_id": "ask", "model": "gpt-4o", "provider": "openai",
         "started_at": "2026-05-01T12:00:00Z", "duration_ms": 300, "input_tokens": 30, "output_tokens": 9,
         "input_messages": [{"role": "user", "content": "Search for context."}], "output_messages": [asks]},
        {**base, "type": "tool_call", "tool_name": tool_name, "tool_call_id": result.tool_call_id,
         "started_at": "2026-05-01T12:00:01Z", "duration_ms": 50, "observation": result.observation,
         "output_level": "full", **({"artifact_id": result.artifact_id} if result.artifact_id else {})},
    ]
    history = [{"role": "user", "content": "Search for context."}, asks,
               {"role": "tool", "tool_call_id": result.tool_call_id, "content": result.observation}]
    for i in range(carriers):
        history = [*history, {"role": "assistant", "content": f"Reading result {i}."}]
        events.append({**base, "type": "llm_call", "call_id": f"carry-{i}", "model": "gpt-4o", "provider": "openai",
                       "started_at": f"2026-05-01T12:00:{2 + i:02d}Z", "duration_ms": 300,
                       "input_tokens": 2000 + 100 * i, "output_tokens": 9, "input_messages": list(history)})
    return events


def post(api, events: list[dict]) -> None:
    reply = api.post("/api/ingest/", {"schema_version": "1.0", "events": events}, format="json")
    assert reply.status_code == 200, reply.json()


def runtime_levels(data: object) -> dict[str, int]:
    """What the runtime's formatters and token counter make of the raw output, per level."""
    return {level.value: count_tokens(format_observation(data, level), "gpt-4o") for level in OutputLevel}


def test_a_stored_full_observation_is_counted_at_every_level_after_the_response(api):
    result = run("web_search", store_artifacts=False)
    assert result.artifact_id is None and result.observation == format_observation(ROWS, OutputLevel.FULL)
    post(api, turn("web_search", result))
    assert ToolCall.objects.get().tokens_at_level is None  # not on the ingest response's path

    deferred.complete_pending()

    levels = ToolCall.objects.get().tokens_at_level
    assert levels == runtime_levels(ROWS)
    assert levels["brief"] < levels["standard"] < levels["full"]


def test_an_artifact_backed_result_is_counted_from_the_artifact(api, artifact_dir):
    result = run("web_search", store_artifacts=True, artifact_dir=artifact_dir)
    assert result.artifact_id and result.observation.startswith(f"Data stored as artifact: {result.artifact_id}")
    post(api, turn("web_search", result))
    assert ToolCall.objects.get().artifact.artifact_id == result.artifact_id

    deferred.complete_pending()

    assert ToolCall.objects.get().tokens_at_level == runtime_levels(ROWS)


def test_without_a_full_result_there_is_nothing_to_count(api):
    note = format_artifact_observation("artifact_" + "ab" * 16, "List with 8 items.")
    events = turn("web_search", run("web_search", store_artifacts=False))
    events[1]["observation"] = note  # names an artifact this server does not hold
    standard = {**events[1], "call_id": "t2", "tool_call_id": "call_other", "output_level": "standard",
                "observation": "Found 8 items"}
    post(api, [*events, standard])

    deferred.complete_pending()

    assert dict(ToolCall.objects.values_list("tool_call_id", "tokens_at_level")) == {
        "call_web_search": {}, "call_other": None}


def test_the_tools_api_sums_the_levels_and_says_what_switching_would_have_saved(api, reader, artifact_dir):
    inline = run("web_search", store_artifacts=False)
    stored = run("fetch_page", store_artifacts=True, artifact_dir=artifact_dir)
    post(api, turn("web_search", inline, carriers=3))
    post(api, turn("fetch_page", stored, carriers=2, round_id="r2"))
    deferred.complete_pending()

    stats = {s["tool_name"]: s for s in reader.get("/api/tools/stats/").json()}
    for name, carries in (("web_search", 3), ("fetch_page", 2)):
        tool = ToolCall.objects.get(tool_name=name)
        entry = stats[name]
        assert (entry["level_calls"], entry["tokens_at_level"]) == (1, runtime_levels(ROWS))
        assert (entry["avg_context_carries"], tool.context_carries) == (carries, carries)
        per_token = tool.context_cost_usd / tool.context_tokens
        for level, tokens in runtime_levels(ROWS).items():
            saved = (tool.observation_tokens - tokens) * carries
            assert entry["level_savings"][level] == {"tokens": saved, "cost_usd": float(saved * per_token)}
        assert entry["context_cost_usd"] == float(tool.context_cost_usd)
    # FULL would have cost the tool whose results became artifacts more than their note did
    assert stats["fetch_page"]["level_savings"]["full"]["tokens"] < 0 < stats["web_search"]["level_savings"]["brief"]["tokens"]
    assert ToolCall.objects.get(tool_name="fetch_page").context_cost_usd > Decimal(0)


def test_a_tool_without_stored_results_has_no_what_if(api, reader):
    events = turn("web_search", run("web_search", store_artifacts=False), carriers=1)
    events[1]["output_level"] = "standard"
    post(api, events)
    deferred.complete_pending()

    [entry] = reader.get("/api/tools/stats/").json()
    assert (entry["level_calls"], entry["tokens_at_level"], entry["level_savings"]) == (0, None, None)
    assert entry["context_tokens"] == ToolCall.objects.get().context_tokens > 0


def test_the_conversation_api_shows_each_tool_calls_context_cost_and_levels(api, reader):
    post(api, turn("web_search", run("web_search", store_artifacts=False), carriers=2))
    tool = ToolCall.objects.get()
    detail = reader.get(f"/api/conversations/{tool.conversation_id}/").json()
    [shown] = detail["rounds"][0]["tool_calls"]
    assert (shown["context_tokens"], shown["context_carries"], shown["tokens_at_level"]) == (
        tool.context_tokens, 2, None)  # the levels are counted after the response
    assert shown["context_cost_usd"] == float(tool.context_cost_usd)

    deferred.complete_pending()

    [shown] = reader.get(f"/api/conversations/{tool.conversation_id}/").json()["rounds"][0]["tool_calls"]
    assert shown["tokens_at_level"] == runtime_levels(ROWS)
