"""LangChain messages as instrumentations serialise them, and the turn text in a message state.

A LangGraph agent's state is `{"messages": [...]}`, and the messages come in several shapes:
- OpenInference: `{"type": "human", "data": {"content", "tool_calls", ...}}` (`messages_to_dict`);
- OpenLLMetry and LLM inputs: `{"lc": 1, "type": "constructor", "id": [..., "HumanMessage"],
  "kwargs": {"content", "type", "tool_calls", ...}}` (`dumpd`);
- what the caller passed, unconverted: `{"role": "user", "content": ...}`, `("user", "...")`.
Content is a string or a list of blocks (`"text"` or `{"type": "text", "text": ...}`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ROLES = {
    "human": "user", "user": "user", "ai": "assistant", "assistant": "assistant",
    "system": "system", "developer": "system", "tool": "tool", "function": "tool",
}


@dataclass(slots=True)
class LcMessage:
    role: str  # user | assistant | system | tool
    text: str  # only the text blocks: an AI message with only tool calls has none


def content_text(content: Any) -> str:
    """The text of a message's content, joined the way `BaseMessage.text` joins it."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            block if isinstance(block, str) else str(block.get("text") or "")
            for block in content
            if isinstance(block, str) or (isinstance(block, dict) and block.get("type", "text") == "text")
        )
    return ""


def _class_role(lc_id: Any) -> str:
    """"human" from `[..., "HumanMessage"]` (or `HumanMessageChunk`)."""
    if isinstance(lc_id, list) and lc_id and isinstance(lc_id[-1], str):
        return lc_id[-1].removesuffix("Chunk").removesuffix("Message").lower()
    return ""


def lc_message(item: Any) -> LcMessage | None:
    """One serialised message, or None when `item` is not one."""
    if isinstance(item, list | tuple) and len(item) == 2 and isinstance(item[0], str):
        role = ROLES.get(item[0])  # ("user", "...")
        return LcMessage(role, content_text(item[1])) if role else None
    if not isinstance(item, dict):
        return None
    if item.get("lc") == 1 and isinstance(item.get("kwargs"), dict):
        body = item["kwargs"]
        kind = body.get("type") if isinstance(body.get("type"), str) else _class_role(item.get("id"))
    elif isinstance(item.get("type"), str) and isinstance(item.get("data"), dict):
        body, kind = item["data"], item["type"]
    elif isinstance(item.get("role"), str) and "content" in item:
        body, kind = item, item["role"]
    elif isinstance(item.get("type"), str) and item["type"] in ROLES and "content" in item:
        body, kind = item, item["type"]
    else:
        return None
    if kind == "chat" and isinstance(body.get("role"), str):  # ChatMessage names its own role
        kind = body["role"]
    role = ROLES.get(kind)  # a Document or other serialised object is no message
    return LcMessage(role, content_text(body.get("content"))) if role else None


def message_list(payload: Any) -> list[LcMessage] | None:
    """The messages of a state (`{"messages": [...]}`) or of a plain list of messages, else None."""
    items = payload.get("messages") if isinstance(payload, dict) else payload
    if not isinstance(items, list) or not items:
        return None
    messages = [m for m in map(lc_message, items) if m is not None]
    return messages if isinstance(payload, dict) or len(messages) == len(items) else None


def last_user_text(messages: list[LcMessage]) -> str:
    """What the user asked: the text of the last human message."""
    return next((m.text for m in reversed(messages) if m.role == "user"), "")


def answer_text(messages: list[LcMessage]) -> str:
    """The agent's answer: the text of the last AI message; one with only tool calls answers nothing."""
    return next((m.text for m in reversed(messages) if m.role == "assistant"), "")
