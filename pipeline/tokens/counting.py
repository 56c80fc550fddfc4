"""Token counting for the context window: the model's tokenizer where it is public, else an
approximation scaled by a per-family safety margin.

    count_tokens(text, model)                  -> int  ceil(tokens × margin)
    count_message_tokens(message, model)       -> int  one message or one content block
    count_conversation_tokens(messages, model) -> int  the messages (or a provider's exact count)
    count_messages(messages, model)            -> MessageCounts  per message, once, for totals and composition
    context_window(model)                      -> int  the model's maximum context, in tokens
    model_profile(model)                       -> ModelProfile (family, encoding, margin, window, approximate)

Encodings (pipeline/tokens/encodings/): OpenAI models get the encoding tiktoken's model table
names (gpt-4o, gpt-4.1, gpt-4.5, o1/o3/o4, gpt-5, chatgpt-4o → o200k_base; gpt-4, gpt-3.5 →
cl100k_base), both loaded offline. Families without a public tokenizer (Claude, Gemini, GLM,
...) are approximated by cl100k_base × a margin, and their profile says `approximate`
(the API says "approximate": true, the pages "≈"). Nothing here is downloaded and an unknown
model never raises: it gets the "custom" family (margin 1.2).

One counting rule, for the runtime's compression decisions and for the server's stored
counts and compositions alike. Per message (`count_message_tokens`), for a LangChain message,
an OpenAI-style {"role", "content", "tool_calls"} dict or an OTel GenAI {"role", "parts"}
dict: ceil((MESSAGE_OVERHEAD + Σ tokens(piece) + MEDIA_TOKENS × media blocks) × margin),
where each piece is encoded on its own: the text of the content (a string, or each
text-bearing block or part), the message name, the tool_call_id, and for every tool call its
id, name and JSON arguments. A content-block dict alone counts the same way without
MESSAGE_OVERHEAD. A conversation is the sum of its messages, so per-message counts add up.

Plug-ins: `pipeline.tokens.encodings.register_encoding` adds a tokenizer the YAML file can
name; `register_exact_counter(pattern, counter)` plugs in a provider's count-tokens API for
the models matching a glob: `count_conversation_tokens` (and the runtime's compression
decision) then uses its answer, falling back to the tokenizer when it returns None or raises.

Overrides come from the YAML file named by CTXLENS_TOKEN_ENCODERS_FILE (the runtime settings'
`token_encoders_file`; both formats in pipeline/tokens/families.py and config/token_encoders.yaml). A
bad file is reported by the server's system check pipeline.E010 and ignored at count time
(built-in defaults apply). `clear_token_caches()` forgets the cached file and profiles (the
server calls it when the setting changes); edits to the file need a restart.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import cache, lru_cache
from typing import Any, Protocol

from pipeline.runtime.settings import runtime_settings
from pipeline.tokens import encodings
from pipeline.tokens.families import (
    DEFAULT_ENCODING,
    FALLBACK_FAMILY,
    ModelOverride,
    TokenConfig,
    TokenConfigError,
    builtin_window,
    detect_model,
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
    approximate: bool  # not the model's own tokenizer, or scaled by a margin: shown as "≈"
    count_text: Callable[[str], int] = field(repr=False, compare=False)  # raw tokens of one piece of text
    margin_scaled: int = field(repr=False, compare=False)
    exact_counter: ExactCounter | None = field(default=None, repr=False, compare=False)

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
    CTXLENS_TOKEN_ENCODERS_FILE changes, and registering an encoding or counter does too."""
    token_config.cache_clear()
    model_profile.cache_clear()


encodings.on_change(clear_token_caches)


class ExactCounter(Protocol):
    """A provider's exact count (e.g. Anthropic's or Gemini's count-tokens API): the input
    tokens of `messages` for `model`, or None when it cannot tell (the tokenizer is used then)."""

    def count_tokens(self, messages: Sequence[Any], model: str) -> int | None: ...


_exact_counters: dict[str, ExactCounter] = {}


def register_exact_counter(pattern: str, counter: ExactCounter) -> None:
    """Use `counter` for models whose lower-cased name or model id matches the glob `pattern`
    (the design document's configure_api_client). A YAML entry with use_exact_counting: false
    turns it off for its models."""
    _exact_counters[pattern.lower()] = counter
    clear_token_caches()


