"""Exact counts for current OpenAI models (o200k_base, vendored and hash-checked), the
approximate flag, the design document's `encoders:` YAML format, custom encoders and a
provider's exact count plugged in."""

from __future__ import annotations

import hashlib
import inspect
import json
import random
import shutil
from collections.abc import Sequence
from typing import Any

import pytest
import tiktoken
import tiktoken.load
from django.test import override_settings
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from tiktoken_ext import openai_public

from pipeline.runtime.context import measure, needs_compression
from pipeline.tokens.counting import (
    count_conversation_tokens,
    count_messages,
    count_tokens,
    model_profile,
    register_exact_counter,
    unregister_exact_counter,
)
from pipeline.tokens import encodings
from pipeline.tokens.encodings import O200K_FILE, EncodingUnavailable, register_encoding, unregister_encoding

O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
CHINESE_51 = "上下文窗口快满了，压缩策略会先截断低重要性的系统消息，再提取工具观察结果中的关键字段并记录。"


def tiktokens_pinned_hash() -> str:
    source = inspect.getsource(openai_public.o200k_base)
    return source.split('expected_hash="')[1].split('"')[0]


@pytest.fixture(scope="module")
def tiktoken_o200k(tmp_path_factory) -> tiktoken.Encoding:
    """tiktoken's own o200k_base constructor (its pat_str and special tokens), fed our file
    through tiktoken's download cache instead of the network; tiktoken checks the hash itself."""
    cache = tmp_path_factory.mktemp("tiktoken-cache")
    shutil.copy(O200K_FILE, cache / hashlib.sha1(O200K_URL.encode()).hexdigest())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
        patch.setattr(tiktoken.load, "read_file", lambda path: pytest.fail(f"tiktoken tried to fetch {path}"))
        return tiktoken.Encoding(**openai_public.o200k_base())


def mixed_sample(size: int = 10_240) -> str:
    rng = random.Random(7)
    parts: list[str] = []
    while sum(len(p.encode()) for p in parts) < size:
        kind = len(parts) % 3
        if kind == 0:
            parts.append(" ".join(rng.choice(["The", "agent", "called", "search", "tool's", "result:", "quarterly",
                                              "REVENUE", "don't", "42", "2024-05-01"]) for _ in range(40)))
        elif kind == 1:
            parts.append("".join(rng.choice(CHINESE_51) for _ in range(80)))
        else:
            parts.append(json.dumps({"rows": [{"id": i, "名称": f"客户{i}", "score": rng.random()} for i in range(8)]},
                                    ensure_ascii=False))
    return "\n".join(parts)


def test_vendored_o200k_file_has_tiktokens_pinned_sha256():
    assert hashlib.sha256(O200K_FILE.read_bytes()).hexdigest() == tiktokens_pinned_hash()


def test_a_tampered_o200k_file_is_refused_at_load_without_naming_its_path(tmp_path, monkeypatch):
    tampered = tmp_path / "o200k_base.tiktoken"
    tampered.write_bytes(O200K_FILE.read_bytes().replace(b" 100\n", b" 101\n", 1))
    monkeypatch.setattr(encodings, "O200K_FILE", tampered)
    with pytest.raises(EncodingUnavailable, match="does not match tiktoken's pinned sha256") as refused:
        encodings._o200k()
    assert str(tmp_path) not in str(refused.value)


def test_gpt4o_counts_equal_tiktokens_o200k_on_a_mixed_10kb_sample(tiktoken_o200k):
    sample = mixed_sample()
    assert len(sample.encode()) >= 10_240
    expected = len(tiktoken_o200k.encode(sample, disallowed_special=()))
    for model in ("gpt-4o", "openai/gpt-4o-mini", "gpt-4.1", "o3", "o4-mini", "gpt-5", "chatgpt-4o-latest"):
        assert count_tokens(sample, model) == expected, model
    assert count_tokens(CHINESE_51, "gpt-4o") == len(tiktoken_o200k.encode(CHINESE_51))
    assert count_tokens(CHINESE_51, "gpt-4o") < count_tokens(CHINESE_51, "gpt-4")  # cl100k splits Chinese finer


