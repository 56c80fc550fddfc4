"""diff_inputs on the digests ingest stores: which messages a call kept, added, removed or changed.

The digests are those of real messages (pipeline.ingest.normalise.digest.message_digest of the
GenAI parts shape ingest stores); each text is a multiple of 4 bytes and each call's input
tokens its bytes / 4, so every message's share is exactly its bytes / 4.
"""

from __future__ import annotations

from pipeline.ingest.normalise.digest import message_digest
from pipeline.insight.diff import CallInput, diff_inputs


def text(role: str, label: str, size: int) -> dict:
    return {"role": role, "parts": [{"type": "text", "content": label + "." * (size - len(label))}]}


def tool_result(call_id: str, label: str, size: int) -> dict:
    return {"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id,
                                        "response": label + "." * (size - len(label))}]}


SYSTEM = text("system", "You are terse.", 400)  # 100 tokens
ASK = text("user", "Weather?", 80)  # 20
ANSWER = text("assistant", "Sunny.", 40)  # 10
RESULT = tool_result("call_1", "Sunny, 21 C", 800)  # 200
AGAIN = text("user", "Tomorrow?", 80)  # 20


def call(id_: int, *messages: dict) -> CallInput:
    digest = message_digest(list(messages))
    return CallInput(id_, digest, sum(entry["bytes"] for entry in digest) // 4)


def test_the_first_call_adds_everything_it_sends():
    assert diff_inputs(None, call(1, SYSTEM, ASK)) == {
        "previous_call_id": None, "kept_prefix_messages": 0, "kept_prefix_tokens": 0,
        "added": [{"index": 0, "role": "system", "category": "system", "tokens": 100},
                  {"index": 1, "role": "user", "category": "user", "tokens": 20}],
        "removed": [], "changed": [], "token_delta": 120, "token_delta_by_category": {"system": 100, "user": 20},
        "cache_break": False, "cache_break_reason": None, "uncacheable_tokens": 0,
    }


def test_an_appended_input_keeps_the_whole_previous_input_as_its_prefix():
    diff = diff_inputs(call(1, SYSTEM, ASK), call(2, SYSTEM, ASK, RESULT, ANSWER))

    assert (diff["kept_prefix_messages"], diff["kept_prefix_tokens"]) == (2, 120)
    assert diff["added"] == [{"index": 2, "role": "tool", "category": "tool_observations", "tokens": 200},
                             {"index": 3, "role": "assistant", "category": "assistant", "tokens": 10}]
    assert (diff["removed"], diff["changed"]) == ([], [])
    assert diff["token_delta"] == 210
    assert diff["token_delta_by_category"] == {"assistant": 10, "tool_observations": 200}
    assert (diff["cache_break"], diff["cache_break_reason"], diff["uncacheable_tokens"]) == (False, None, 0)


def test_an_edit_in_the_middle_breaks_the_prefix_and_leaves_what_follows_uncacheable():
    shorter = tool_result("call_1", "[elided]", 40)  # 10 tokens
    diff = diff_inputs(call(1, SYSTEM, ASK, RESULT, ANSWER), call(2, SYSTEM, ASK, shorter, ANSWER, AGAIN))

    assert (diff["kept_prefix_messages"], diff["kept_prefix_tokens"]) == (2, 120)
    assert diff["changed"] == [{"index": 2, "role": "tool", "category": "tool_observations", "tokens": 10,
                                "previous_index": 2, "previous_tokens": 200}]
    assert diff["added"] == [{"index": 4, "role": "user", "category": "user", "tokens": 20}]
    assert diff["removed"] == []
    assert diff["token_delta"] == 160 - 330
    assert diff["token_delta_by_category"] == {"tool_observations": -190, "user": 20}
    assert (diff["cache_break"], diff["cache_break_reason"]) == (True, "edit")
    assert diff["uncacheable_tokens"] == 10  # ANSWER: kept, but past the break


def test_a_compression_between_the_calls_is_the_reason_of_the_break():
    summary = text("user", "Summary: it was sunny.", 40)
    diff = diff_inputs(call(1, SYSTEM, ASK, RESULT, ANSWER), call(2, SYSTEM, summary, ANSWER, AGAIN),
                       compressed_between=True)

    assert diff["kept_prefix_messages"] == 1
    assert diff["changed"] == [{"index": 1, "role": "user", "category": "user", "tokens": 10,
                                "previous_index": 1, "previous_tokens": 20}]
    assert diff["removed"] == [{"index": 2, "role": "tool", "category": "tool_observations", "tokens": 200}]
    assert diff["added"] == [{"index": 3, "role": "user", "category": "user", "tokens": 20}]
    assert diff["token_delta_by_category"] == {"tool_observations": -200, "user": 10}
    assert (diff["cache_break"], diff["cache_break_reason"], diff["uncacheable_tokens"]) == (True, "compression", 10)


def test_a_changed_system_prompt_keeps_no_prefix():
    other = text("system", "You are verbose.", 400)
    diff = diff_inputs(call(1, SYSTEM, ASK), call(2, other, ASK, ANSWER))

    assert (diff["kept_prefix_messages"], diff["kept_prefix_tokens"]) == (0, 0)
    assert diff["changed"] == [{"index": 0, "role": "system", "category": "system", "tokens": 100,
                                "previous_index": 0, "previous_tokens": 100}]
    assert diff["added"] == [{"index": 2, "role": "assistant", "category": "assistant", "tokens": 10}]
    assert diff["token_delta_by_category"] == {"assistant": 10}  # the system prompt's size did not change
    assert (diff["cache_break"], diff["cache_break_reason"], diff["uncacheable_tokens"]) == (True, "edit", 20)


def test_a_tool_result_answering_another_call_is_a_different_message():
    # Same text, another tool_call_id: the model reads it as another call's answer.
    other = tool_result("call_2", "Sunny, 21 C", 800)
    diff = diff_inputs(call(1, SYSTEM, RESULT), call(2, SYSTEM, other))

    assert diff["kept_prefix_messages"] == 1
    assert [item["index"] for item in diff["changed"]] == [1]
    assert diff["cache_break"] is True


def test_a_call_without_recorded_input_lists_no_changes_and_claims_no_break():
    diff = diff_inputs(call(1, SYSTEM, ASK), CallInput(2, [], 150))

    assert diff == {
        "previous_call_id": 1, "kept_prefix_messages": 0, "kept_prefix_tokens": 0, "added": [], "removed": [],
        "changed": [], "token_delta": 30, "token_delta_by_category": {}, "cache_break": False,
        "cache_break_reason": None, "uncacheable_tokens": 0,
    }


def test_the_same_input_sent_again_changes_nothing():
    diff = diff_inputs(call(1, SYSTEM, ASK), call(2, SYSTEM, ASK))

    assert (diff["kept_prefix_messages"], diff["kept_prefix_tokens"], diff["token_delta"]) == (2, 120, 0)
    assert (diff["added"], diff["removed"], diff["changed"], diff["token_delta_by_category"]) == ([], [], [], {})
    assert diff["cache_break"] is False