def unregister_exact_counter(pattern: str) -> None:
    _exact_counters.pop(pattern.lower(), None)
    clear_token_caches()


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
    # OpenAI models: tiktoken's model table, when it names an encoding available offline
    table = encodings.openai_encoding(model_id) if family == "gpt" else None
    own = table if table and encodings.is_available(table) else None
    encoding_name = override.encoding or own or settings.encoding
    margin = override.margin if override.margin is not None else settings.margin
    try:
        encoder_name, exact = encodings.describe(encoding_name)
    except encodings.EncodingUnavailable as exc:  # unregistered since the file named it, or a bad file
        logger.warning("%s; counting %s with %s", exc, model or "an unnamed model", DEFAULT_ENCODING)
        encoder_name, exact = encodings.describe(DEFAULT_ENCODING)
    exact_tokenizer = encoder_name == own or (exact and encoder_name not in encodings.BUILTIN)
    counter = None
    if override.exact_counting is not False:
        counter = next((c for p, c in _exact_counters.items() if fnmatchcase(name, p) or fnmatchcase(model_id, p)), None)
    return ModelProfile(
        model=model or "",
        family=family,
        encoding_name=encoder_name,
        margin=margin,
        context_window=window,
        approximate=not (exact_tokenizer and margin == 1.0),
        count_text=encodings.LazyCounter(encoder_name),  # the tokenizer loads when text is counted
        margin_scaled=round(margin * _MARGIN_SCALE),
        exact_counter=counter,
    )


def is_approximate(model: str | None) -> bool:
    """True when counts for `model` are an approximation (no public tokenizer, or a margin)."""
    return model_profile(model).approximate


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
    return profile.scale(profile.count_text(text))


MAX_EXACT_CHARS = 100_000  # tiktoken takes ~0.1 s for this much text


