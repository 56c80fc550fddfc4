"""GET /api/schema/: a valid OpenAPI 3 document that covers the whole API, the ingest events included."""

from __future__ import annotations

import pytest
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

from pipeline.ingest.decode.rest_schema import EVENT_SERIALIZERS
from pipeline.models import ApiKey
from pipeline.models.apikeys import Scope
from tests.api_client import client_with

PATHS = {
    "/api/ingest/": "post",
    "/api/conversations/": "get",
    "/api/conversations/{id}/": "get",
    "/api/llm-calls/{id}/": "get",
    "/api/conversations/{id}/findings/": "get",
    "/api/tools/stats/": "get",
    "/api/compressions/": "get",
    "/api/compressions/{id}/": "get",
    "/api/artifacts/": "get",
    "/api/artifacts/{artifact_id}/content": "get",
}



@pytest.fixture
def schema(db) -> dict:
    raw = ApiKey.generate("reader", scope=Scope.READ)[1]
    reply = client_with(raw).get("/api/schema/?format=json")
    assert reply.status_code == 200
    assert reply["Content-Type"].startswith("application/vnd.oai.openapi+json")
    return reply.json()


def test_the_schema_is_valid_openapi_3(schema):
    validate_schema(schema)  # raises on an invalid document

    assert schema["openapi"].startswith("3.")


def test_the_schema_covers_every_endpoint(schema):
    for path, method in PATHS.items():
        assert method in schema["paths"].get(path, {}), f"{method.upper()} {path} is missing"


def test_the_ingest_events_are_documented_one_schema_per_type(schema):
    components = schema["components"]["schemas"]
    events = schema["components"]["schemas"]["IngestRequest"]["properties"]["events"]
    assert events["type"] == "array"
    assert events["items"]["$ref"].endswith("/IngestEvent")
    mapping = components["IngestEvent"]["discriminator"]["mapping"]

    assert set(mapping) == set(EVENT_SERIALIZERS)
    for kind, serializer_class in EVENT_SERIALIZERS.items():
        component = components[mapping[kind].rsplit("/", 1)[1]]
        fields = serializer_class().fields
        assert set(component["properties"]) == set(fields), kind
        required = {name for name, field in fields.items() if field.required}
        assert set(component.get("required", [])) == required, kind


def test_the_ingest_operation_documents_its_errors_and_an_example(schema):
    post = schema["paths"]["/api/ingest/"]["post"]

    assert {"200", "400", "401", "403", "413", "415", "503"} <= set(post["responses"])
    example = post["requestBody"]["content"]["application/json"]["examples"]
    assert next(iter(example.values()))["value"]["schema_version"] == "1.0"


def test_the_tool_stats_operation_lists_its_figures_and_filters(schema):
    get = schema["paths"]["/api/tools/stats/"]["get"]
    figures = schema["components"]["schemas"]["ToolStats"]["properties"]

    assert {p["name"] for p in get["parameters"]} >= {"since", "until", "window", "conversation", "tool"}
    assert {"tool_name", "calls", "successes", "failures", "success_rate", "retries", "cache_hits", "cache_hit_rate", "avg_duration_ms",
            "p50_duration_ms", "p95_duration_ms", "p99_duration_ms", "avg_observation_tokens", "total_observation_tokens",
            "context_tokens", "context_cost_usd", "avg_context_carries", "level_calls", "tokens_at_level",
            "level_savings"} == set(figures)


def test_the_tool_stats_schema_documents_the_context_cost_and_the_level_what_if(schema):
    components = schema["components"]["schemas"]
    figures = components["ToolStats"]["properties"]

    assert figures["context_cost_usd"]["nullable"] is True and "carried" in figures["context_tokens"]["description"]
    assert set(components["TokensAtLevel"]["properties"]) == {"brief", "standard", "full"}
    assert set(components["LevelSavings"]["properties"]) == {"brief", "standard", "full"}
    assert set(components["LevelSaving"]["properties"]) == {"tokens", "cost_usd"}
    assert components["LevelSaving"]["properties"]["cost_usd"]["nullable"] is True
    tool_call = components["ToolCall"]["properties"]
    assert {"context_tokens", "context_carries", "context_cost_usd", "tokens_at_level"} <= set(tool_call)
    assert tool_call["tokens_at_level"]["allOf"] == [{"$ref": "#/components/schemas/TokensAtLevel"}]


def test_the_bearer_key_is_the_documented_security_scheme(schema):
    scheme = schema["components"]["securitySchemes"]["apiKey"]

    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    assert {"apiKey": []} in schema["paths"]["/api/ingest/"]["post"]["security"]


def test_the_schema_needs_a_key_or_a_session(db, bob):
    assert client_with().get("/api/schema/").status_code == 401
    ingest_raw = ApiKey.generate("agent", scope=Scope.INGEST)[1]
    assert client_with(ingest_raw).get("/api/schema/").status_code == 200
    session = APIClient()
    session.force_login(bob)
    assert session.get("/api/schema/").status_code == 200


def test_an_llm_call_documents_its_diff(schema):
    components = schema["components"]["schemas"]
    get = schema["paths"]["/api/llm-calls/{id}/"]["get"]
    assert get["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/LLMCallDetail"}
    assert {"404", "401", "403"} <= set(get["responses"])
    assert {"id", "conversation", "round", "input_messages", "output_messages", "context_composition",
            "diff"} <= set(components["LLMCallDetail"]["properties"])
    assert set(components["CallDiff"]["properties"]) == {
        "previous_call_id", "kept_prefix_messages", "kept_prefix_tokens", "added", "removed", "changed",
        "token_delta", "token_delta_by_category", "cache_break", "cache_break_reason", "uncacheable_tokens"}
    assert set(components["DiffMessage"]["properties"]) == {"index", "role", "category", "tokens"}
    assert set(components["ChangedMessage"]["properties"]) == {
        "index", "role", "category", "tokens", "previous_index", "previous_tokens"}


def test_the_tool_stats_operation_states_the_percentiles_bound(schema):
    get = schema["paths"]["/api/tools/stats/"]["get"]
    figures = schema["components"]["schemas"]["ToolStats"]["properties"]

    assert "within 2 %" in get["description"]
    assert all("within 2 %" in figures[f"p{p}_duration_ms"]["description"] for p in (50, 95, 99))
