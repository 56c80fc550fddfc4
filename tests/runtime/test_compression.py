"""Context compression: the three strategies, the background summary, the cost cap, and the invariants."""

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

from pipeline.runtime.compression import CompressionStrategy, ContextCompressor, group_units
from pipeline.runtime.context import MessageImportance, importance_of, marker, pairing_problems
from pipeline.runtime.skills import SkillMessage
from pipeline.runtime.summariser import Summariser
from pipeline.tokens.counting import count_conversation_tokens, count_message_tokens

MODEL = "gpt-4o"
STRATEGIES = list(CompressionStrategy)


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


def long_conversation(rounds: int = 6, rows: int = 2000) -> list[BaseMessage]:
    messages: list[BaseMessage] = [SystemMessage("You are a sales analyst.")]
    for r in range(rounds):
        messages += [
            HumanMessage(f"What were sales in period {r}?"),
            AIMessage("Let me query the table. " * 20, tool_calls=[{"id": f"call_{r}", "name": "query_sales", "args": {"period": r}}]),
            ToolMessage(f"region=EMEA revenue={r}00 " * rows, tool_call_id=f"call_{r}", name="query_sales"),
            AIMessage(f"Sales in period {r} were {r}00 in EMEA. " * 10),
        ]
    return messages


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


@hsettings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=conversations(), window=st.integers(50, 6000), keep_last=st.integers(0, 3), strategy=st.sampled_from(STRATEGIES))
def test_compression_keeps_the_invariants_for_any_valid_conversation(messages, window, keep_last, strategy):
    assert pairing_problems(messages) == []
    compressor = ContextCompressor(MODEL, window=window, threshold=0.8, keep_last=keep_last)
    result = compressor.compress(messages, strategy)
    if result is None:
        return
    check_invariants(messages, result)
    units = group_units(messages)
    newest = [i for unit in units[max(len(units) - keep_last, 0):] for i in unit]
    assert all(any(messages[i] is m for m in result.after) for i in newest), "one of the newest units changed"


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=conversations(), window=st.integers(50, 6000), reply=text)
def test_swapping_in_a_background_summary_keeps_the_invariants(messages, window, reply):
    summariser = Summariser(RecordingChatModel(calls=[], reply=reply or "empty"), model=MODEL, max_cost_per_hour=1e9, cache=cache)
    compressor = ContextCompressor(MODEL, window=window, strategy="summarize", summariser=summariser, keep_last=1)
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

def test_truncate_drops_the_oldest_units_whole_and_leaves_a_notice():
    messages = long_conversation()
    compressor = ContextCompressor(MODEL, window=30_000)
    result = compressor.compress(messages, "truncate")
    check_invariants(messages, result)
    assert result.strategy is CompressionStrategy.TRUNCATE
    assert result.dropped[:2] == [2, 3]  # the first call and its observation, together
    assert result.after[0] is messages[0] and result.after[1] is messages[1]  # system prompt and user kept
    notice = result.after[2]
    assert "earlier messages were removed" in notice.content and marker(notice)["category"] == "compressed_summaries"
    assert result.tokens_after <= compressor.target < result.tokens_before
    assert result.usage_after.by_category["compressed_summaries"] > 0


def test_extract_shortens_old_messages_and_keeps_their_tool_calls():
    messages = long_conversation()
    result = ContextCompressor(MODEL, window=30_000).compress(messages, "extract")
    check_invariants(messages, result)
    assert result.dropped == [] and result.summarised[:3] == [2, 3, 4]
    call, observation = result.after[2], result.after[3]
    assert call.tool_calls == messages[2].tool_calls
    assert observation.tool_call_id == "call_0" and observation.name == "query_sales"
    assert "[extract of" in observation.content and len(observation.content) < 300
    assert marker(observation)["original_tokens"] > 1000
    assert result.usage_before.by_category["tool_observations"] > result.usage_after.by_category["tool_observations"]


def test_extract_falls_back_to_dropping_when_extracts_are_not_enough():
    messages = long_conversation(rounds=8, rows=30)
    result = ContextCompressor(MODEL, window=900, keep_last=1).compress(messages, "extract")
    check_invariants(messages, result)
    assert result.dropped and result.summarised


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
        result = ContextCompressor(MODEL, window=1500, keep_last=1).compress(messages, strategy)
        if strategy is CompressionStrategy.TRUNCATE:
            assert result is None or 3 not in result.dropped
            continue
        check_invariants(messages, result)
        assert messages[3] in result.after and 2 in result.summarised


def test_nothing_to_compress_returns_none():
    only_users = [HumanMessage("word " * 500) for _ in range(5)]
    for strategy in STRATEGIES:
        assert ContextCompressor(MODEL, window=100).compress(only_users, strategy) is None


def test_prepare_compresses_only_above_the_threshold():
    messages = long_conversation(rounds=2, rows=10)
    compressor = ContextCompressor(MODEL, window=100_000)
    assert compressor.prepare(messages) == (messages, [])
    small = ContextCompressor(MODEL, window=count_conversation_tokens(messages, MODEL) // 2)
    after, results = small.prepare(messages)
    assert len(results) == 1 and after is results[0].after


# ---- summarize ------------------------------------------------------------------------------

def test_summarize_extracts_now_and_uses_the_background_summary_from_the_next_round():
    model = RecordingChatModel(calls=[])
    summariser = Summariser(model, model=MODEL, cache=cache)
    compressor = ContextCompressor(MODEL, window=30_000, strategy="summarize", summariser=summariser)
    messages = long_conversation()

    first = compressor.compress(messages)
    check_invariants(messages, first)
    assert first.strategy is CompressionStrategy.SUMMARIZE and first.summary_status == "scheduled"
    marked = [m for m in first.after if marker(m).get("summary_key")]
    assert marked and all(importance_of(m) is not MessageImportance.CRITICAL for m in marked)
    assert summariser.wait(5)
    transcript = model.calls[0][1].content
    assert "region=EMEA revenue=000" in transcript  # the originals, not the extracts
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


def test_a_summary_longer_than_the_extracts_it_replaces_is_cut_to_fit():
    model = RecordingChatModel(calls=[], reply="The analyst asked about EMEA sales by period. " * 300)
    summariser = Summariser(model, model=MODEL, cache=cache)
    compressor = ContextCompressor(MODEL, window=30_000, strategy="summarize", summariser=summariser)
    first = compressor.compress(long_conversation())
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
    messages = long_conversation()
    result = ContextCompressor(MODEL, window=30_000, strategy="summarize", summariser=summariser).compress(messages)
    check_invariants(messages, result)
    assert result.summary_status == "cost_cap" and result.summarised
