"""Context compression: the seeds' rules (20 messages, 5 protected rounds, HIGH never compressed, TRUNCATE
keeps 5), the automatic choice and its costs, the background summary, the cost cap, and the invariants."""

from __future__ import annotations

import itertools
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine
from django.core.cache import cache
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from pipeline.runtime.compression import CompressionStrategy, ContextCompressor, group_units, round_numbers
from pipeline.runtime.context import MessageImportance, importance_of, marker, pairing_problems
from pipeline.runtime.skills import SkillMessage
from pipeline.runtime.summariser import Summariser
from pipeline.tokens.counting import (
    count_conversation_tokens,
    count_message_tokens,
    count_messages,
    register_exact_counter,
    unregister_exact_counter,
)

MODEL = "gpt-4o"
STRATEGIES = [CompressionStrategy.TRUNCATE, CompressionStrategy.EXTRACT, CompressionStrategy.SUMMARIZE]


class RecordingChatModel(BaseChatModel):
    """A LangChain chat model that answers with a fixed text and remembers what it was sent."""

    reply: str = "Summary: the user asked for Q1-Q5 figures; query_sales returned rows; no errors."
    calls: list = []
    gate: Any = None
    fail: bool = False

    @property
    def _llm_type(self) -> str:
        return "recording"

    def _generate(self, messages: list[BaseMessage], stop=None, run_manager=None, **kwargs: Any) -> ChatResult:
        self.calls.append(messages)
        if self.gate is not None:
            self.gate.wait(5)
        if self.fail:
            raise RuntimeError("provider down")
        return ChatResult(generations=[ChatGeneration(message=AIMessage(self.reply))])


@pytest.fixture(autouse=True)
def clear_cache():
    cache.clear()
    yield
    cache.clear()


def long_conversation(rounds: int = 10, rows: int = 2000) -> list[BaseMessage]:
    """A system prompt, then `rounds` rounds of 4 messages: question, tool call, observation, answer."""
    messages: list[BaseMessage] = [SystemMessage("You are a sales analyst.")]
    for r in range(rounds):
        messages += [
            HumanMessage(f"What were sales in period {r}?"),
            AIMessage("Let me query the table. " * 20, tool_calls=[{"id": f"call_{r}", "name": "query_sales", "args": {"period": r}}]),
            ToolMessage(f"region=EMEA revenue={r}00 " * rows, tool_call_id=f"call_{r}", name="query_sales"),
            AIMessage(f"Sales in period {r} were {r}00 in EMEA. " * 10),
        ]
    return messages


def fitting(messages: list[BaseMessage], share: float = 1.1) -> int:
    """A window the conversation fits in (over the threshold: compression has work to do)."""
    return int(count_conversation_tokens(messages, MODEL) * share)


def kept(message: BaseMessage, result) -> bool:
    return any(message is m for m in result.after)


def check_invariants(before: list[BaseMessage], result) -> None:
    after = result.after
    assert result.before == before
    assert pairing_problems(after) == [], pairing_problems(after)
    critical = [m for m in before if importance_of(m) is MessageImportance.CRITICAL]
    kept = iter(after)
    assert all(any(m is k for k in kept) for m in critical), "a CRITICAL message was dropped, changed or moved"
    assert count_conversation_tokens(after, MODEL) == result.tokens_after
    assert count_conversation_tokens(before, MODEL) == result.tokens_before
    assert result.tokens_after < result.tokens_before
    assert len(after) == result.usage_after.messages
    assert not set(result.dropped) & set(result.summarised)
    assert all(0 <= i < len(before) for i in [*result.dropped, *result.summarised])
    for message in after:  # every extract made now is smaller than the message it stands for
        if not any(message is m for m in before) and marker(message).get("compressed") == "extract":
            assert count_message_tokens(message, MODEL) < marker(message)["original_tokens"]


# ---- property tests -------------------------------------------------------------------------