@pytest.mark.parametrize("model,encoding,approximate", [
    ("gpt-4o", "o200k_base", False), ("gpt-4.1-mini", "o200k_base", False), ("o1", "o200k_base", False),
    ("o3-mini", "o200k_base", False), ("gpt-5-nano", "o200k_base", False), ("gpt-oss-120b", "o200k_base", False),
    ("gpt-4", "cl100k_base", False), ("gpt-3.5-turbo", "cl100k_base", False),
    ("davinci", "cl100k_base", True),  # r50k_base is not shipped: approximated
    ("claude-sonnet-4-5", "cl100k_base", True), ("gemini-2.5-pro", "cl100k_base", True),
    ("glm-4.6", "cl100k_base", True), ("my-inhouse-model", "cl100k_base", True),
])
def test_models_map_to_encodings_like_tiktokens_model_table(model, encoding, approximate):
    profile = model_profile(model)
    assert (profile.encoding_name, profile.approximate) == (encoding, approximate)


def test_a_margin_on_an_openai_model_makes_its_counts_approximate(tmp_path):
    path = tmp_path / "enc.yaml"
    path.write_text('models:\n  "gpt-4o*": {margin: 1.1}\n', encoding="utf-8")
    with override_settings(CTXLENS_TOKEN_ENCODERS_FILE=path):
        assert model_profile("gpt-4o").approximate is True
    assert model_profile("gpt-4o").approximate is False


class CharTokenizer:
    """A user's tokenizer: one token per character."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


def test_the_design_documents_encoders_format_and_a_registered_encoder(tmp_path):
    path = tmp_path / "token_encoders.yaml"
    path.write_text(
        """
encoders:
  claude-3-sonnet:
    model_family: claude
    encoding_name: o200k_base
    safety_margin: 1.3
    use_exact_counting: false
  "acme-*":
    model_family: custom
    encoding_name: acme_chars
    safety_margin: 1.0
    use_exact_counting: true
    exact_counting_api: "https://acme.example/count-tokens"
  mistral-tiny:
    model_family: mistal
    encoding_name: cl100k_base
""",
        encoding="utf-8",
    )
    register_encoding("acme_chars", CharTokenizer(), exact=True)
    try:
        with override_settings(CTXLENS_TOKEN_ENCODERS_FILE=path):
            sonnet = model_profile("claude-3-sonnet")
            assert (sonnet.family, sonnet.encoding_name, sonnet.margin, sonnet.approximate) == (
                "claude", "o200k_base", 1.3, True)
            assert model_profile("claude-3-sonnet-20240229").margin == 1.15  # exact name only
            assert model_profile("mistral-tiny").family == "mistral"
            acme = model_profile("acme-large")
            assert (acme.encoding_name, acme.approximate) == ("acme_chars", False)
            assert count_tokens("héllo 世界", "acme-large") == 8
    finally:
        unregister_encoding("acme_chars")
    assert model_profile("acme-large").encoding_name == "cl100k_base"


class FixedCountAPI:
    """A user's plug-in standing in for a provider's count-tokens endpoint."""

    def __init__(self, answer: int | None) -> None:
        self.answer = answer
        self.calls: list[tuple[int, str]] = []

    def count_tokens(self, messages: Sequence[Any], model: str) -> int | None:
        self.calls.append((len(messages), model))
        return self.answer


def test_a_providers_exact_count_is_used_for_conversations_and_compression():
    messages = [HumanMessage("Summarise the report."), AIMessage("Reading it now."), ToolMessage("ok", tool_call_id="c1")]
    estimate = count_conversation_tokens(messages, "claude-sonnet-4-5")
    api = FixedCountAPI(190_000)
    register_exact_counter("claude-sonnet-4*", api)
    try:
        counts = count_messages(messages, "claude-sonnet-4-5")
        assert (counts.tokens, counts.exact_total, counts.approximate) == (190_000, True, False)
        assert sum(counts.per_message) == estimate  # the split stays the tokenizer's
        assert count_conversation_tokens(messages, "claude-sonnet-4-5") == 190_000
        usage = measure(messages, "claude-sonnet-4-5")
        assert usage.tokens == 190_000 and needs_compression(usage)  # 95 % of 200k
        assert count_conversation_tokens(messages, "claude-3-haiku") != 190_000  # other models: untouched
        api.answer = None  # the provider could not tell: the tokenizer's count is used
        assert count_conversation_tokens(messages, "claude-sonnet-4-5") == estimate
        assert api.calls[0] == (3, "claude-sonnet-4-5")
    finally:
        unregister_exact_counter("claude-sonnet-4*")
    assert not needs_compression(measure(messages, "claude-sonnet-4-5"))
