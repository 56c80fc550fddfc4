"""Input and output messages of an LLM span, in the OTel GenAI parts shape, from any convention.

One stored shape: `{"role": ..., "parts": [{"type": "text", "content": ...},
{"type": "tool_call", "id", "name", "arguments"}, {"type": "tool_call_response", "id",
"response"}, ...], "name"?, "finish_reason"?}`. Sources, first present wins:
- OTel GenAI `gen_ai.system_instructions` + `gen_ai.input.messages` / `gen_ai.output.messages`
  (JSON string or structured);
- OpenInference flattened `llm.input_messages.N.message.*` / `llm.output_messages.N.message.*`;
- OpenLLMetry legacy `gen_ai.prompt.N.*` / `gen_ai.completion.N.*`;
- log events (`gen_ai.client.inference.operation.details`, the deprecated per-message events).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.ingest.normalise.values import parse_json, present, to_text

Message = dict[str, Any]

OI_IN, OI_OUT = "llm.input_messages.", "llm.output_messages."
TL_IN, TL_OUT = "gen_ai.prompt.", "gen_ai.completion."


def text_part(content: Any) -> dict[str, Any]:
    return {"type": "text", "content": to_text(content)}


def tool_call_part(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    return {"type": "tool_call", "id": to_text(call_id) if present(call_id) else "",
            "name": to_text(name) if present(name) else "", "arguments": parse_json(arguments)}


# A tool span's call id is stored cut to this length (ToolCall.tool_call_id): ids are compared cut alike.
ID_LENGTH = 255
TOOL_PART_TYPES = ("tool_call", "tool_call_response")


def call_id(value: Any) -> str:
    """A tool call id as ingest keys and compares it: text (JSON for a number, list or object, as
    `to_text` gives it), cut to ID_LENGTH; "" for none (absent, empty, false, an empty list or
    object). Messages stored before ids were normalised may hold any JSON value here."""
    if isinstance(value, str):
        return value[:ID_LENGTH]
    if value is None or value is False or value == [] or value == {}:
        return ""
    return to_text(value)[:ID_LENGTH]


def _text_ids(parts: list[Any]) -> list[Any]:
    """The parts, with the ids of tool parts as `call_id` gives them (copies: the attribute's own
    value, stored with the span as sent, is left as it is)."""
    return [{**part, "id": call_id(part["id"])}
            if isinstance(part, dict) and part.get("type") in TOOL_PART_TYPES and not isinstance(part.get("id", ""), str)
            else part
            for part in parts]


def _genai_list(value: Any) -> list[Message] | None:
    parsed = parse_json(value)
    if not isinstance(parsed, list):
        return None
    out = []
    for item in parsed:
        if isinstance(item, dict) and "role" in item:
            parts = item.get("parts")
            if not isinstance(parts, list):  # tolerate {role, content} from older emitters
                parts = [text_part(item["content"])] if present(item.get("content")) else []
            message: Message = {"role": to_text(item.get("role")), "parts": _text_ids(parts)}
            for extra in ("name", "finish_reason"):
                if present(item.get(extra)):
                    message[extra] = item[extra]
            out.append(message)
    return out


def _system_instructions(value: Any) -> Message | None:
    parsed = parse_json(value)
    if isinstance(parsed, str) and parsed:
        return {"role": "system", "parts": [text_part(parsed)]}
    if isinstance(parsed, list) and parsed:
        parts = [p if isinstance(p, dict) else text_part(p) for p in parsed]
        return {"role": "system", "parts": _text_ids(parts)}
    return None


def _collect_indexed(attrs: Mapping[str, Any], prefix: str) -> dict[int, dict[str, Any]]:
    """{N: {rest-of-key: value}} for keys `prefix + N + '.' + rest`."""
    grouped: dict[int, dict[str, Any]] = {}
    plen = len(prefix)
    for key, value in attrs.items():
        if not key.startswith(prefix):
            continue
        index, _, rest = key[plen:].partition(".")
        if index.isdigit() and rest:
            grouped.setdefault(int(index), {})[rest] = value
    return grouped


def _sub_indexed(fields: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
    grouped = _collect_indexed(fields, prefix)
    return [grouped[i] for i in sorted(grouped)]


def _oi_message(fields: dict[str, Any]) -> Message:
    f = {k.removeprefix("message."): v for k, v in fields.items()}
    nested = any("." in k for k in f)  # contents.N.* or tool_calls.N.*; most messages have neither
    role = to_text(f.get("role") or "")
    parts: list[dict[str, Any]] = []
    tool_call_id = f.get("tool_call_id")
    if role == "tool" and present(tool_call_id):
        parts.append({"type": "tool_call_response", "id": to_text(tool_call_id), "response": f.get("content", "")})
    else:
        if present(f.get("content")):
            parts.append(text_part(f["content"]))
        for content in _sub_indexed(f, "contents.") if nested else ():
            c = {k.removeprefix("message_content."): v for k, v in content.items()}
            if c.get("type", "text") == "text" and present(c.get("text")):
                parts.append(text_part(c["text"]))
            elif present(c.get("image.image.url")):
                parts.append({"type": "uri", "modality": "image", "uri": c["image.image.url"]})
    for call in _sub_indexed(f, "tool_calls.") if nested else ():
        c = {k.removeprefix("tool_call."): v for k, v in call.items()}
        parts.append(tool_call_part(c.get("id"), c.get("function.name"), c.get("function.arguments")))
    message: Message = {"role": role, "parts": parts}
    if present(f.get("name")):
        message["name"] = f["name"]
    return message


def _tl_message(f: dict[str, Any]) -> Message:
    role = to_text(f.get("role") or "")
    parts: list[dict[str, Any]] = []
    tool_call_id = f.get("tool_call_id")
    if role == "tool" and present(tool_call_id):
        parts.append({"type": "tool_call_response", "id": to_text(tool_call_id), "response": f.get("content", "")})
    elif present(f.get("content")) and f.get("content") != '""':
        parts.append(text_part(f["content"]))
    for call in _sub_indexed(f, "tool_calls."):
        parts.append(tool_call_part(call.get("id"), call.get("name"), call.get("arguments")))
    message: Message = {"role": "assistant" if role == "unknown" else role, "parts": parts}
    if present(f.get("finish_reason")):
        message["finish_reason"] = f["finish_reason"]
    return message


FLAT_PREFIXES = (OI_IN, OI_OUT, TL_IN, TL_OUT)


def flattened_groups(attrs: Mapping[str, Any]) -> dict[str, dict[int, dict[str, Any]]]:
    """One pass over the attributes: {prefix: {N: {rest: value}}} for the four indexed prefixes."""
    groups: dict[str, dict[int, dict[str, Any]]] = {}
    for key, value in attrs.items():
        if not key.startswith(FLAT_PREFIXES):  # one test for the most attributes, which are none of them
            continue
        for prefix in FLAT_PREFIXES:
            if key.startswith(prefix):
                index, _, rest = key[len(prefix):].partition(".")
                if index.isdigit() and rest:
                    groups.setdefault(prefix, {}).setdefault(int(index), {})[rest] = value
                break
    return groups


def _flattened(groups: dict[str, dict[int, dict[str, Any]]], prefix: str, build) -> list[Message] | None:
    grouped = groups.get(prefix)
    if not grouped:
        return None
    return [build(grouped[i]) for i in sorted(grouped)]


def input_messages(attrs: Mapping[str, Any], groups: dict | None = None) -> list[Message]:
    messages = _genai_list(attrs.get("gen_ai.input.messages")) if "gen_ai.input.messages" in attrs else None
    if messages is not None:
        system = _system_instructions(attrs.get("gen_ai.system_instructions"))
        return [system, *messages] if system else messages
    groups = flattened_groups(attrs) if groups is None else groups
    return (
        _flattened(groups, OI_IN, _oi_message)
        or _flattened(groups, TL_IN, _tl_message)
        or _genai_list(attrs.get("gen_ai.prompt"))
        or []
    )


def output_messages(attrs: Mapping[str, Any], groups: dict | None = None) -> list[Message]:
    messages = _genai_list(attrs.get("gen_ai.output.messages")) if "gen_ai.output.messages" in attrs else None
    if messages is not None:
        return messages
    groups = flattened_groups(attrs) if groups is None else groups
    return (
        _flattened(groups, OI_OUT, _oi_message)
        or _flattened(groups, TL_OUT, _tl_message)
        or _genai_list(attrs.get("gen_ai.completion"))
        or []
    )


def tool_calls_of(messages: list[Message]) -> list[dict[str, Any]]:
    """The tool_call parts of `messages`, in order."""
    return [p for m in messages for p in m.get("parts", ()) if isinstance(p, dict) and p.get("type") == "tool_call"]


def tool_responses_of(messages: list[Message]) -> dict[str, Any]:
    """{tool_call_id: response} of the tool_call_response parts of `messages`."""
    return {
        key: p.get("response")
        for m in messages
        for p in m.get("parts", ())
        if isinstance(p, dict) and p.get("type") == "tool_call_response" and (key := call_id(p.get("id")))
    }


def message_text(message: Message) -> str:
    """Everything in a message the model reads, as one text (for token counts and previews)."""
    pieces = []
    for part in message.get("parts", ()):
        if not isinstance(part, dict):
            pieces.append(to_text(part))
        elif part.get("type") == "text" or part.get("type") == "reasoning":
            pieces.append(to_text(part.get("content")))
        elif part.get("type") == "tool_call":
            pieces.append(f"{part.get('name', '')}({to_text(part.get('arguments'))})")
        elif part.get("type") == "tool_call_response":
            pieces.append(to_text(part.get("response")))
    return "\n".join(p for p in pieces if p)


def last_text(messages: list[Message], role: str) -> str:
    for message in reversed(messages):
        if message.get("role") == role:
            text = "\n".join(
                to_text(p.get("content")) for p in message.get("parts", ())
                if isinstance(p, dict) and p.get("type") == "text" and present(p.get("content"))
            )
            if text:
                return text
    return ""
