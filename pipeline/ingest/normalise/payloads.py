"""Tool and turn payloads, unwrapped from the shapes instrumentations wrap them in.

OpenLLMetry puts the whole LangChain callback payload in `gen_ai.tool.call.arguments` /
`traceloop.entity.input` (`{"input_str", "inputs", "metadata", "kwargs": {"tool_call_id"}}`)
and a serialised ToolMessage in `gen_ai.tool.call.result` / `traceloop.entity.output`
(`{"output": {"lc": 1, "kwargs": {"content", "tool_call_id"}}}`). OpenInference puts
`{"type": "tool", "data": {"content", "tool_call_id"}}` in `output.value`.

A root span's payload gives the turn's user message and final answer. A LangGraph agent's is its
state, `{"messages": [...]}` (read by `lc_messages`): the last human message in, the last AI
message out.
"""

from __future__ import annotations

from typing import Any

from pipeline.ingest.normalise import lc_messages as lc
from pipeline.ingest.normalise.values import dig, first, parse_json, present, to_text


WRAPPER_KEYS = frozenset({"output", "kwargs"})  # OpenLLMetry's around a tool's output; a tool's own dict may hold more


def _is_callback_payload(value: Any) -> bool:
    return isinstance(value, dict) and ("inputs" in value or "input_str" in value)


def unwrap_langchain(value: Any) -> Any:
    """The content of a LangChain-serialised message or tool output, else the value itself."""
    if isinstance(value, dict):
        if "output" in value and value.keys() <= WRAPPER_KEYS:  # {"output": <ToolMessage or value>, "kwargs": ...}
            return unwrap_langchain(value["output"])
        if value.get("lc") == 1 and isinstance(value.get("kwargs"), dict):  # {"lc":1,"type":"constructor",...}
            return value["kwargs"].get("content", value["kwargs"])
        if value.get("type") == "tool" and isinstance(value.get("data"), dict):  # OpenInference ToolMessage
            return value["data"].get("content", value["data"])
        if value.get("type") == "tool" and "content" in value:
            return value["content"]
    return value


def _failed_tool_message(value: Any) -> bool:
    """Whether a tool output is a LangChain ToolMessage (it names its tool call) whose status is
    "error", as OpenLLMetry (lc-serialised, in an {"output": ...} wrapper) or OpenInference
    ({"type": "tool", "data": ...}) record it."""
    if isinstance(value, dict) and "output" in value and value.keys() <= WRAPPER_KEYS:
        value = value["output"]
    if not isinstance(value, dict):
        return False
    names = value.get("id")
    if value.get("lc") == 1 and isinstance(names, list) and names[-1:] == ["ToolMessage"]:
        message = value.get("kwargs")
    elif value.get("type") == "tool":
        message = value.get("data", value)
    else:
        return False
    return isinstance(message, dict) and "tool_call_id" in message and message.get("status") == "error"


def tool_call_id_from_payloads(attrs: dict[str, Any]) -> str:
    direct = first(attrs, "gen_ai.tool.call.id", "tool.id", "tool_call.id")
    if direct is not None:
        return to_text(direct)
    for key in ("gen_ai.tool.call.arguments", "traceloop.entity.input"):
        if key in attrs:
            found = dig(parse_json(attrs[key]), "kwargs", "tool_call_id")
            if present(found):
                return to_text(found)
    if "output.value" in attrs:
        found = dig(parse_json(attrs["output.value"]), "data", "tool_call_id")
        if present(found):
            return to_text(found)
    for key in ("gen_ai.tool.call.result", "traceloop.entity.output"):
        if key in attrs:
            output = parse_json(attrs[key])
            found = dig(output, "output", "kwargs", "tool_call_id") or dig(output, "kwargs", "tool_call_id")
            if present(found):
                return to_text(found)
    return ""


def tool_arguments(attrs: dict[str, Any]) -> Any:
    """The arguments the tool was called with: a dict when they are structured, else the text."""
    if "gen_ai.tool.call.arguments" in attrs:
        args = parse_json(attrs["gen_ai.tool.call.arguments"])
        return args.get("inputs", args.get("input_str")) if _is_callback_payload(args) else args
    if present(attrs.get("input.value")):
        return parse_json(attrs["input.value"])
    for key in ("tool_call.function.arguments", "tool.parameters"):
        if present(attrs.get(key)):
            return parse_json(attrs[key])
    if "traceloop.entity.input" in attrs:
        payload = parse_json(attrs["traceloop.entity.input"])
        return payload.get("inputs", payload.get("input_str")) if _is_callback_payload(payload) else payload
    return {}


def tool_output(attrs: dict[str, Any]) -> tuple[str, bool]:
    """(observation, failed): the tool's result, and whether the ToolMessage that carried it says
    `status: "error"` (what LangGraph's ToolNode returns for a tool error it handled; neither
    OpenInference nor OpenLLMetry marks the span itself as failed then)."""
    for key in ("gen_ai.tool.call.result", "output.value", "traceloop.entity.output"):
        value = attrs.get(key)
        if present(value):
            parsed = parse_json(value)
            return to_text(unwrap_langchain(parsed)), _failed_tool_message(parsed)
    return "", False


TURN_TEXT_KEYS = ("input", "question", "query", "output", "answer")


def _turn_text(payload: Any, role: str) -> str:
    """The turn's text in a payload: `role`'s message of a message state or list, a known key's
    text, or a plain string. A structured payload with none of these gives "", never its JSON:
    the round then falls back to its LLM calls' messages (pipeline.ingest.write)."""
    for _ in range(8):  # {"input": {"question": ...}}; a bound, as payloads come from anyone
        if isinstance(payload, str):
            return payload
        messages = lc.message_list(payload)
        if messages is not None:
            return lc.last_user_text(messages) if role == "user" else lc.answer_text(messages)
        message = lc.lc_message(payload)
        if message is not None:
            return message.text
        if not isinstance(payload, dict):
            return "" if isinstance(payload, list) or payload is None else to_text(payload)
        payload = first(payload, *TURN_TEXT_KEYS)
    return ""


def _turn(attrs: dict[str, Any], sources: tuple[tuple[str, str], ...], role: str) -> str:
    for key, wrapper in sources:
        if present(attrs.get(key)):
            parsed = parse_json(attrs[key])
            if isinstance(parsed, dict) and wrapper in parsed:  # Traceloop's {"inputs": ..., "metadata": ...}
                parsed = parsed[wrapper]
            return _turn_text(parsed, role)
    return ""


def turn_input(attrs: dict[str, Any]) -> str:
    """What the user asked, from a root span: OpenInference input.value, Traceloop entity input."""
    return _turn(attrs, (("input.value", "input"), ("traceloop.entity.input", "inputs"),
                         ("gen_ai.task.input", "inputs")), "user")


def turn_output(attrs: dict[str, Any]) -> str:
    """The agent's answer, from a root span; "" when it states none (e.g. its last AI message only calls tools)."""
    return _turn(attrs, (("output.value", "output"), ("traceloop.entity.output", "outputs"),
                         ("gen_ai.task.output", "outputs")), "assistant")