def _bounded(text: str, count_text: Callable[[str], int], max_chars: int) -> tuple[int, bool]:
    """(raw tokens, estimated): exact up to `max_chars`, past it the head's tokens per character."""
    if len(text) <= max_chars:
        return count_text(text), False
    head = count_text(text[:max_chars])
    return -(-head * len(text) // max_chars), True


def count_tokens_bounded(text: str, model: str | None = None, max_chars: int = MAX_EXACT_CHARS) -> tuple[int, bool]:
    """(tokens, estimated): exact up to `max_chars`; past it the head is counted exactly and the
    rest at the head's tokens per character, so a 20 MB prompt costs what 100 KB does."""
    if not text:
        return 0, False
    profile = model_profile(model)
    raw, estimated = _bounded(text, profile.count_text, max_chars)
    return profile.scale(raw), estimated


def _json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


_MEDIA_TYPES = frozenset({"image", "image_url", "input_image", "audio", "input_audio", "video", "file",
                          "uri", "blob"})  # the last two: OTel GenAI media parts


def is_media(block: Mapping) -> bool:
    """Whether a content block (or OTel GenAI part) is an image, audio, video or file: MEDIA_TOKENS
    of context, whatever its size in the span (a document of text is its text)."""
    kind = block.get("type")
    if kind == "document":
        source = block.get("source")
        return not (isinstance(source, Mapping) and source.get("type") == "text")
    return kind in _MEDIA_TYPES


def media_parts(content: Any) -> int:
    """The media blocks (`is_media`) of a message's content or parts, those of its tool results
    included, as `_message_pieces` counts them, without reading any text."""
    if isinstance(content, Mapping):
        kind = content.get("type")
        if kind == "tool_result":
            return media_parts(content.get("content"))
        if kind == "tool_call_response":
            return media_parts(content.get("response"))
        return int(is_media(content))
    if isinstance(content, list | tuple):
        return sum(map(media_parts, content))
    return 0


def _block_pieces(block: Any, pieces: list[str]) -> int:
    """Append the text a content block (or OTel GenAI part) puts in front of the model; return
    its media count."""
    if isinstance(block, str):
        pieces.append(block)
        return 0
    if not isinstance(block, Mapping):
        pieces.append(_json(block))
        return 0
    kind = block.get("type")
    if kind == "text":  # LangChain/Anthropic {"text"}, OTel GenAI {"content"}
        pieces.append(str(block.get("text", block.get("content")) or ""))
    elif kind in ("thinking", "reasoning"):
        pieces.append(str(block.get(kind, block.get("content")) or ""))
    elif kind in ("tool_use", "tool_call"):
        args = block.get("input", block.get("args", block.get("arguments", {})))
        pieces.extend([str(block.get("id") or ""), str(block.get("name") or ""), _json(args)])
    elif kind == "tool_result":
        pieces.append(str(block.get("tool_use_id") or ""))
        return _content_pieces(block.get("content"), pieces)
    elif kind == "tool_call_response":  # OTel GenAI
        pieces.append(str(block.get("id") or ""))
        return _content_pieces(block.get("response"), pieces)
    elif kind == "document" and isinstance(block.get("source"), Mapping) and block["source"].get("type") == "text":
        pieces.append(str(block["source"].get("data") or ""))
    elif is_media(block):
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


def _id_key(value: Any) -> Any:
    """A tool call id as a set member: one sent as a JSON object or list is compared as its JSON."""
    return value if isinstance(value, Hashable) else _json(value)


def _tool_call_pieces(calls: Iterable[Any], skip_ids: set[Any], pieces: list[str]) -> None:
    for call in calls or ():
        if not isinstance(call, Mapping) or _id_key(call.get("id")) in skip_ids:
            continue
        function = call.get("function")  # OpenAI dict shape: {"id", "function": {"name", "arguments"}}
        source = function if isinstance(function, Mapping) else call
        args = source.get("arguments", source.get("args", {}))
        pieces.extend([str(call.get("id") or ""), str(source.get("name") or ""), _json(args)])


def _message_pieces(message: Any, pieces: list[str]) -> tuple[int, int]:
    """Fill `pieces` with the message's text; (overhead tokens, media blocks)."""
    if isinstance(message, str):
        pieces.append(message)
        return 0, 0
    if isinstance(message, Mapping) and "role" not in message:
        return 0, _block_pieces(message, pieces)  # a content block: no per-message overhead
    get = message.get if isinstance(message, Mapping) else lambda key: getattr(message, key, None)
    content = get("content")
    if content is None and isinstance(message, Mapping):
        content = message.get("parts")  # OTel GenAI message
    media = _content_pieces(content, pieces)
    blocks = content if isinstance(content, list) else ()
    in_content = {
        _id_key(b.get("id")) for b in blocks if isinstance(b, Mapping) and b.get("type") in ("tool_use", "tool_call")
    }
    _tool_call_pieces(get("tool_calls") or (), in_content, pieces)
    _tool_call_pieces(get("invalid_tool_calls") or (), in_content, pieces)
    pieces.extend(str(v) for v in (get("name"), get("tool_call_id")) if v)
    return MESSAGE_OVERHEAD, media


@dataclass(frozen=True)
class MessageCounts:
    """Per-message tokens of a list of messages, each tokenised once: `per_message[i]` is
    `count_message_tokens(messages[i])` (estimated past MAX_EXACT_CHARS a piece when bounded);
    `tokens` their sum, or the exact count a registered provider counter gave."""

    per_message: list[int]
    tokens: int
    approximate: bool
    estimated: bool = False  # some piece was longer than the exact cap
    exact_total: bool = False  # `tokens` came from a provider's count-tokens API


def _raw_message(message: Any, profile: ModelProfile, max_chars: int | None) -> tuple[int, bool]:
    pieces: list[str] = []
    overhead, media = _message_pieces(message, pieces)
    raw, estimated = overhead + MEDIA_TOKENS * media, False
    for piece in pieces:
        if not piece:
            continue
        if max_chars is None:
            raw += profile.count_text(piece)
        else:
            tokens, cut = _bounded(piece, profile.count_text, max_chars)
            raw, estimated = raw + tokens, estimated or cut
    return raw, estimated


def count_message_tokens(message: Any, model: str | None = None) -> int:
    """Tokens for a LangChain BaseMessage, an OpenAI-style {"role": ...} dict, an OTel GenAI
    {"role", "parts"} dict, a content-block dict ({"type": "text" | "tool_use" | "tool_result"
    | "image" | ...}) or a plain string."""
    profile = model_profile(model)
    return profile.scale(_raw_message(message, profile, None)[0])


def count_messages(
    messages: Sequence[Any], model: str | None = None, *, max_chars: int | None = None, exact: bool = True
) -> MessageCounts:
    """Every message counted once (the one rule above). `max_chars` bounds the exact work per
    piece (the server passes MAX_EXACT_CHARS); `exact=False` skips a registered provider counter."""
    profile = model_profile(model)
    per_message: list[int] = []
    estimated = False
    for message in messages:
        raw, cut = _raw_message(message, profile, max_chars)
        per_message.append(profile.scale(raw))
        estimated = estimated or cut
    total = sum(per_message)
    if exact and profile.exact_counter is not None and messages:
        provided = _exact_count(profile, messages)
        if provided is not None:
            return MessageCounts(per_message, provided, approximate=False, estimated=estimated, exact_total=True)
    return MessageCounts(per_message, total, profile.approximate or estimated, estimated)


def _exact_count(profile: ModelProfile, messages: Sequence[Any]) -> int | None:
    try:
        value = profile.exact_counter.count_tokens(messages, profile.model)  # type: ignore[union-attr]
    except Exception:
        logger.warning("exact token counter for %s failed; using the tokenizer", profile.model, exc_info=True)
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def count_conversation_tokens(messages: Iterable[Any], model: str | None = None) -> int:
    """The sum of `count_message_tokens` over the messages, or a registered provider counter's
    exact count for the model."""
    return count_messages(list(messages), model).tokens


def scale_to_total(sizes: dict[str, int], total: int) -> dict[str, int]:
    """`sizes` rescaled to add up to `total` exactly: how a per-category split follows a count the
    provider gave. Each share is rounded down and the units left go to the largest remainders
    (ties to the larger size), so none is ever more than one off its exact share, nor negative."""
    measured = sum(sizes.values())
    if not measured:
        return sizes
    shares = {k: v * total / measured for k, v in sizes.items()}
    scaled = {k: int(share) for k, share in shares.items()}
    left = total - sum(scaled.values())
    for key in sorted(shares, key=lambda k: (shares[k] - scaled[k], sizes[k]), reverse=True)[:left]:
        scaled[key] += 1
    return scaled
