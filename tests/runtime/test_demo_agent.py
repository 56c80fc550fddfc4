"""End to end: `manage.py demo_agent` runs the real loop and its spans land in the store, in-process or over OTLP."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from pipeline.models import ApiKey, Artifact, CompressionEvent, Conversation, LLMCall, Round, SkillActivation, Span, ToolCall


def model_tool_call_ids(conversation: Conversation) -> list[str]:
    """The ids of the tool calls the model made, read from the stored LLM outputs."""
    ids = []
    for call in LLMCall.objects.filter(conversation=conversation).order_by("started_at"):
        for message in call.output_messages:
            ids += [p["id"] for p in message.get("parts", []) if p.get("type") == "tool_call"]
    return ids


def check_stored_demo(artifact_dir) -> None:
    assert Conversation.objects.count() == 5
    rounds = Round.objects.all()
    assert rounds.count() == 11 and set(rounds.values_list("status", flat=True)) == {"ok"}
    assert all(r.user_message and r.final_answer for r in rounds)

    for conversation in Conversation.objects.all():
        stored = list(ToolCall.objects.filter(conversation=conversation).order_by("started_at").values_list("tool_call_id", flat=True))
        assert stored and stored == model_tool_call_ids(conversation)
        assert all(tc.round_id and tc.llm_call_id for tc in ToolCall.objects.filter(conversation=conversation))

    tools = ToolCall.objects.all()
    assert tools.filter(tool_name="web_search", success=True, retry_count=2).exists()  # rate limited twice
    assert tools.filter(tool_name="web_search", success=False, error_type="timeout").exists()
    assert tools.filter(tool_name="web_search", success=False, error_type="permission_denied").exists()
    assert tools.filter(tool_name="query_sales", success=False, error_type="invalid_parameters").exists()

    exported = tools.filter(tool_name="export_sales").exclude(artifact=None)
    assert exported.count() == 2
    sandbox = artifact_dir.resolve()
    for call in exported:
        artifact = call.artifact
        path = artifact.file_path.resolve()
        assert path.parent == sandbox and path.is_file() and path.stat().st_size == artifact.size > 100_000
        assert artifact.artifact_id in call.observation and str(sandbox) not in call.observation
        assert artifact.conversation_id == call.conversation_id  # the artifacts page names its conversation
    assert Artifact.objects.count() == 2

    compressions = CompressionEvent.objects.order_by("occurred_at")
    assert compressions.count() >= 1
    assert all(c.tokens_after < c.tokens_before and c.messages_before and c.before_messages for c in compressions)
    assert compressions.filter(strategy="summarize").exclude(summary="").exists()  # the background summary, used

    skills = SkillActivation.objects.order_by("activated_at")
    assert list(skills.values_list("skill_name", "load_level", "depth")) == [
        ("sales-analysis", 2, 1), ("sales-analysis", 3, 1), ("report-writing", 2, 2), ("report-writing", 3, 2)
    ]
    assert skills[2].chain == ["sales-analysis", "report-writing"] and all(s.tokens > 0 for s in skills)

    windows = LLMCall.objects.exclude(context_window=None)
    assert windows.count() == LLMCall.objects.count() == 35
    assert {c.model for c in windows} == {"gpt-4o-mini", "gpt-4"}
    assert all(c.context_composition and c.input_tokens > 0 for c in windows)


def check_demo_findings() -> None:
    """The real loop keeps the tool-calling protocol and explains every cache break with a
    compression: its only findings are the artifact reads that fill over a third of gpt-4's 8k window."""
    from pipeline.insight.findings import conversation_findings

    found = [(f.code, f.severity, ToolCall.objects.get(pk=f.tool_call).tool_name)
             for conversation in Conversation.objects.order_by("pk") for f in conversation_findings(conversation)]
    assert found == [("oversized_observation", "warning", "read_artifact")] * 3


@pytest.mark.django_db(transaction=True)
def test_demo_agent_stores_rounds_tool_calls_artifacts_skills_and_compressions(artifact_dir):
    out = StringIO()
    call_command("demo_agent", stdout=out)
    output = out.getvalue()
    assert "Demo: 5 conversations, 11 rounds, 26 tool calls (3 failed, 4 retries), 2 artifacts" in output
    assert "spans sent to the store" in output and str(artifact_dir) not in output
    check_stored_demo(artifact_dir)
    check_demo_findings()
    assert set(Span.objects.values_list("source", flat=True)) == {"pipeline"}


def test_demo_agent_exports_over_otlp_to_a_live_receiver(live_uvicorn, artifact_dir):
    _, raw_key = ApiKey.generate("demo")
    out = StringIO()
    call_command(
        "demo_agent", "--no-store", "--otlp-endpoint", live_uvicorn.url, "--header", f"Authorization=Bearer {raw_key}",
        stdout=out,
    )
    assert "spans sent to OTLP" in out.getvalue()
    check_stored_demo(artifact_dir)
    assert set(Span.objects.values_list("source", flat=True)) == {"otlp"}
    assert set(Span.objects.values_list("service_name", flat=True)) == {"ctxlens-agent"}


def test_demo_agent_refuses_to_send_spans_nowhere():
    with pytest.raises(CommandError, match="--no-store needs --otlp-endpoint"):
        call_command("demo_agent", "--no-store")
    with pytest.raises(CommandError, match="--header"):
        call_command("demo_agent", "--otlp-endpoint", "http://127.0.0.1:9", "--header", "novalue")
