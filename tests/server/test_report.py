"""`manage.py report`: the seeds' human-readable metrics report, for one conversation or all."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from pipeline.models import ApiKey
from tests.api_client import client_with

pytestmark = pytest.mark.django_db


def send_turn(client, conversation: str, *, tool_calls: list[dict], skills: tuple[tuple[str, int], ...] = (),
              compressions: int = 0) -> None:
    at = "2026-05-01T12:00:0{}Z"
    events: list[dict] = [
        {"type": "round_start", "conversation_id": conversation, "round_id": "r1", "timestamp": at.format(0),
         "user_message": "Q3 revenue?"},
        {"type": "llm_call", "conversation_id": conversation, "round_id": "r1", "call_id": "llm-1", "model": "gpt-4o",
         "started_at": at.format(1), "duration_ms": 800, "input_tokens": 1200, "output_tokens": 34},
    ]
    for i, call in enumerate(tool_calls):
        events.append({"type": "tool_call", "conversation_id": conversation, "round_id": "r1",
                       "tool_call_id": f"call_{i}", "started_at": at.format(2), "observation": "rows", **call})
    for i, (skill, level) in enumerate(skills):
        events.append({"type": "skill_activation", "conversation_id": conversation, "round_id": "r1",
                       "activation_id": f"s{i}", "timestamp": at.format(3), "skill_name": skill, "level": level})
    for i in range(compressions):
        events.append({"type": "compression", "conversation_id": conversation, "round_id": "r1",
                       "compression_id": f"k{i}", "timestamp": at.format(4), "strategy": "extract",
                       "tokens_before": 9000, "tokens_after": 3000})
    events.append({"type": "round_end", "conversation_id": conversation, "round_id": "r1",
                   "timestamp": at.format(9), "final_answer": "1.2M"})
    reply = client.post("/api/ingest/", {"schema_version": "1.0", "events": events}, format="json")
    assert reply.status_code == 200, reply.content


@pytest.fixture
def ingest():
    _, key = ApiKey.generate("agent")
    return client_with(key)


def report(*args: str) -> str:
    out = StringIO()
    call_command("report", *args, stdout=out)
    return out.getvalue()


def test_it_reports_one_conversation_as_the_seeds_do(ingest):
    send_turn(ingest, "sales-1", tool_calls=[
        {"tool_name": "query_sales", "duration_ms": 40, "retry_count": 2},
        {"tool_name": "query_sales", "duration_ms": 60},
        {"tool_name": "web_search", "duration_ms": 900, "status": "error", "error_type": "timeout"},
    ], skills=(("sales-analysis", 2), ("sales-analysis", 3), ("report-writing", 2)), compressions=1)
    send_turn(ingest, "other", tool_calls=[{"tool_name": "calculator", "duration_ms": 1}])

    text = report("--conversation", "sales-1")
    assert text.startswith("Conversation Metrics Report\n============================\nConversation ID: sales-1\n")
    assert "Duration: 9.0s" in text
    assert "Token Usage:\n  - Input: 1,200\n  - Output: 34\n  - Total: 1,234\n" in text
    assert "Tool Calls:\n  - Total: 3\n  - Successful: 2\n  - Failed: 1\n  - Retried: 1\n" in text
    assert ("  query_sales:\n    - Calls: 2\n    - Avg Duration: 50.0ms\n") in text
    assert "  web_search:\n    - Calls: 1\n    - Avg Duration: 900.0ms\n" in text and "Success Rate: 0.0%" in text
    assert "calculator" not in text  # another conversation's tool
    assert "Skills Activated:\n  - Total: 2\n  - Unique: 2\n  - Skills: report-writing, sales-analysis\n" in text
    # one user message, one model reply, three tool results
    assert "Context Management:\n  - Messages: 5\n  - Compressions: 1\n" in text


def test_the_overall_report_adds_up_every_conversation(ingest):
    send_turn(ingest, "a", tool_calls=[{"tool_name": "query_sales", "duration_ms": 10, "retry_count": 1}])
    send_turn(ingest, "b", tool_calls=[{"tool_name": "query_sales", "duration_ms": 30},
                                       {"tool_name": "calculator", "duration_ms": 2, "status": "error"}])
    text = report()
    assert "Conversations: 2\n" in text
    assert "  - Total: 2,468\n  - Avg per Tool Call: 823\n" in text
    assert "Tool Calls:\n  - Total: 3\n  - Failed: 1\n  - Retried: 1\n" in text
    assert "  query_sales:\n    - Calls: 2\n    - Avg Duration: 20.0ms\n" in text
    assert report("--since", "1h").count("Conversations: 0\n") == 1  # their activity was in May 2026


def test_it_names_a_conversation_it_does_not_have():
    with pytest.raises(CommandError, match="no conversation 'nope'"):
        report("--conversation", "nope")
    with pytest.raises(CommandError, match="--since"):
        report("--since", "soon")
