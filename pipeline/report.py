"""The seeds' human-readable metrics report (ConversationMetrics.to_report, MetricsCollector's global
stats), built from the stored records: `manage.py report [--conversation ID] [--since 7d]`.

The figures are the conversation totals the ingest keeps (pipeline.ingest.write.counters) and the
per-tool statistics of pipeline.stats. One difference from the seeds: a tool's "Avg Tokens" is
the tokens of its observation, the part of a tool call that fills the model's context (what it
takes from the conversation window, not the tokens a tool reads or spends on its own).
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, Sum

from pipeline.models import Conversation, SkillActivation, ToolCall
from pipeline.stats import ToolStats, tool_calls_in, tool_stats


def _tool_lines(stats: list[ToolStats]) -> str:
    if not stats:
        return "  None\n"
    lines = []
    for s in stats:
        duration = f"{s.avg_duration_ms:.1f}ms" if s.avg_duration_ms is not None else "–"
        lines.append(
            f"  {s.tool_name}:\n"
            f"    - Calls: {s.calls}\n"
            f"    - Avg Duration: {duration}\n"
            f"    - Avg Tokens: {s.avg_observation_tokens:.0f}\n"
            f"    - Success Rate: {s.success_rate:.1%}\n"
        )
    return "".join(lines)


def _duration_seconds(start: datetime, end: datetime) -> float:
    return max((end - start).total_seconds(), 0.0)


def conversation_report(conversation: Conversation) -> str:
    """ConversationMetrics.to_report for one stored conversation."""
    c = conversation
    calls = tool_calls_in(conversation_id=c.pk)
    failed = calls.filter(success=False).count()
    skills = sorted(set(
        SkillActivation.objects.filter(conversation=c).exclude(load_level=3, messages=[])
        .values_list("skill_name", flat=True)
    ))
    return (
        "Conversation Metrics Report\n"
        "============================\n"
        f"Conversation ID: {c.external_id}\n"
        f"Duration: {_duration_seconds(c.started_at, c.last_activity_at):.1f}s\n"
        "\n"
        "Token Usage:\n"
        f"  - Input: {c.input_tokens:,}\n"
        f"  - Output: {c.output_tokens:,}\n"
        f"  - Total: {c.input_tokens + c.output_tokens:,}\n"
        "\n"
        "Tool Calls:\n"
        f"  - Total: {c.tool_call_count}\n"
        f"  - Successful: {c.tool_call_count - failed}\n"
        f"  - Failed: {failed}\n"
        f"  - Retried: {c.retried_call_count}\n"
        "\n"
        "Per-Tool Statistics:\n"
        f"{_tool_lines(tool_stats(calls))}"
        "\n"
        "Skills Activated:\n"
        f"  - Total: {c.skill_activation_count}\n"
        f"  - Unique: {c.unique_skill_count}\n"
        f"  - Skills: {', '.join(skills) if skills else 'None'}\n"
        "\n"
        "Context Management:\n"
        f"  - Messages: {c.message_count}\n"
        f"  - Compressions: {c.compression_count}\n"
    )


def global_report(since: datetime | None = None) -> str:
    """MetricsCollector.get_global_stats over the conversations active since `since` (all by default),
    with the per-tool statistics of their tool calls."""
    conversations = Conversation.objects.order_by()
    calls = ToolCall.objects.all()
    if since is not None:
        conversations = conversations.filter(last_activity_at__gte=since)
        calls = calls.filter(conversation__last_activity_at__gte=since)
    totals = conversations.aggregate(
        n=Count("id"), tools=Sum("tool_call_count"), retried=Sum("retried_call_count"),
        input=Sum("input_tokens"), output=Sum("output_tokens"), compressions=Sum("compression_count"),
        skills=Sum("skill_activation_count"),
    )
    tool_total = totals["tools"] or 0
    tokens = (totals["input"] or 0) + (totals["output"] or 0)
    seconds = sum(_duration_seconds(a, b) for a, b in conversations.values_list("started_at", "last_activity_at"))
    scope = f"since {since:%Y-%m-%d %H:%M} UTC" if since else "all stored conversations"
    return (
        "Metrics Report\n"
        "==============\n"
        f"Scope: {scope}\n"
        f"Conversations: {totals['n']}\n"
        f"Duration: {seconds:.1f}s\n"
        "\n"
        "Token Usage:\n"
        f"  - Input: {totals['input'] or 0:,}\n"
        f"  - Output: {totals['output'] or 0:,}\n"
        f"  - Total: {tokens:,}\n"
        f"  - Avg per Tool Call: {tokens / tool_total if tool_total else 0:,.0f}\n"
        "\n"
        "Tool Calls:\n"
        f"  - Total: {tool_total}\n"
        f"  - Failed: {calls.filter(success=False).count()}\n"
        f"  - Retried: {totals['retried'] or 0}\n"
        "\n"
        "Per-Tool Statistics:\n"
        f"{_tool_lines(tool_stats(calls))}"
        "\n"
        f"Skill Activations: {totals['skills'] or 0}\n"
        f"Compressions: {totals['compressions'] or 0}\n"
    )
