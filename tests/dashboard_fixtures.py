"""Stored records for the dashboard tests: one realistic agent conversation, built row by row.

The dashboard reads what ingest stores; these builders write the same rows directly so that
page tests do not depend on a particular ingest path.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from django.utils import timezone

from pipeline.models import (
    Artifact,
    CompressionEvent,
    Conversation,
    LLMCall,
    Round,
    SkillActivation,
    Status,
    ToolCall,
)

XSS_SCRIPT = "<script>window.__xss = 1; alert('xss')</script>"
XSS_IMG = "<img src=x onerror=\"window.__xss = 2; alert('img')\">"
XSS_PAYLOAD = f"weather ok {XSS_SCRIPT} then {XSS_IMG} end"


def text_message(role: str, text: str) -> dict:
    return {"role": role, "parts": [{"type": "text", "content": text}]}


@dataclass
class Demo:
    conversation: Conversation
    rounds: list[Round]
    llm_calls: list[LLMCall]
    tool_calls: list[ToolCall]
    compression: CompressionEvent
    artifact: Artifact | None


_counter = iter(range(1, 10**9))


def _ids() -> tuple[str, str]:
    n = next(_counter)
    return f"{n:032x}", f"{n:016x}"


def make_llm_call(conversation: Conversation, round_: Round | None, at: datetime, *, step: int = 0,
                  composition: dict | None = None, window: int = 128_000, output_text: str = "",
                  tool_calls: list[dict] | None = None, **fields: object) -> LLMCall:
    trace_id, span_id = _ids()
    composition = composition or {"system": 1200, "user": 300, "assistant": 200}
    used = sum(v for k, v in composition.items() if k != "free")
    parts = ([{"type": "text", "content": output_text}] if output_text else []) + [
        {"type": "tool_call", "id": c["id"], "name": c["name"], "arguments": c.get("arguments", {})}
        for c in tool_calls or []
    ]
    values = dict(
        conversation=conversation, round=round_, step=step, trace_id=trace_id, span_id=span_id,
        started_at=at, ended_at=at + timedelta(milliseconds=900), duration_ms=900.0, model=conversation.model,
        provider="openai", input_tokens=used, output_tokens=120, total_tokens=used + 120,
        context_window=window, context_tokens=used, context_composition={**composition, "free": window - used},
        input_messages=[text_message("system", "You are a helpful agent."), text_message("user", "hi")],
        output_messages=[{"role": "assistant", "parts": parts}], finish_reason="tool_calls" if tool_calls else "stop",
    )
    values.update(fields)
    return LLMCall.objects.create(**values)


def make_tool_call(conversation: Conversation, round_: Round | None, at: datetime, name: str, *,
                   duration_ms: float = 120.0, success: bool = True, observation: str = "ok",
                   **fields: object) -> ToolCall:
    trace_id, span_id = _ids()
    values = dict(
        conversation=conversation, round=round_, trace_id=trace_id, span_id=span_id, started_at=at,
        ended_at=at + timedelta(milliseconds=duration_ms), duration_ms=duration_ms, tool_name=name,
        tool_call_id=f"call_{span_id}", arguments={"q": "weather in Paris"}, observation=observation,
        observation_tokens=max(1, len(observation) // 4), output_level="standard", success=success,
        status="ok" if success else "error",
    )
    values.update(fields)
    return ToolCall.objects.create(**values)


def make_conversation(external_id: str = "conv-demo-1", *, title: str = "Weather and revenue report",
                      model: str = "gpt-4o", started: datetime | None = None, rounds: int = 2,
                      artifact_dir: Path | None = None, observation: str = XSS_PAYLOAD,
                      running_last: bool = False) -> Demo:
    """A conversation of `rounds` turns: LLM calls with context compositions, tool calls (one
    failing, one with retries), a compression in the last turn and, with `artifact_dir`, an artifact."""
    start = started or timezone.now() - timedelta(minutes=10)
    conversation = Conversation.objects.create(
        external_id=external_id, title=title, agent_name="demo-agent", model=model, service_name="demo",
        status=Status.RUNNING if running_last else Status.OK, started_at=start, last_activity_at=start,
    )
    all_rounds, llms, tools = [], [], []
    at = start
    artifact = None
    if artifact_dir is not None:
        content = b"line of a very long tool output\n" * 2000
        digest = hashlib.sha256(content).hexdigest()
        artifact = Artifact.objects.create(
            artifact_id=f"artifact_{digest[:32]}", sha256=digest, size=len(content), mime="text/plain",
            summary="A long search result", token_count=14000, conversation=conversation,
            expires_at=timezone.now() + timedelta(hours=24),
        )
        (artifact_dir / artifact.artifact_id).write_bytes(content)
    for n in range(rounds):
        last = n == rounds - 1
        round_ = Round.objects.create(
            conversation=conversation, key=f"{external_id}:r{n}", trace_id=f"{n + 1:032x}",
            user_message=f"Question {n + 1}: what is the weather in Paris?", started_at=at,
            status=Status.RUNNING if last and running_last else Status.OK,
            final_answer="" if last and running_last else f"Answer {n + 1}: sunny, 21 °C.",
        )
        base = 20_000 + 40_000 * n
        llms.append(make_llm_call(
            conversation, round_, at + timedelta(seconds=1), step=0,
            composition={"system": 1500, "skills": 800, "user": 600 + n * 100, "assistant": 900,
                         "tool_observations": base, "compressed_summaries": 2000 if n else 0},
            output_text=f"I should look up the weather (turn {n + 1}).",
            tool_calls=[{"id": f"call_{n}_a", "name": "get_weather", "arguments": {"city": "Paris"}}],
        ))
        tools.append(make_tool_call(conversation, round_, at + timedelta(seconds=2), "get_weather",
                                    duration_ms=150.0 + 50 * n, observation=observation,
                                    artifact=artifact if n == 0 else None))
        tools.append(make_tool_call(conversation, round_, at + timedelta(seconds=3), "web_search",
                                    duration_ms=2400.0, success=False, error_type="timeout",
                                    error_message="search backend did not answer in 2 s", retry_count=2,
                                    observation="[error] timeout"))
        if not (last and running_last):
            llms.append(make_llm_call(conversation, round_, at + timedelta(seconds=4), step=1,
                                      composition={"system": 1500, "user": 700, "assistant": 1000,
                                                   "tool_observations": base + 3000},
                                      output_text=f"Answer {n + 1}: sunny, 21 °C."))
            round_.ended_at = at + timedelta(seconds=5)
            round_.duration_ms = 5000.0
        round_.llm_call_count = 2
        round_.tool_call_count = 2
        round_.error_count = 1
        round_.input_tokens = sum(c.input_tokens for c in llms if c.round_id == round_.pk)
        round_.output_tokens = sum(c.output_tokens for c in llms if c.round_id == round_.pk)
        round_.save()
        all_rounds.append(round_)
        at += timedelta(seconds=30)
    compression = make_compression(conversation, all_rounds[-1], at - timedelta(seconds=26))
    conversation.round_count = len(all_rounds)
    conversation.llm_call_count = len(llms)
    conversation.tool_call_count = len(tools)
    conversation.error_count = sum(1 for t in tools if not t.success)
    conversation.input_tokens = sum(c.input_tokens for c in llms)
    conversation.output_tokens = sum(c.output_tokens for c in llms)
    conversation.last_activity_at = at
    conversation.save()
    return Demo(conversation, all_rounds, llms, tools, compression, artifact)


def make_compression(conversation: Conversation, round_: Round | None, at: datetime) -> CompressionEvent:
    trace_id, span_id = _ids()
    before = [
        text_message("system", "You are a helpful agent."),
        text_message("user", "Question 1: what is the weather in Paris?"),
        text_message("tool", "OLD OBSERVATION that was dropped " + "x" * 200),
        text_message("assistant", "Intermediate reasoning that was summarised."),
        text_message("user", "Question 2: and tomorrow?"),
    ]
    after = [
        text_message("system", "You are a helpful agent."),
        text_message("system", "Summary: the user asked about the weather in Paris; it was sunny."),
        text_message("user", "Question 2: and tomorrow?"),
    ]
    return CompressionEvent.objects.create(
        conversation=conversation, round=round_, trace_id=trace_id, span_id=span_id, seq=0,
        strategy="extract", occurred_at=at, messages_before=len(before), messages_after=len(after),
        tokens_before=104_000, tokens_after=41_000, context_window=128_000,
        tokens_before_by_category={"system": 1500, "user": 900, "assistant": 1600, "tool_observations": 100_000},
        tokens_after_by_category={"system": 1500, "user": 900, "assistant": 600, "tool_observations": 36_000,
                                  "compressed_summaries": 2000},
        before_messages=before, after_messages=after, dropped=[2], summarised=[1, 3],
        summary="Summary: the user asked about the weather in Paris; it was sunny.",
    )


def make_skill(conversation: Conversation, round_: Round, at: datetime) -> SkillActivation:
    trace_id, span_id = _ids()
    return SkillActivation.objects.create(
        conversation=conversation, round=round_, trace_id=trace_id, span_id=span_id, skill_name="pdf-report",
        load_level=2, chain=["report", "pdf-report"], depth=2, tokens=800, activated_at=at,
    )


def hostile(tag: str) -> str:
    """Markup that would run `window.__xss = tag` and leave an element with id `tag` if a page
    inserted it as HTML. `tag` names the field, so a failure says which field leaked."""
    if len(tag) <= 4:  # for the short columns (output level: 16 characters)
        return f"<i id={tag}>"
    return f"<img src=x id={tag} onerror=\"window.__xss='{tag}'\">"


def bidi(tag: str) -> str:
    """`tag` after a right-to-left override (U+202E) that is never closed: shown without
    isolation, it reverses the text that follows it on the page ("Invoice <RLO>fdp.exe" shows
    as "Invoice exe.pdf")."""
    return f"\u202e{tag}"


def make_hostile_conversation(artifact_dir: Path | None = None, text: Callable[[str], str] = hostile) -> Demo:
    """A conversation in which every text that a span can set carries markup of its own (or
    whatever else `text(field)` gives, e.g. bidi controls: dashboard_fixtures.bidi)."""
    demo = make_conversation(
        text("conv-id"), title=text("conv-title"), model=text("conv-model"), rounds=1,
        artifact_dir=artifact_dir, observation=text("observation"),
    )
    Conversation.objects.filter(pk=demo.conversation.pk).update(
        agent_name=text("agent"), user_id=text("user-id"), service_name=text("service"))
    round_ = demo.rounds[0]
    Round.objects.filter(pk=round_.pk).update(user_message=text("user-message"),
                                              final_answer=text("final-answer"))
    LLMCall.objects.filter(pk=demo.llm_calls[0].pk).update(
        model=text("llm-model"), provider=text("provider"), finish_reason=text("finish"),
        status=Status.ERROR, error_type=text("llm-error-type"), error_message=text("llm-error"),
        input_messages=[text_message(text("role"), text("input-message"))],
        output_messages=[{"role": "assistant", "parts": [
            {"type": "text", "content": text("thought")},
            {"type": "tool_call", "id": "c1", "name": text("requested-tool"), "arguments": {}}]}],
    )
    failing = demo.tool_calls[1]
    ToolCall.objects.filter(pk=failing.pk).update(
        tool_name=text("tool-name"), tool_call_id=text("tool-call-id"),
        arguments={text("argument-key"): text("argument")}, output_level=text("lvl"),
        error_type=text("tool-error-type"), error_code=text("code"), error_message=text("tool-error"),
    )
    CompressionEvent.objects.filter(pk=demo.compression.pk).update(
        summary=text("summary"),
        before_messages=[text_message(text("before-role"), text("before-message"))],
        after_messages=[text_message("system", text("after-message"))],
        tokens_before_by_category={text("category"): 100}, tokens_after_by_category={},
    )
    skill = make_skill(demo.conversation, round_, round_.started_at)
    SkillActivation.objects.filter(pk=skill.pk).update(
        skill_name=text("skill"), chain=[text("chain")], status=Status.ERROR,
        error_message=text("skill-error"))
    if demo.artifact is not None:
        Artifact.objects.filter(pk=demo.artifact.pk).update(mime=f"text/{text('mime')}",
                                                             summary=text("artifact-summary"))
        (artifact_dir / demo.artifact.artifact_id).write_text(text("artifact-content"))
    for record in (demo.conversation, *demo.rounds, *demo.llm_calls, *demo.tool_calls, demo.compression):
        record.refresh_from_db()
    if demo.artifact is not None:
        demo.artifact.refresh_from_db()
    return demo