text = st.builds(
    lambda word, n: " ".join([word] * n),
    st.sampled_from(["revenue", "EMEA", "12,345.67", "Ünïcödé", "SELECT * FROM sales", "\n"]),
    st.integers(0, 300),
)


@st.composite
def conversations(draw) -> list[BaseMessage]:
    ids = itertools.count()
    messages: list[BaseMessage] = []
    if draw(st.booleans()):
        messages.append(SystemMessage(draw(text)))
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["user", "answer", "tools", "tools", "skill", "notice", "summary"]))
        if kind == "user":
            messages.append(HumanMessage(draw(text)))
        elif kind == "answer":
            messages.append(AIMessage(draw(text)))
        elif kind == "tools":
            calls = [{"id": f"call_{next(ids)}", "name": "query_sales", "args": {"q": draw(text)[:50]}} for _ in range(draw(st.integers(1, 3)))]
            messages.append(AIMessage(draw(text), tool_calls=calls))
            for c in calls:
                status = draw(st.sampled_from(["success", "success", "error"]))
                messages.append(ToolMessage(draw(text), tool_call_id=c["id"], status=status))
        elif kind == "skill":
            messages.append(SkillMessage("sales-analysis", "instruction", draw(text), False).to_message())
        elif kind == "notice":
            messages.append(SystemMessage(draw(text)))
        else:
            messages.append(HumanMessage(draw(text), additional_kwargs={"ctxlens": {"category": "compressed_summaries"}}))
    return messages


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=conversations(), window=st.integers(50, 6000), protect=st.integers(0, 3), tail=st.integers(0, 6),
       strategy=st.sampled_from(STRATEGIES))
def test_compression_keeps_the_invariants_for_any_valid_conversation(messages, window, protect, tail, strategy):
    assert pairing_problems(messages) == []
    compressor = ContextCompressor(MODEL, window=window, threshold=0.8, min_messages=0, protect_rounds=protect,
                                   truncate_keep=tail)
    result = compressor.compress(messages, strategy)
    if result is None:
        return
    check_invariants(messages, result)
    rounds = round_numbers(messages)
    newest = group_units(messages)[-1]
    assert all(kept(messages[i], result) for i in newest), "the newest unit changed"
    if result.tokens_before > window:
        return  # over the whole window, the seeds' protections give way
    current = [m for m, r in zip(messages, rounds) if r == rounds[-1] and (r >= 0 or isinstance(m, SystemMessage))]
    assert all(kept(m, result) for m in current), "the current round changed"
    if strategy is CompressionStrategy.TRUNCATE:
        assert all(kept(m, result) for m in messages[len(messages) - tail:]), "one of the last messages changed"
    else:
        protected = [m for m, r in zip(messages, rounds) if r >= rounds[-1] - protect]
        assert all(kept(m, result) for m in protected), "a message of a protected round changed"
        high = [m for m in messages if importance_of(m) is MessageImportance.HIGH]
        assert all(kept(m, result) for m in high), "a HIGH message was compressed"


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=conversations(), window=st.integers(50, 6000), reply=text)
def test_swapping_in_a_background_summary_keeps_the_invariants(messages, window, reply):
    summariser = Summariser(RecordingChatModel(calls=[], reply=reply or "empty"), model=MODEL, max_cost_per_hour=1e9, cache=cache)
    compressor = ContextCompressor(MODEL, window=window, strategy="summarize", summariser=summariser, min_messages=0,
                                   protect_rounds=0)
    try:
        first = compressor.compress(messages)
        assert summariser.wait(5)
        applied = compressor.apply_summaries(first.after if first else messages)
    finally:
        summariser.close()
    if applied is not None:
        check_invariants(first.after, applied)


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=conversations())
def test_units_keep_every_tool_message_with_its_call(messages):
    for unit in group_units(messages):
        first = messages[unit[0]]
        ids = {c["id"] for c in getattr(first, "tool_calls", [])}
        assert {messages[i].tool_call_id for i in unit[1:]} == ids


# ---- strategies -----------------------------------------------------------------------------

