"""Conversation totals (the seeds' ConversationMetrics): compressions, skill activations, distinct
skills, retried tool calls and messages, from spans the runtime sent over OTLP, read through the
read API and the conversation page's header."""

from __future__ import annotations

import re

from django.test import Client

from pipeline.models import ApiKey, Conversation
from pipeline.models.apikeys import Scope
from pipeline.runtime.demo.scenario import DemoReport, run_demo
from pipeline.runtime.telemetry.config import ObservabilityConfig
from pipeline.runtime.telemetry.spans import Telemetry
from tests.api_client import client_with


def expected_totals(report: DemoReport, conversation_id: str, rounds_per_conversation: list[int]) -> dict[str, int]:
    """What the runtime itself counted for one conversation of the demo."""
    start = sum(rounds_per_conversation[: report.conversation_ids.index(conversation_id)])
    rounds = report.rounds[start: start + rounds_per_conversation[report.conversation_ids.index(conversation_id)]]
    activations = [a for r in rounds for a in r.skill_activations if not a.resource]  # resource reads are not activations
    return {
        "compression_count": sum(len(r.compressions) for r in rounds),
        "skill_activation_count": len(activations),
        "unique_skill_count": len({a.skill for a in activations}),
        "retried_call_count": sum(1 for r in rounds for t in r.tool_results if t.retry_count > 0),
        "message_count": sum(1 + r.llm_calls + len(r.tool_results) for r in rounds),
    }


def test_totals_count_what_the_runtime_did(otlp_server, artifact_dir, alice):
    _, ingest_key = ApiKey.generate("agent", scope=Scope.INGEST)
    _, read_key = ApiKey.generate("reader", scope=Scope.READ)
    telemetry = Telemetry.from_config(ObservabilityConfig(
        otlp_endpoint=otlp_server.url, otlp_headers={"Authorization": f"Bearer {ingest_key}"}, otlp_compression="none",
    ))
    per_conversation: list[int] = []
    titles: list[str] = []

    def on_round(title: str, _round: object) -> None:
        if titles and titles[-1] == title:
            per_conversation[-1] += 1
        else:
            titles.append(title)
            per_conversation.append(1)

    report = run_demo(telemetry, on_round=on_round)
    telemetry.shutdown()  # flushes every span to the server

    api = client_with(read_key)
    seen = {"compression_count": 0, "skill_activation_count": 0, "retried_call_count": 0}
    for external_id in report.conversation_ids:
        pk = Conversation.objects.get(external_id=external_id).pk
        body = api.get(f"/api/conversations/{pk}/").json()
        expected = expected_totals(report, external_id, per_conversation)
        assert {name: body[name] for name in expected} == expected, external_id
        for name in seen:
            seen[name] += body[name]
    # the demo has all of them: a compression, two nested skills, and two retried searches (one
    # rate-limited that then succeeded, one that timed out on every attempt)
    assert seen["compression_count"] >= 1 and seen["skill_activation_count"] == 2 and seen["retried_call_count"] == 2

    skilled = Conversation.objects.get(skill_activation_count=2)
    assert skilled.unique_skill_count == 2
    browser = Client()
    browser.force_login(alice)
    page = browser.get(f"/conversations/{skilled.pk}/").content.decode()
    stat = lambda name: re.search(rf'data-stat="{name}"[^>]*>(\d+)<', page).group(1)  # noqa: E731
    assert stat("skill-activations") == "2" and stat("unique-skills") == "2"
    assert stat("messages") == str(skilled.message_count) and int(stat("messages")) > skilled.tool_call_count


def test_a_level_3_activation_counts_and_a_resource_read_does_not(db):
    _, ingest_key = ApiKey.generate("agent", scope=Scope.INGEST)
    _, read_key = ApiKey.generate("reader", scope=Scope.READ)
    common = {"conversation_id": "levels", "round_id": "r1", "chain": ["pdf"]}
    events = [
        {"type": "round_start", "conversation_id": "levels", "round_id": "r1", "timestamp": "2026-05-01T12:00:00Z",
         "user_message": "fill the form"},
        # activate_skill("pdf", level=3): its instructions and every resource, injected at once.
        {"type": "skill_activation", **common, "activation_id": "a-1", "timestamp": "2026-05-01T12:00:01Z",
         "skill_name": "pdf", "level": 3, "resources": ["references/forms.md"], "tokens": 300, "messages": [
             {"kind": "instruction", "visibility": "hidden", "tokens": 10, "content": "how to fill forms"},
             {"kind": "instruction", "visibility": "hidden", "resource": "references/forms.md", "tokens": 290,
              "content": "forms"}]},
        # read_skill_resource("docs", ...): a level-3 read of another, already active skill, no messages.
        {"type": "skill_activation", **common, "activation_id": "a-2", "timestamp": "2026-05-01T12:00:02Z",
         "skill_name": "docs", "level": 3, "resources": ["references/style.md"], "tokens": 50},
    ]
    assert client_with(ingest_key).post("/api/ingest/", {"schema_version": "1.0", "events": events},
                                        format="json").status_code == 200

    pk = Conversation.objects.get(external_id="levels").pk
    body = client_with(read_key).get(f"/api/conversations/{pk}/").json()
    assert (body["skill_activation_count"], body["unique_skill_count"]) == (1, 1)
