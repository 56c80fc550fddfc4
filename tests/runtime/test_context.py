"""The context window: message importance, categories, token accounting and provider validity."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from pipeline.runtime.context import (
    MessageImportance,
    category_of,
    importance_of,
    measure,
    needs_compression,
    pairing_problems,
    with_marker,
)
from pipeline.semconv import CONTEXT_CATEGORIES
from pipeline.runtime.skills import SkillMessage
from pipeline.tokens.counting import context_window, count_conversation_tokens, count_message_tokens

MODEL = "gpt-4o"


def call(call_id: str, name: str = "query_sales") -> AIMessage:
    return AIMessage("Let me check.", tool_calls=[{"id": call_id, "name": name, "args": {"sql": "SELECT 1"}}])


def test_importance_follows_the_design_document():
    assert importance_of(HumanMessage("What were Q3 sales?")) is MessageImportance.CRITICAL
    assert importance_of(ToolMessage("Operation failed.", tool_call_id="c1", status="error")) is MessageImportance.CRITICAL
    assert importance_of(ToolMessage("42 rows", tool_call_id="c1")) is MessageImportance.HIGH
    assert importance_of(AIMessage("I think the answer is...")) is MessageImportance.MEDIUM
    assert importance_of(SystemMessage("Be brief.")) is MessageImportance.LOW


def test_skill_messages_and_summaries_are_high_not_user_messages():
    skill = SkillMessage("sales-analysis", "instruction", "Use SQL.", False).to_message()
    assert category_of(skill) == "skills"
    assert importance_of(skill) is MessageImportance.HIGH
    summary = HumanMessage("[Summary]", additional_kwargs={"ctxlens": {"category": "compressed_summaries"}})
    assert category_of(summary) == "compressed_summaries" and importance_of(summary) is MessageImportance.HIGH


def test_a_marker_can_set_importance_and_with_marker_copies():
    original = AIMessage("plan")
    marked = with_marker(original, importance="critical")
    assert importance_of(marked) is MessageImportance.CRITICAL
    assert importance_of(original) is MessageImportance.MEDIUM
    assert importance_of(with_marker(original, importance=2)) is MessageImportance.HIGH
    assert importance_of(with_marker(original, importance="bogus")) is MessageImportance.MEDIUM


def test_categories_of_plain_messages():
    assert [category_of(m) for m in (SystemMessage("s"), HumanMessage("u"), AIMessage("a"), ToolMessage("t", tool_call_id="x"))] == [
        "system", "user", "assistant", "tool_observations"
    ]
    assert category_of(HumanMessage("u", additional_kwargs={"ctxlens": {"category": "free"}})) == "user"


def test_measure_accounts_every_token_by_category_and_the_rest_is_free():
    messages = [
        SystemMessage("You are a sales analyst."),
        HumanMessage("Revenue by region for Q3?"),
        SkillMessage("sales-analysis", "instruction", "Aggregate in SQL.", False).to_message(),
        call("c1"),
        ToolMessage("EMEA 1.2M, Americas 0.9M", tool_call_id="c1"),
        AIMessage("EMEA leads with 1.2M."),
    ]
    usage = measure(messages, MODEL, window=1000)
    assert list(usage.composition()) == list(CONTEXT_CATEGORIES)
    assert usage.tokens == count_conversation_tokens(messages, MODEL)
    assert usage.by_category["free"] == 1000 - usage.tokens
    assert usage.by_category["skills"] == count_message_tokens(messages[2], MODEL)
    assert usage.by_category["assistant"] == count_message_tokens(messages[3], MODEL) + count_message_tokens(messages[5], MODEL)
    assert usage.by_category["compressed_summaries"] == 0
    assert usage.ratio == usage.tokens / 1000


def test_measure_uses_the_models_window_by_default():
    assert measure([HumanMessage("hi")], "claude-3-5-sonnet").window == context_window("claude-3-5-sonnet")


def test_free_never_goes_negative_over_the_window():
    usage = measure([HumanMessage("word " * 500)], MODEL, window=100)
    assert usage.by_category["free"] == 0 and usage.ratio > 1


def test_compression_is_needed_above_the_configured_threshold(settings):
    usage = measure([HumanMessage("word " * 100)], MODEL, window=200)  # a bit over half full
    assert 0.5 < usage.ratio < 0.8
    assert not needs_compression(usage)
    settings.CTXLENS_COMPRESSION_THRESHOLD = 0.5
    assert needs_compression(usage)
    assert not needs_compression(usage, threshold=0.9)


def test_pairing_problems_accepts_a_valid_loop():
    messages = [HumanMessage("q"), call("c1"), ToolMessage("r", tool_call_id="c1"), AIMessage("done")]
    assert pairing_problems(messages) == []


def test_pairing_problems_finds_orphans_missing_answers_and_interleaving():
    assert "answers no open tool call" in pairing_problems([HumanMessage("q"), ToolMessage("r", tool_call_id="c1")])[0]
    assert "have no ToolMessage" in pairing_problems([HumanMessage("q"), call("c1")])[0]
    interleaved = [call("c1"), HumanMessage("q"), ToolMessage("r", tool_call_id="c1")]
    assert len(pairing_problems(interleaved)) == 2
    invalid = AIMessage("", invalid_tool_calls=[{"id": "bad", "name": "x", "args": "{", "error": "json"}])
    assert "have no ToolMessage" in pairing_problems([invalid])[0]
