"""Conversations that contain each call-to-call diff case, sent through the REST ingest API.

Every message text is a multiple of 4 bytes and every call reports input_tokens = its input's
bytes / 4, so each message's share of the call's tokens (its UTF-8 size, pipeline.ingest.
normalise.digest.message_tokens) is exactly its bytes / 4: the tests can state every figure.

Token counts of the messages used below:
  SYSTEM 100 · SYSTEM_V2 100 · ASK 20 · CALL_OSLO 8 (text "get_weather({"city": "Tromsoe"})")
  RESULT_OSLO 200 · CALL_BERLIN 8 · RESULT_BERLIN 100 · ELIDED 10 · ANSWER 10 · FOLLOW_UP 20 · SUMMARY 20
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from rest_framework.test import APIClient

from pipeline.models import ApiKey, CompressionEvent, Conversation, LLMCall
from tests.api_client import client_with

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def padded(text: str, size: int) -> str:
    """`text` padded with dots to `size` bytes (ASCII)."""
    assert len(text) <= size
    return text + "." * (size - len(text))


SYSTEM = {"role": "system", "content": padded("You are a weather agent. Answer briefly.", 400)}
SYSTEM_V2 = {"role": "system", "content": padded("You are a weather agent. Answer in French.", 400)}
ASK = {"role": "user", "content": padded("Weather in Tromsoe and Hamburg?", 80)}
CALL_OSLO = {"role": "assistant", "tool_calls": [{"id": "call_1", "name": "get_weather",
                                                  "arguments": {"city": "Tromsoe"}}]}
RESULT_OSLO = {"role": "tool", "tool_call_id": "call_1", "content": padded("Tromsoe: 4 C, snow.", 800)}
CALL_BERLIN = {"role": "assistant", "tool_calls": [{"id": "call_2", "name": "get_weather",
                                                    "arguments": {"city": "Hamburg"}}]}
RESULT_BERLIN = {"role": "tool", "tool_call_id": "call_2", "content": padded("Hamburg: 11 C, rain.", 400)}
ELIDED = {"role": "tool", "tool_call_id": "call_1", "content": padded("[elided: 800 bytes]", 40)}
ANSWER = {"role": "assistant", "content": padded("Snow, then rain.", 40)}
FOLLOW_UP = {"role": "user", "content": padded("And tomorrow?", 80)}
SUMMARY = {"role": "user", "content": padded("Summary: asked about two cities.", 80)}

def message_bytes(message: dict[str, Any]) -> int:
    if message.get("tool_calls"):
        return 32  # get_weather({"city": "<7 letters>"})
    return len(message["content"].encode())


def input_tokens(messages: list[dict[str, Any]]) -> int:
    total = sum(message_bytes(m) for m in messages)
    assert total % 4 == 0
    return total // 4


@dataclass
class Case:
    conversation: Conversation
    calls: list[LLMCall]  # oldest first
    compressions: list[CompressionEvent]


class Events:
    """Events of one conversation, posted in one ingest request."""

    def __init__(self, external_id: str) -> None:
        self.external_id = external_id
        self.events: list[dict[str, Any]] = []
        self.calls = 0

    def _base(self, round_id: str) -> dict[str, Any]:
        return {"conversation_id": self.external_id, "round_id": round_id}

    def turn(self, round_id: str, at: timedelta, user_message: str, ended: timedelta) -> None:
        self.events.append({**self._base(round_id), "type": "round_start", "timestamp": (T0 + at).isoformat(),
                            "user_message": user_message})
        self.events.append({**self._base(round_id), "type": "round_end", "timestamp": (T0 + ended).isoformat(),
                            "final_answer": "done"})

    def llm(self, round_id: str, at: timedelta, messages: list[dict[str, Any]], *,
            cache_read_tokens: int = 0, output: dict[str, Any] | None = None) -> None:
        self.calls += 1
        event = {**self._base(round_id), "type": "llm_call", "call_id": f"llm-{self.calls}", "model": "gpt-4o",
                 "provider": "openai", "started_at": (T0 + at).isoformat(), "duration_ms": 500,
                 "input_tokens": input_tokens(messages), "output_tokens": 10, "context_window": 128_000,
                 "input_messages": messages, "output_messages": [output or ANSWER]}
        if cache_read_tokens:
            event["cache_read_tokens"] = cache_read_tokens
        self.events.append(event)

    def compression(self, round_id: str, at: timedelta, before: list[dict[str, Any]],
                    after: list[dict[str, Any]]) -> None:
        """What `before` had and `after` has not was folded into SUMMARY."""
        self.events.append({**self._base(round_id), "type": "compression",
                            "compression_id": f"cmp-{at.total_seconds()}", "timestamp": (T0 + at).isoformat(),
                            "strategy": "extract", "tokens_before": input_tokens(before),
                            "tokens_after": input_tokens(after), "before_messages": before, "after_messages": after,
                            "summarised": [i for i, m in enumerate(before) if m not in after],
                            "summary": SUMMARY["content"]})

    def payload(self) -> dict[str, Any]:
        return {"schema_version": "1.0", "events": self.events}

    def send(self, api: APIClient) -> Case:
        """POST the events with `api` (a DRF test client, or anything with the same `post`)."""
        reply = api.post("/api/ingest/", self.payload(), format="json")
        assert reply.status_code == 200, reply.json()
        conversation = Conversation.objects.get(external_id=self.external_id)
        calls = list(LLMCall.objects.filter(conversation=conversation).order_by("started_at", "pk"))
        assert len(calls) == self.calls
        compressions = list(CompressionEvent.objects.filter(conversation=conversation).order_by("occurred_at"))
        return Case(conversation, calls, compressions)


def ingest_api() -> APIClient:
    return client_with(ApiKey.generate("diff cases")[1])


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def append_only(api: APIClient, external_id: str = "diff-append") -> Case:
    """Each call extends the previous input: [S, Q] → [S, Q, call, result] → [+ call, result];
    the provider reports 100 cache-read tokens on the second call and 300 on the third."""
    c = Events(external_id)
    c.turn("r1", s(0), "Weather in Tromsoe and Hamburg?", s(10))
    c.llm("r1", s(1), [SYSTEM, ASK], output=CALL_OSLO)
    c.llm("r1", s(3), [SYSTEM, ASK, CALL_OSLO, RESULT_OSLO], cache_read_tokens=100, output=CALL_BERLIN)
    c.llm("r1", s(5), [SYSTEM, ASK, CALL_OSLO, RESULT_OSLO, CALL_BERLIN, RESULT_BERLIN], cache_read_tokens=300)
    return c.send(api)


def edit_in_the_middle(api: APIClient, external_id: str = "diff-edit") -> Case:
    """The agent shortens the first tool result in place before the next call: the prefix
    breaks at it, the two messages after it are kept but no longer cacheable."""
    c = Events(external_id)
    c.turn("r1", s(0), "Weather in Tromsoe and Hamburg?", s(10))
    c.llm("r1", s(1), [SYSTEM, ASK, CALL_OSLO, RESULT_OSLO, CALL_BERLIN, RESULT_BERLIN])
    c.llm("r1", s(3), [SYSTEM, ASK, CALL_OSLO, ELIDED, CALL_BERLIN, RESULT_BERLIN, ANSWER], cache_read_tokens=100)
    return c.send(api)


def compression(api: APIClient, external_id: str = "diff-compression") -> Case:
    """A recorded compression between the calls replaces the question and the first call and
    result by a summary: a cache break that the compression explains."""
    c = Events(external_id)
    before = [SYSTEM, ASK, CALL_OSLO, RESULT_OSLO, CALL_BERLIN, RESULT_BERLIN]
    after = [SYSTEM, SUMMARY, CALL_BERLIN, RESULT_BERLIN]
    c.turn("r1", s(0), "Weather in Tromsoe and Hamburg?", s(5))
    c.llm("r1", s(1), before)
    c.turn("r2", s(10), "And tomorrow?", s(20))
    c.compression("r2", s(11), before, after)
    c.llm("r2", s(12), [*after, FOLLOW_UP])
    return c.send(api)


def system_prompt_change(api: APIClient, external_id: str = "diff-system") -> Case:
    """The system prompt changes between two turns: nothing of the prefix is kept."""
    c = Events(external_id)
    c.turn("r1", s(0), "Weather in Tromsoe and Hamburg?", s(5))
    c.llm("r1", s(1), [SYSTEM, ASK])
    c.turn("r2", s(10), "And tomorrow?", s(20))
    c.llm("r2", s(11), [SYSTEM_V2, ASK, ANSWER, FOLLOW_UP])
    return c.send(api)
