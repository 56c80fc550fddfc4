"""LangChain messages in the OTel GenAI message shape, for span attributes.

`{"role": "system"|"user"|"assistant"|"tool", "parts": [...], "name"?, "finish_reason"?}` with
parts `text{content}`, `reasoning{content}`, `tool_call{id, name, arguments}` and
`tool_call_response{id, response}` (semantic-conventions gen-ai-input-messages.json), the
shape pipeline.ingest.normalise.messages reads back. Long texts are cut to `max_chars` with a marker so
one huge observation cannot blow up every later span that repeats the conversation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, HumanMessage, SystemMessage, ToolMessage

MAX_PART_CHARS = 16_000
ROLES: tuple[tuple[type[BaseMessage], str], ...] = (
    (SystemMessage, "system"), (HumanMessage, "user"), (AIMessage, "assistant"), (ToolMessage, "tool"),
)


def clip(text: str, max_chars: int = MAX_PART_CHARS) -> str:
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}… [{len(text) - max_chars} more characters not recorded]"


def _content_parts(content: Any, max_chars: int) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "content": clip(content, max_chars)}] if content else []
    parts: list[dict[str, Any]] = []
    for block in content or []:
        if isinstance(block, str):
            parts.append({"type": "text", "content": clip(block, max_chars)})
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append({"type": "text", "content": clip(str(block.get("text", "")), max_chars)})
        elif isinstance(block, dict) and block.get("type") in ("thinking", "reasoning"):
            text = block.get("thinking") or block.get("reasoning") or ""
            parts.append({"type": "reasoning", "content": clip(str(text), max_chars)})
        elif isinstance(block, dict) and block.get("type") in ("tool_use", "tool_call"):
            continue  # carried by AIMessage.tool_calls
        elif isinstance(block, dict):
            parts.append({"type": str(block.get("type") or "unknown")})
    return parts


def role_of(message: BaseMessage) -> str:
    """The GenAI role; by class, so streamed chunks (type "AIMessageChunk") map like whole messages."""
    if isinstance(message, ChatMessage):
        return message.role
    return next((role for cls, role in ROLES if isinstance(message, cls)), message.type)


def to_genai_message(message: BaseMessage, max_chars: int = MAX_PART_CHARS) -> dict[str, Any]:
    if isinstance(message, ToolMessage):
        # What the model reads: the text of text blocks; other blocks (images ...) as JSON.
        response = str(message.text) or (json.dumps(message.content, default=str) if message.content else "")
        out: dict[str, Any] = {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": message.tool_call_id, "response": clip(response, max_chars)}],
        }
    else:
        out = {"role": role_of(message), "parts": _content_parts(message.content, max_chars)}
    if isinstance(message, AIMessage):
        for call in message.tool_calls:
            out["parts"].append({"type": "tool_call", "id": call.get("id") or "", "name": call["name"], "arguments": call.get("args", {})})
        for call in message.invalid_tool_calls:
            out["parts"].append({"type": "tool_call", "id": call.get("id") or "", "name": call.get("name") or "", "arguments": call.get("args")})
    if message.name:
        out["name"] = message.name
    return out


def to_genai_messages(messages: Sequence[BaseMessage], max_chars: int = MAX_PART_CHARS) -> list[dict[str, Any]]:
    return [to_genai_message(m, max_chars) for m in messages]


def finish_reason(message: AIMessage) -> str:
    if message.tool_calls or message.invalid_tool_calls:
        return "tool_call"
    reason = (message.response_metadata or {}).get("finish_reason") or (message.response_metadata or {}).get("stop_reason")
    return {"tool_calls": "tool_call", "end_turn": "stop", "max_tokens": "length"}.get(str(reason), str(reason or "stop"))


def output_message(message: AIMessage, max_chars: int = MAX_PART_CHARS) -> dict[str, Any]:
    out = to_genai_message(message, max_chars)
    out["finish_reason"] = finish_reason(message)
    return out
