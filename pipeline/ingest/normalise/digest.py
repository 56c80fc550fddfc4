"""A compact fingerprint of an LLM call's messages, stored with the call at ingest.

Each message becomes `{"hash", "role", "category", "bytes"}` plus, when present, `"media"` (its
image, audio and file parts), `"answers"`
(the tool_call_ids its tool results answer) and `"requests"` (the tool_call_ids of the tool
calls it makes). Comparing two calls' digests says which messages were kept, added, removed or
changed without loading either call's messages, which can be megabytes each.

Tokens per message are not stored: they follow from the call's input token count split in
proportion to each message's weight (`message_tokens`: UTF-8 text and media parts,
composition.digest_weights), the same rule as the context
composition (pipeline.ingest.normalise.composition), so a digest never waits for a tokenizer.
"""

from __future__ import annotations

import hashlib
import json
from json.encoder import encode_basestring_ascii as json_string  # json.dumps of one str
from typing import Any

from pipeline.ingest.normalise.composition import BYTES_PER_TOKEN, category_of, digest_weights
from pipeline.ingest.normalise.messages import Message, message_text
from pipeline.tokens.counting import MEDIA_TOKENS, media_parts, scale_to_total

Digest = list[dict[str, Any]]


TEXT_PARTS = frozenset(("text", "reasoning", "tool_call", "tool_call_response"))  # what message_text reads


def _json_strings(items: list[str]) -> str:
    """json.dumps(items) for a list of strings, without building an encoder for each message."""
    return "[" + ", ".join(map(json_string, items)) + "]"


def _hash(role: str, text: bytes, answers: list[str], requests: list[str], media: list[dict]) -> str:
    """What makes two messages the same to the model: role, text, tool call ids, and the parts
    that are not text (an image or a file that changed makes a changed message)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"[{json_string(role)}, {_json_strings(answers)}, {_json_strings(requests)}]".encode())
    h.update(text)
    if media:
        h.update(json.dumps(media, sort_keys=True, default=str).encode(errors="replace"))
    return h.hexdigest()


def _ids(message: Message, part_type: str) -> list[str]:
    return [
        str(part["id"]) for part in message.get("parts", ())
        if isinstance(part, dict) and part.get("type") == part_type and part.get("id")
    ]


def message_digest(messages: list[Message]) -> Digest:
    """One entry per message, in order (see the module docstring)."""
    digest = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = str(message.get("role", ""))
        text = message_text(message).encode(errors="replace")
        answers, requests = _ids(message, "tool_call_response"), _ids(message, "tool_call")
        media = [p for p in message.get("parts", ()) if isinstance(p, dict) and p.get("type") not in TEXT_PARTS]
        entry: dict[str, Any] = {
            "hash": _hash(role, text, answers, requests, media),
            "role": role,
            "category": category_of(message),
            "bytes": len(text),
        }
        if count := media_parts(message.get("parts")):
            entry["media"] = count
        if answers:
            entry["answers"] = answers
        if requests:
            entry["requests"] = requests
        digest.append(entry)
    return digest


def message_tokens(digest: Digest, input_tokens: int) -> list[int]:
    """Each message's share of `input_tokens`, in proportion to its weight (composition.digest_weights);
    when the call has no token count yet, its text's size divided by BYTES_PER_TOKEN and MEDIA_TOKENS
    a media part (the runtime's rule)."""
    if not digest:
        return []
    if not input_tokens:
        return [int(e.get("bytes", 0)) // BYTES_PER_TOKEN + MEDIA_TOKENS * int(e.get("media", 0)) for e in digest]
    sizes = dict(enumerate(digest_weights(digest, input_tokens)))
    if not any(sizes.values()):
        sizes = dict.fromkeys(sizes, 1)
    scaled = scale_to_total(sizes, input_tokens)
    return [scaled[i] for i in range(len(digest))]
