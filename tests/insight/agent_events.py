"""REST ingest events for conversations built to contain (or not) each finding, and what the
findings API answers about them.

A conversation is written as the agent would report it: each LLM call with the whole input it
sent and the output it got, each tool call with its id, arguments and observation, sent to
`POST /api/ingest/` through the test client, so digests, links and counters are computed by
the real ingest.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from rest_framework.test import APIClient

from pipeline.models import ApiKey, LLMCall, ToolCall
from pipeline.models.apikeys import Scope
from tests.api_client import client_with

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
SYSTEM = "You are a weather assistant."
Message = dict[str, Any]


def at(seconds: float, start: datetime = T0) -> str:
    return (start + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def system(text: str = SYSTEM) -> Message:
    return {"role": "system", "content": text}


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def assistant(text: str | None = None, *calls: tuple[str, str, dict]) -> Message:
    """An assistant message: text, and tool calls as (id, name, arguments)."""
    message: Message = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [{"id": i, "name": name, "arguments": args} for i, name, args in calls]
    return message


def result(tool_call_id: str, text: str) -> Message:
    return {"role": "tool", "tool_call_id": tool_call_id, "content": text}


class Conversation:
    """Events of one conversation, in the order they happened; `send()` ingests them all."""

    def __init__(self, external_id: str, round_id: str = "r1", *, start: datetime = T0) -> None:
        self.external_id = external_id
        self.start = start
        self.round_id = round_id
        self.events: list[dict] = []
        self.clock = 0.0

    def _base(self) -> dict:
        return {"conversation_id": self.external_id, "round_id": self.round_id}

    def tick(self) -> str:
        self.clock += 1
        return at(self.clock, self.start)

    def turn(self, round_id: str, question: str) -> Conversation:
        self.round_id = round_id
        self.events.append({**self._base(), "type": "round_start", "timestamp": self.tick(),
                            "user_message": question})
        return self

    def llm(self, messages: list[Message], output: Message, *, input_tokens: int | None = None,
            window: int = 128_000, context_tokens: int | None = None) -> Conversation:
        event = {**self._base(), "type": "llm_call", "call_id": f"llm-{len(self.events)}", "model": "gpt-4o",
                 "started_at": self.tick(), "duration_ms": 500, "input_messages": messages,
                 "output_messages": [output], "input_tokens": input_tokens or 100 * len(messages),
                 "output_tokens": 20, "context_window": window}
        if context_tokens is not None:
            event["context_tokens"] = context_tokens
        self.events.append(event)
        return self

    def tool(self, tool_call_id: str, name: str, arguments: dict, observation: str, *, tokens: int | None = 10,
             error: tuple[str, str] | None = None, retries: int = 0) -> Conversation:
        event = {**self._base(), "type": "tool_call", "tool_name": name, "tool_call_id": tool_call_id,
                 "call_id": f"tool-{len(self.events)}", "arguments": arguments, "observation": observation,
                 "started_at": self.tick(), "duration_ms": 100, "retry_count": retries}
        if tokens is not None:  # else ctxlens counts them, after the ingest response
            event["observation_tokens"] = tokens
        if error:
            event.update(status="error", error_type=error[0], error_message=error[1])
        self.events.append(event)
        return self

    def compression(self, tokens_before: int = 9000, tokens_after: int = 3000) -> Conversation:
        self.events.append({**self._base(), "type": "compression", "compression_id": f"cmp-{len(self.events)}",
                            "timestamp": self.tick(), "strategy": "truncate", "tokens_before": tokens_before,
                            "tokens_after": tokens_after})
        return self

    def payload(self) -> dict:
        return {"schema_version": "1.0", "events": self.events}

    def send(self, api: APIClient) -> int:
        reply = api.post("/api/ingest/", self.payload(), format="json")
        assert reply.status_code == 200, reply.json()
        [conversation_id] = reply.json()["conversation_ids"]
        return conversation_id


def ingest_client() -> APIClient:
    return client_with(ApiKey.generate("agent", scope=Scope.INGEST)[1])


def read_client() -> APIClient:
    return client_with(ApiKey.generate("reader", scope=Scope.READ)[1])


def calls(conversation_id: int) -> list[LLMCall]:
    """The conversation's LLM calls in order (#1 is calls(...)[0])."""
    return list(LLMCall.objects.filter(conversation_id=conversation_id).order_by("started_at"))


def tool(conversation_id: int, tool_call_id: str) -> ToolCall:
    return ToolCall.objects.get(conversation_id=conversation_id, tool_call_id=tool_call_id)


def finding(code: str, severity: str, message: str, *, call: LLMCall | None = None, tool_row: ToolCall | None = None,
            tool_call_id: str | None = None, llm_call_id: int | None = None) -> dict:
    """The API's finding for a call or a stored tool call."""
    source = call or tool_row
    return {
        "code": code, "severity": severity, "message": message,
        "round_id": source.round_id if source else None,
        "llm_call_id": llm_call_id if llm_call_id is not None else (
            call.pk if call else tool_row.llm_call_id if tool_row else None),
        "tool_call_id": tool_call_id if tool_call_id is not None else (tool_row.tool_call_id if tool_row else None),
        "tool_call": tool_row.pk if tool_row else None,
    }
