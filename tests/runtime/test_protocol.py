"""The tool protocol: output levels, requests from AIMessage.tool_calls, results as ToolMessages."""

from __future__ import annotations

import json

import pytest
from django.core.checks import run_checks
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from pipeline.runtime.observations import OutputLevel, effective_level, format_artifact_observation, format_observation, summarize
from pipeline.runtime.protocol import (
    CachePolicy,
    ContextModifier,
    MissingToolCallId,
    ToolError,
    ToolErrorClass,
    ToolErrorType,
    ToolExecutionResult,
    ToolInvocationRequest,
    canonical_error_type,
    classify_exception,
    format_error_observation,
)

ROWS = [{"id": i, "name": f"customer {i}"} for i in range(10)]


def test_brief_says_only_how_many_items():
    assert format_observation(ROWS, OutputLevel.BRIEF) == "Found 10 items"


def test_brief_reports_success_flag_of_a_dict():
    assert format_observation({"success": False, "message": "no rows"}, OutputLevel.BRIEF) == "Failed: no rows"


def test_standard_shows_first_three_items_and_the_rest_as_a_count():
    text = format_observation(ROWS, OutputLevel.STANDARD)
    lines = text.splitlines()
    assert lines[0] == "Found 10 items:"
    assert json.loads(lines[1].removeprefix("  - ")) == ROWS[0]
    assert len(lines) == 5
    assert lines[-1] == "  ... and 7 more"


def test_standard_clips_long_text_and_says_how_much_is_missing():
    text = format_observation("x" * 1200, OutputLevel.STANDARD)
    assert text.startswith("x" * 500)
    assert text.endswith("[700 more characters]")


def test_full_is_the_complete_json():
    assert json.loads(format_observation(ROWS, OutputLevel.FULL)) == ROWS


def test_strings_at_full_are_unchanged():
    assert format_observation("plain answer", OutputLevel.FULL) == "plain answer"


def test_summary_names_the_item_keys():
    assert summarize(ROWS) == "List with 10 items. First item keys: ['id', 'name']"


def test_artifact_observation_names_the_id_and_summary_only():
    text = format_artifact_observation("artifact_" + "a" * 32, "List with 10 items.")
    assert "artifact_" + "a" * 32 in text
    assert text.endswith("Data summary: List with 10 items.")
    assert "/" not in text


def test_output_level_parses_names_in_any_case_and_rejects_others():
    assert OutputLevel.parse("FULL") is OutputLevel.FULL
    with pytest.raises(ValueError, match="unknown output level"):
        OutputLevel.parse("verbose")


def test_explicit_level_wins_over_everything(settings):
    settings.CTXLENS_TOOL_OUTPUT_LEVELS = {"query_sales": "brief"}
    assert effective_level("full", "query_sales", context_usage=0.95) is OutputLevel.FULL


def test_tool_default_from_settings_wins_over_context_pressure(settings):
    settings.CTXLENS_TOOL_OUTPUT_LEVELS = {"query_sales": "full"}
    assert effective_level(None, "query_sales", context_usage=0.95) is OutputLevel.FULL


def test_context_usage_above_80_percent_forces_brief(settings):
    settings.CTXLENS_DEFAULT_OUTPUT_LEVEL = "standard"
    assert effective_level(None, "web_search", context_usage=0.81) is OutputLevel.BRIEF
    assert effective_level(None, "web_search", context_usage=0.80) is OutputLevel.STANDARD


def test_global_default_applies_last(settings):
    settings.CTXLENS_DEFAULT_OUTPUT_LEVEL = "full"
    settings.CTXLENS_TOOL_OUTPUT_LEVELS = {}
    assert effective_level(None, "web_search", context_usage=0.1) is OutputLevel.FULL


def test_bad_output_level_settings_fail_the_system_checks(settings):
    settings.CTXLENS_DEFAULT_OUTPUT_LEVEL = "loud"
    settings.CTXLENS_TOOL_OUTPUT_LEVELS = {"web_search": "verbose"}
    ids = {message.id for message in run_checks()}
    assert {"pipeline.E031", "pipeline.E032"} <= ids


def test_tool_output_levels_are_read_from_the_environment(monkeypatch):
    from config.env import env_dict

    monkeypatch.setenv("CTXLENS_TOOL_OUTPUT_LEVELS", "query_sales=brief, web_search=full")
    assert env_dict("CTXLENS_TOOL_OUTPUT_LEVELS", {}) == {"query_sales": "brief", "web_search": "full"}
    monkeypatch.setenv("CTXLENS_TOOL_OUTPUT_LEVELS", "query_sales")
    with pytest.raises(Exception, match="key=value"):
        env_dict("CTXLENS_TOOL_OUTPUT_LEVELS", {})