def test_truncate_keeps_the_last_five_messages_and_removes_what_came_before():
    messages = long_conversation(rows=200)
    result = ContextCompressor(MODEL, window=fitting(messages)).compress(messages, "truncate")
    check_invariants(messages, result)
    assert result.strategy is CompressionStrategy.TRUNCATE and result.selection == "configured"
    # The last 5 messages are round 9's call, observation and answer and round 9's question … and
    # the 5th-last is round 8's answer; everything else but the system prompt and the questions goes.
    assert all(kept(m, result) for m in messages[-5:])
    users = [m for m in messages if isinstance(m, HumanMessage)]
    assert all(kept(m, result) for m in users) and result.after[0] is messages[0]
    assert result.dropped == [i for i in range(1, len(messages) - 5) if not isinstance(messages[i], HumanMessage)]
    notice = result.after[2]
    assert "earlier messages were removed" in notice.content and marker(notice)["category"] == "compressed_summaries"
    assert result.usage_after.by_category["compressed_summaries"] > 0


def test_truncate_keeps_a_tool_call_with_its_observation_and_the_current_round_whole():
    def call(*ids: str) -> list[BaseMessage]:
        ask = AIMessage("looking up", tool_calls=[{"id": i, "name": "query_sales", "args": {"q": i}} for i in ids])
        return [ask, *(ToolMessage(f"rows {i} " * 200, tool_call_id=i) for i in ids)]

    history = long_conversation(rounds=8, rows=200)
    # The 5th-last message is the observation `a`: its call (6th-last) and sibling stay with it.
    messages = [*history, HumanMessage("Compare A and B."), *call("a", "b"), HumanMessage("And E?"), *call("e")]
    result = ContextCompressor(MODEL, window=fitting(messages)).compress(messages, "truncate")
    check_invariants(messages, result)
    assert all(kept(m, result) for m in messages[len(history):])
    assert result.dropped == [i for i in range(1, len(history)) if not isinstance(messages[i], HumanMessage)]
    # A round in progress longer than 5 messages is kept whole: the model is working on its results.
    messages = [*history, HumanMessage("Compare A to E."), *call("a", "b"), *call("c"), *call("d", "e")]
    result = ContextCompressor(MODEL, window=fitting(messages)).compress(messages, "truncate")
    check_invariants(messages, result)
    assert len(messages) - len(history) == 9 and all(kept(m, result) for m in messages[len(history):])


def test_extract_never_compresses_tool_observations_or_the_current_and_last_five_rounds():
    messages = long_conversation(rows=200)  # 10 rounds: rounds 0-3 are old, 4-8 protected, 9 current
    result = ContextCompressor(MODEL, window=fitting(messages)).compress(messages, "extract")
    check_invariants(messages, result)
    old_thoughts = [1 + 4 * r + k for r in range(4) for k in (1, 3)]  # the tool call's text and the answer
    assert result.dropped == [] and result.summarised == old_thoughts
    assert all(kept(m, result) for m in messages if isinstance(m, ToolMessage))
    assert all(kept(m, result) for m in messages[1 + 4 * 4:])
    call = result.after[2]
    assert call.tool_calls == messages[2].tool_calls and "[extract of" in call.content


def test_a_conversation_over_the_window_gives_up_the_protections_oldest_first_but_not_the_newest_results():
    messages = long_conversation(rounds=6, rows=2000)  # 25 messages, all in protected rounds
    window = fitting(messages, 0.7)
    result = ContextCompressor(MODEL, window=window).compress(messages, "extract")
    check_invariants(messages, result)
    assert result.tokens_after <= window * 0.8
    assert any(isinstance(messages[i], ToolMessage) for i in result.summarised)  # observations extracted …
    assert min(result.summarised) == 2 and all(kept(m, result) for m in messages[-4:])  # … oldest first
    # A single round over the window: its older tool results give way, its newest one never.
    round_ = [HumanMessage("Read all five reports.")]
    for n in range(5):
        round_ += [AIMessage("", tool_calls=[{"id": f"r{n}", "name": "read", "args": {}}]),
                   ToolMessage(f"report {n} " * 3000, tool_call_id=f"r{n}")]
    result = ContextCompressor(MODEL, window=fitting(round_, 0.7)).compress(round_, "extract")
    check_invariants(round_, result)
    assert result.summarised[0] == 2 and kept(round_[-1], result) and kept(round_[-2], result)


