"""OTel GenAI chat and tool spans of one agent turn, as span records for store_spans."""

from __future__ import annotations

import json

from pipeline.ingest.records import SpanRecord

T0 = 1_763_800_000_000_000_000
MS = 1_000_000
ROOT = "00000000000000a0"


def chat(trace: str, span_id: str, start: int, model: str, requested: list[str] | tuple[str, ...] = ()) -> SpanRecord:
    """A chat span of `model` at T0 + `start` ms that asks for the tool call ids `requested`
    (else answers "ok"), reporting 10 input and 5 output tokens."""
    parts = [{"type": "tool_call", "id": i, "name": "search", "arguments": {}} for i in requested]
    return SpanRecord(trace, span_id, f"chat {model}", T0 + start * MS, T0 + (start + 1) * MS, parent_span_id=ROOT,
                      attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                                  "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 5,
                                  "gen_ai.output.messages": json.dumps(
                                      [{"role": "assistant", "parts": parts or [{"type": "text", "content": "ok"}]}])})


def tool(trace: str, span_id: str, start: int, observation: str, call_id: str = "") -> SpanRecord:
    """A `search` tool span at T0 + `start` ms whose result is `observation`."""
    attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search",
             "gen_ai.tool.call.result": observation}
    if call_id:
        attrs["gen_ai.tool.call.id"] = call_id
    return SpanRecord(trace, span_id, "execute_tool search", T0 + start * MS, T0 + (start + 1) * MS,
                      parent_span_id=ROOT, attributes=attrs)