def ai_message_with_calls() -> AIMessage:
    return AIMessage(
        content="",
        tool_calls=[
            {"id": "call_abc123", "name": "web_search", "args": {"query": "q3 revenue", "limit": 5}},
            {"id": "call_def456", "name": "calculator", "args": {"expression": "2+2"}},
        ],
    )


def test_request_takes_the_id_name_and_args_from_the_model():
    call = ai_message_with_calls().tool_calls[1]
    request = ToolInvocationRequest.from_tool_call(call, caller_id="analyst", cache_policy=CachePolicy.SHORT)
    assert (request.tool_call_id, request.tool_name, request.parameters) == (
        "call_def456",
        "calculator",
        {"expression": "2+2"},
    )
    assert request.caller_id == "analyst"
    assert request.cache_policy is CachePolicy.SHORT
    assert request.output_level is None


def test_a_tool_call_without_id_is_refused_not_given_an_invented_one():
    with pytest.raises(MissingToolCallId):
        ToolInvocationRequest.from_tool_call({"name": "web_search", "args": {}})
    with pytest.raises(MissingToolCallId):
        ToolInvocationRequest.from_tool_call({"id": None, "name": "web_search", "args": {}})
    with pytest.raises(MissingToolCallId):
        ToolInvocationRequest(tool_call_id="", tool_name="web_search", parameters={})


def test_idempotency_key_ignores_the_call_id_and_argument_order():
    first = ToolInvocationRequest.from_tool_call({"id": "call_1", "name": "t", "args": {"a": 1, "b": [1, 2]}})
    later = ToolInvocationRequest.from_tool_call({"id": "call_2", "name": "t", "args": {"b": [1, 2], "a": 1}})
    assert first.idempotency_key == later.idempotency_key
    assert len(first.idempotency_key) == 64


@pytest.mark.parametrize(
    "change",
    [
        {"tool_name": "other"},
        {"tool_version": "2.0.0"},
        {"parameters": {"a": 2, "b": [1, 2]}},
        {"caller_id": "skill:report"},
        {"permission_level": "admin"},
    ],
)
def test_idempotency_key_changes_with_each_identity_part(change):
    base = dict(tool_call_id="call_1", tool_name="t", parameters={"a": 1, "b": [1, 2]})
    assert ToolInvocationRequest(**base).idempotency_key != ToolInvocationRequest(**{**base, **change}).idempotency_key


def test_cache_policies_have_the_documented_ttls():
    assert CachePolicy.NO_CACHE.ttl_seconds is None
    assert [CachePolicy.SHORT.ttl_seconds, CachePolicy.MEDIUM.ttl_seconds, CachePolicy.LONG.ttl_seconds] == [
        300,
        3600,
        86400,
    ]
    assert ToolInvocationRequest(tool_call_id="c", tool_name="t", parameters={}).cache_policy is CachePolicy.NO_CACHE


def test_error_types_keep_the_design_documents_names_and_three_classes():
    by_class = {c: {t.value for t in ToolErrorType if t.error_class is c} for c in ToolErrorClass}
    assert by_class == {
        ToolErrorClass.RETRYABLE: {"timeout", "rate_limit", "resource_error", "transient_error", "network"},
        ToolErrorClass.PERMANENT: {"permission_denied", "invalid_parameters", "not_found", "validation_error",
                                   "input_too_large"},
        ToolErrorClass.NEEDS_HUMAN: {"execution_error", "internal_error", "dependency_error"},
    }
    assert [t for t in ToolErrorType if t.is_retryable] == [t for t in ToolErrorType if t.error_class == "retryable"]
    assert ToolErrorType.DEPENDENCY_ERROR.needs_human and not ToolErrorType.DEPENDENCY_ERROR.is_permanent


@pytest.mark.parametrize(
    ("old", "new"),
    [("rate_limited", "rate_limit"), ("transient", "transient_error"), ("resource_unavailable", "resource_error"),
     ("invalid_input", "invalid_parameters"), ("internal", "internal_error")],
)
def test_earlier_error_type_names_still_read(old, new):
    assert ToolErrorType(old).value == new
    assert canonical_error_type(old) == new
    cached = ToolExecutionResult.failure("call_1", "t", ToolErrorType.TIMEOUT, "x").to_dict() | {"error_type": old}
    assert ToolExecutionResult.from_dict(cached).error_type.value == new