def test_over_the_window_the_newest_tool_results_are_kept_even_when_skill_messages_follow_them():
    table = " ".join(f"row{i}=value{i}" for i in range(900))
    messages = [
        SystemMessage("You are a sales analyst."),
        HumanMessage("Q3 revenue by region? " + "context " * 900),
        AIMessage("", tool_calls=[{"id": "a1", "name": "activate_skill", "args": {"name": "sales"}},
                                  {"id": "q1", "name": "query_sales", "args": {"q": "q3"}}]),
        ToolMessage("Skill sales activated.", tool_call_id="a1", additional_kwargs={"ctxlens": {"category": "skills"}}),
        ToolMessage(table, tool_call_id="q1", name="query_sales"),
        SkillMessage("sales-analysis", "instruction", "Always cite the table.", False).to_message(),
        SkillMessage("sales-analysis", "permissions", "Tools: query_sales.", False).to_message(),
    ]
    result = ContextCompressor(MODEL, window=3500).compress(messages, "extract")
    assert result is None or all(kept(m, result) for m in messages[2:5])
    # With an older answer to give way, that goes and the newest results stay whole.
    older = [HumanMessage("Last year?"), AIMessage("Last year's figures were flat. " * 300)]
    longer = [messages[0], *older, *messages[1:]]
    result = ContextCompressor(MODEL, window=fitting(longer, 0.9)).compress(longer, "extract")
    check_invariants(longer, result)
    assert 2 in [*result.summarised, *result.dropped] and all(kept(m, result) for m in longer[4:7])


def test_under_twenty_messages_nothing_is_compressed_while_the_conversation_fits():
    messages = long_conversation(rounds=4, rows=300)  # 17 messages
    for strategy in STRATEGIES:
        assert ContextCompressor(MODEL, window=fitting(messages)).compress(messages, strategy) is None
    result = ContextCompressor(MODEL, window=fitting(messages, 0.8)).compress(messages, "extract")
    check_invariants(messages, result)  # over the window: the request would be refused


def test_an_errored_tool_call_is_kept_while_its_sibling_is_extracted():
    messages = [
        HumanMessage("q"),
        AIMessage("two calls", tool_calls=[{"id": "a", "name": "t", "args": {}}, {"id": "b", "name": "t", "args": {}}]),
        ToolMessage("x " * 3000, tool_call_id="a"),
        ToolMessage("Operation failed.\n\nError Type: timeout", tool_call_id="b", status="error"),
        AIMessage("retrying"),
        HumanMessage("again"),
    ]
    for strategy in STRATEGIES:
        result = ContextCompressor(MODEL, window=1500).compress(messages, strategy)
        if strategy is CompressionStrategy.TRUNCATE:
            assert result is None or 3 not in result.dropped
            continue
        check_invariants(messages, result)
        assert messages[3] in result.after and 2 in result.summarised


def test_nothing_to_compress_returns_none():
    only_users = [HumanMessage("word " * 500) for _ in range(25)]
    for strategy in STRATEGIES:
        assert ContextCompressor(MODEL, window=100).compress(only_users, strategy) is None