def test_unknown_error_type_names_are_kept_as_they_are():
    assert ToolErrorType.parse("ValueError") is None
    assert canonical_error_type("ValueError") == "ValueError"


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ToolError(ToolErrorType.RATE_LIMITED, "slow down"), ToolErrorType.RATE_LIMITED),
        (TimeoutError(), ToolErrorType.TIMEOUT),
        (ConnectionResetError(), ToolErrorType.NETWORK),
        (PermissionError(), ToolErrorType.PERMISSION_DENIED),
        (KeyError("x"), ToolErrorType.NOT_FOUND),
        (ValueError("bad"), ToolErrorType.INVALID_PARAMETERS),
        (RuntimeError("boom"), ToolErrorType.EXECUTION_ERROR),
    ],
)
def test_exceptions_are_classified(exc, expected):
    assert classify_exception(exc) is expected


def test_standard_error_observation_text():
    assert format_error_observation("call_1", ToolErrorType.TIMEOUT, "TIMEOUT", "took 30000 ms") == (
        "Operation failed.\n\nError Type: timeout\nError Code: TIMEOUT\nError Message: took 30000 ms\n\n"
        "Tool Call ID: call_1"
    )


def test_success_becomes_a_tool_message_answering_the_models_call():
    ai = ai_message_with_calls()
    result = ToolExecutionResult(tool_call_id=ai.tool_calls[0]["id"], tool_name="web_search", observation="3 hits", success=True)
    message = result.to_tool_message()
    assert isinstance(message, ToolMessage)
    assert message.tool_call_id == "call_abc123"
    assert (message.content, message.status, message.name) == ("3 hits", "success", "web_search")


def test_failure_becomes_an_error_tool_message_with_the_standard_text():
    result = ToolExecutionResult.failure("call_def456", "calculator", ToolErrorType.INVALID_INPUT, "bad expression")
    message = result.to_tool_message()
    assert message.status == "error"
    assert message.tool_call_id == "call_def456"
    assert message.content == format_error_observation(
        "call_def456", ToolErrorType.INVALID_PARAMETERS, "INVALID_PARAMETERS", "bad expression"
    )


def test_tool_messages_continue_a_langchain_conversation():
    ai = ai_message_with_calls()
    results = [
        ToolExecutionResult(tool_call_id=call["id"], tool_name=call["name"], observation="ok", success=True)
        for call in ai.tool_calls
    ]
    history = [HumanMessage("revenue?"), ai, *(r.to_tool_message() for r in results)]
    answered = {m.tool_call_id for m in history if isinstance(m, ToolMessage)}
    assert answered == {call["id"] for call in ai.tool_calls}


def test_content_block_is_the_claude_style_debug_view():
    failed = ToolExecutionResult.failure("call_1", "t", ToolErrorType.NOT_FOUND, "no such table")
    block = failed.to_content_block()
    assert block["type"] == "tool_result"
    assert block["tool_use_id"] == "call_1"
    assert block["is_error"] is True
    assert block["content"].startswith("Operation failed.")


def test_result_round_trips_through_a_plain_dict():
    result = ToolExecutionResult.failure(
        "call_1", "t", ToolErrorType.TIMEOUT, "slow", output_level=OutputLevel.BRIEF, retry_count=3
    )
    data = result.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert ToolExecutionResult.from_dict(data) == result


def test_a_result_reused_for_another_call_carries_the_new_id():
    cached = ToolExecutionResult(tool_call_id="call_old", tool_name="t", observation="42", success=True)
    reused = cached.for_call("call_new", cache_hit=True)
    assert reused.to_tool_message().tool_call_id == "call_new"
    assert reused.cache_hit and not cached.cache_hit


def test_context_modifier_allows_only_listed_tools():
    assert ContextModifier().allows("anything")
    narrow = ContextModifier(allowed_tools=frozenset({"calculator"}))
    assert narrow.allows("calculator") and not narrow.allows("web_search")
    assert not ContextModifier(allowed_tools=frozenset()).allows("calculator")


def test_nested_context_modifiers_intersect_tools_and_keep_the_inner_model():
    outer = ContextModifier(allowed_tools=frozenset({"a", "b"}), model="gpt-4o", disable_model_invocation=True)
    inner = ContextModifier(allowed_tools=frozenset({"b", "c"}), model="claude-3-haiku")
    combined = outer.narrow(inner)
    assert combined.allowed_tools == frozenset({"b"})
    assert combined.model == "claude-3-haiku"
    assert combined.disable_model_invocation is True
    assert ContextModifier().narrow(inner).allowed_tools == frozenset({"b", "c"})