def test_prepare_compresses_only_above_the_threshold():
    messages = long_conversation(rounds=2, rows=10)
    compressor = ContextCompressor(MODEL, window=100_000)
    assert compressor.prepare(messages) == (messages, [])
    small = ContextCompressor(MODEL, window=count_conversation_tokens(messages, MODEL) // 2)
    after, results = small.prepare(messages)
    assert len(results) == 1 and after is results[0].after


# ---- the automatic choice and its costs -------------------------------------------------------

def test_auto_extracts_below_the_llm_threshold_and_records_every_strategys_cost():
    summariser = Summariser(RecordingChatModel(calls=[]), model=MODEL, cache=cache)
    for rounds, reason in ((7, "29 messages, under 30"), (12, "49 messages, under the LLM threshold of 50")):
        messages = long_conversation(rounds=rounds, rows=100)
        result = ContextCompressor(MODEL, window=fitting(messages), summariser=summariser).compress(messages)
        assert result.strategy is CompressionStrategy.EXTRACT and result.selection == f"auto: {reason}"
        tokens = result.tokens_before
        assert result.estimated_costs == {
            "truncate": 0.0, "extract": round(tokens / 1000 * 0.001, 6), "summarize": round(tokens / 1000 * 0.003, 6)}
    summariser.close()


def test_auto_summarizes_from_fifty_messages_when_the_hours_budget_allows():
    messages = long_conversation(rounds=13, rows=100)  # 53 messages
    summariser = Summariser(RecordingChatModel(calls=[]), model=MODEL, cost_per_1k_tokens=0.01, max_cost_per_hour=1.0,
                            cache=cache)
    result = ContextCompressor(MODEL, window=fitting(messages), summariser=summariser).compress(messages)
    check_invariants(messages, result)
    assert result.strategy is CompressionStrategy.SUMMARIZE and result.summary_status == "scheduled"
    assert result.selection.startswith("auto: 53 messages ≥ 50")
    assert result.estimated_costs["summarize"] == round(result.tokens_before / 1000 * 0.01, 6)  # the summariser's rate
    summariser.wait(5)
    summariser.close()


def test_auto_falls_back_to_extract_when_the_summary_would_break_the_hours_budget():
    messages = long_conversation(rounds=13, rows=100)
    summariser = Summariser(RecordingChatModel(calls=[]), model=MODEL, max_cost_per_hour=0.001, cache=cache)
    result = ContextCompressor(MODEL, window=fitting(messages), summariser=summariser).compress(messages)
    assert result.strategy is CompressionStrategy.EXTRACT and "over the $0.0010 left" in result.selection
    no_llm = ContextCompressor(MODEL, window=fitting(messages)).compress(messages)
    assert no_llm.strategy is CompressionStrategy.EXTRACT and no_llm.selection == "auto: no summariser configured"
    summariser.close()


# ---- summarize ------------------------------------------------------------------------------

def test_summarize_extracts_now_and_uses_the_background_summary_from_the_next_round():
    model = RecordingChatModel(calls=[])
    summariser = Summariser(model, model=MODEL, cache=cache)
    messages = long_conversation(rows=200)
    compressor = ContextCompressor(MODEL, window=fitting(messages), strategy="summarize", summariser=summariser)

    first = compressor.compress(messages)
    check_invariants(messages, first)
    assert first.strategy is CompressionStrategy.SUMMARIZE and first.summary_status == "scheduled"
    marked = [m for m in first.after if marker(m).get("summary_key")]
    assert marked and all(importance_of(m) is not MessageImportance.CRITICAL for m in marked)
    assert summariser.wait(5)
    transcript = model.calls[0][1].content
    assert "Sales in period 0 were 000 in EMEA. Sales" in transcript  # the originals, not the extracts
    assert "region=EMEA" not in transcript  # observations are HIGH: never summarised
    key = marker(marked[0])["summary_key"]
    assert cache.get(f"ctxlens:summary:{key}") == model.reply

    after, results = compressor.prepare(first.after, round_start=True)
    [applied] = results
    check_invariants(first.after, applied)
    assert applied.summary_status == "applied" and model.reply in applied.summary
    assert not any(marker(m).get("summary_key") for m in after)
    [summary] = [m for m in after if marker(m).get("summary_of") == key]
    assert summary.content.startswith(f"[Summary of {len(marked)} earlier messages]")
    assert applied.usage_after.by_category["compressed_summaries"] > 0
    summariser.close()


def test_a_summary_of_answers_from_several_rounds_follows_the_questions_they_answer():
    summariser = Summariser(RecordingChatModel(calls=[], reply="A1: Paris. A2: 42."), model=MODEL, cache=cache)
    messages: list[BaseMessage] = [SystemMessage("sys")]
    for n, question in enumerate(["Capital of France?", "Answer to everything?", "Colour of the sky?"], 1):
        messages += [HumanMessage(f"U{n}: {question}"), AIMessage(f"A{n}: " + "detail " * 400)]
    for n in range(4, 7):
        messages += [HumanMessage(f"U{n}: q"), AIMessage(f"A{n}: short")]
    messages.append(HumanMessage("U7: now?"))
    compressor = ContextCompressor(MODEL, window=1500, strategy="summarize", summariser=summariser,
                                   min_messages=0, protect_rounds=3)
    first = compressor.compress(messages)
    assert len(first.summarised) >= 2 and summariser.wait(5)  # answers of rounds 1 and 2, one summary
    after, [applied] = compressor.prepare(first.after, round_start=True)
    check_invariants(first.after, applied)
    [at] = [i for i, m in enumerate(after) if marker(m).get("summary_of")]
    questions = [str(m.content)[:2] for m in after[:at] if importance_of(m) is MessageImportance.CRITICAL]
    answered = [f"U{str(messages[i].content)[1]}" for i in first.summarised]
    assert set(answered) <= set(questions), f"the summary of {answered} comes before its questions: {questions}"
    summariser.close()


def test_a_summary_longer_than_the_extracts_it_replaces_is_cut_to_fit():
    model = RecordingChatModel(calls=[], reply="The analyst asked about EMEA sales by period. " * 300)
    summariser = Summariser(model, model=MODEL, cache=cache)
    messages = long_conversation(rows=200)
    compressor = ContextCompressor(MODEL, window=fitting(messages), strategy="summarize", summariser=summariser)
    first = compressor.compress(messages)
    assert summariser.wait(5)
    applied = compressor.apply_summaries(first.after)
    check_invariants(first.after, applied)
    assert applied.summary.endswith(" …") and len(applied.summary) < len(model.reply)
    summariser.close()


def test_a_summary_is_asked_for_once_while_pending():
    gate = threading.Event()
    model = RecordingChatModel(calls=[], gate=gate)
    summariser = Summariser(model, model=MODEL, cache=cache)
    messages = [HumanMessage("a"), AIMessage("b")]
    assert summariser.request("k1", messages) == "scheduled"
    assert summariser.request("k1", messages) == "pending"
    assert summariser.spent_this_hour() == pytest.approx(summariser.estimate_cost(messages), rel=0.01)  # paid once
    gate.set()
    assert summariser.wait(5)
    assert summariser.request("k1", messages) == "cached"
    assert len(model.calls) == 1
    summariser.close()


def test_a_summary_over_the_cost_cap_can_be_asked_for_again_next_hour():
    model = RecordingChatModel(calls=[])
    summariser = Summariser(model, model=MODEL, max_cost_per_hour=0.0, cache=cache)
    with time_machine.travel(datetime(2026, 3, 1, 10, 15, tzinfo=UTC), tick=False) as traveller:
        assert summariser.request("k3", [HumanMessage("a")]) == "cost_cap"
        summariser.max_cost_per_hour = 1.0
        traveller.shift(timedelta(hours=1))
        assert summariser.request("k3", [HumanMessage("a")]) == "scheduled"  # not stuck as pending
        assert summariser.wait(5) and summariser.cached("k3") == model.reply
    summariser.close()


def test_a_failed_summary_leaves_the_extracts_and_can_be_asked_again():
    model = RecordingChatModel(calls=[], fail=True)
    summariser = Summariser(model, model=MODEL, cache=cache)
    assert summariser.request("k2", [HumanMessage("a")]) == "scheduled"
    assert summariser.wait(5)
    assert summariser.cached("k2") is None
    model.fail = False
    assert summariser.request("k2", [HumanMessage("a")]) == "scheduled"
    summariser.wait(5)
    assert summariser.cached("k2") == model.reply
    summariser.close()


def test_the_hourly_cost_cap_stops_summaries_until_the_next_hour():
    model = RecordingChatModel(calls=[])
    big = [HumanMessage("revenue " * 200)]
    one = Summariser(model, model=MODEL, cache=cache).estimate_cost(big)
    summariser = Summariser(model, model=MODEL, max_cost_per_hour=one * 1.5, cache=cache)
    with time_machine.travel(datetime(2026, 3, 1, 10, 15, tzinfo=UTC), tick=False) as traveller:
        assert summariser.request("c1", big) == "scheduled"
        assert summariser.request("c2", big) == "cost_cap"
        assert summariser.spent_this_hour() == pytest.approx(one, rel=0.01)
        traveller.shift(timedelta(hours=1))
        assert summariser.spent_this_hour() == 0
        assert summariser.request("c3", big) == "scheduled"
    summariser.wait(5)
    assert len(model.calls) == 2
    summariser.close()


def test_summarize_over_the_cost_cap_still_extracts():
    summariser = Summariser(RecordingChatModel(calls=[]), model=MODEL, max_cost_per_hour=0.0, cache=cache)
    messages = long_conversation(rows=200)
    result = ContextCompressor(MODEL, window=fitting(messages), strategy="summarize", summariser=summariser).compress(messages)
    check_invariants(messages, result)
    assert result.summary_status == "cost_cap" and result.summarised


# ---- a provider's exact count --------------------------------------------------------------

class HeavierTokenizerAPI:
    """A provider's count-tokens endpoint whose tokenizer yields 1.6 × what ours counts."""

    def count_tokens(self, messages, model):
        return int(count_messages(messages, model, exact=False).tokens * 1.6)


@pytest.fixture
def exact_claude():
    register_exact_counter("claude-sonnet-4*", HeavierTokenizerAPI())
    yield "claude-sonnet-4-5"
    unregister_exact_counter("claude-sonnet-4*")


def test_the_providers_exact_count_decides_and_drives_the_compression(exact_claude):
    messages = long_conversation(rounds=4, rows=300)
    window = int(count_messages(messages, exact_claude, exact=False).tokens * 1.4)  # fits by our count only
    compressor = ContextCompressor(exact_claude, window=window)
    assert compressor.needs_compression(compressor.usage(messages))
    after, [result] = compressor.prepare(messages)
    assert result.tokens_before == count_conversation_tokens(messages, exact_claude)  # the provider's count
    assert pairing_problems(after) == []
    assert count_conversation_tokens(after, exact_claude) <= window * compressor.threshold
    assert not compressor.needs_compression(compressor.usage(after))


def test_counts_scaled_to_a_providers_total_stay_whole_and_non_negative():
    """Scaled down across hundreds of short messages: the rounding drift all on the largest made
    it negative (-110 tokens here), and dropping it then made the running total grow."""
    from pipeline.runtime.context import count_on_measure_scale

    class LighterTokenizerAPI:
        def count_tokens(self, messages, model):
            return int(count_messages(messages, model, exact=False).tokens * 0.6)

    register_exact_counter("claude-haiku-4*", LighterTokenizerAPI())
    try:
        messages = [HumanMessage(content="ok") for _ in range(300)] + [HumanMessage(content="a longer message " * 3)]
        counted = count_on_measure_scale(messages, "claude-haiku-4-5")
    finally:
        unregister_exact_counter("claude-haiku-4*")

    assert counted.factor < 1 and sum(counted.per_message) == int(count_messages(messages, "claude-haiku-4-5", exact=False).tokens * 0.6)
    assert min(counted.per_message) >= 0
    assert counted.per_message[-1] > max(counted.per_message[:-1])
