"""Validated REST events → SpanRecords shaped like the spans ctxlens's own pipeline emits.

One trace per turn (`invoke_agent` root, `chat` / `execute_tool` / `compress_context` /
`activate_skill` children), with OTel GenAI and `ctxlens.*` attributes (pipeline.semconv),
so the normaliser needs no REST-specific branch. Trace and span ids are hashes of the
client's ids: a re-sent event maps to the same (trace_id, span_id) and the store's
first-write-wins idempotency applies unchanged.

A `round_start` without its `round_end` becomes an open turn span (end time 0): the turn
shows as running. The `round_end` produces the same span, ended; the store replaces the open
version with it, and `pipeline.ingest.write.open_spans` carries over what the start said.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from django.utils import timezone

from pipeline import semconv as sc
from pipeline.ingest.records import SpanRecord

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SPAN_KIND_INTERNAL, SPAN_KIND_CLIENT = 1, 3
STATUS_OK, STATUS_ERROR = 1, 2
ID_NAMESPACE = "ctxlens-rest"


def _digest(*parts: str) -> str:
    # Length-prefixed, so no choice of ids can make two different tuples hash alike.
    joined = "".join(f"{len(p)}:{p}" for p in (ID_NAMESPACE, *parts))
    return hashlib.sha256(joined.encode()).hexdigest()


def trace_id_for(conversation_id: str, round_id: str | None) -> str:
    if round_id:
        return _digest("round", conversation_id, round_id)[:32]
    return _digest("conversation", conversation_id)[:32]


def span_id_for(trace_id: str, kind: str, own_id: str = "") -> str:
    return _digest("span", trace_id, kind, own_id)[:16]


def to_nanos(moment: datetime) -> int:
    delta = moment - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _end(start: int, event: dict[str, Any]) -> int:
    if event.get("ended_at") is not None:
        return to_nanos(event["ended_at"])
    return start + round(float(event.get("duration_ms") or 0.0) * 1_000_000)


def _set(attrs: dict[str, Any], key: str, value: Any) -> None:
    if value is not None and value != "":
        attrs[key] = value


def genai_message(message: dict[str, Any]) -> dict[str, Any]:
    """A REST message ({role, content, tool_calls, tool_call_id} or {role, parts}) in GenAI parts shape."""
    if message.get("parts") is not None:
        parts = list(message["parts"])
    else:
        parts = []
        content = message.get("content")
        if message["role"] == "tool" and message.get("tool_call_id"):
            parts.append({"type": "tool_call_response", "id": message["tool_call_id"], "response": content or ""})
        elif content:
            parts.append({"type": "text", "content": content})
        for call in message.get("tool_calls") or ():
            parts.append({"type": "tool_call", "id": call["id"], "name": call["name"],
                          "arguments": call.get("arguments", {})})
    out: dict[str, Any] = {"role": message["role"], "parts": parts}
    for extra in ("name", "finish_reason"):
        if message.get(extra):
            out[extra] = message[extra]
    return out


def _messages(messages: list[dict[str, Any]]) -> str:
    return _json([genai_message(m) for m in messages])


def _outcome(record: SpanRecord, event: dict[str, Any]) -> SpanRecord:
    if event.get("status") == "error":
        record.status_code = STATUS_ERROR
        record.status_message = event.get("error_message") or ""
        _set(record.attributes, "error.type", event.get("error_type") or "error")
    else:
        record.status_code = STATUS_OK
    return record


class _Batch:
    """The records of one request; remembers each turn's span so start and end merge."""

    def __init__(self) -> None:
        self.records: list[SpanRecord] = []
        self.turns: dict[tuple[str, str], SpanRecord] = {}
        self.conversations: dict[str, dict[str, Any]] = {}
        # Turns with an end but no start yet: dated from the batch once it is complete.
        self.undated: dict[int, SpanRecord] = {}

    def base(self, event: dict[str, Any], kind: str, own_id: str, name: str, start: int) -> SpanRecord:
        conversation_id, round_id = event["conversation_id"], event.get("round_id")
        trace_id = trace_id_for(conversation_id, round_id)
        attrs: dict[str, Any] = {sc.CONVERSATION_ID: conversation_id}
        parent = ""
        if round_id:
            attrs[sc.ROUND_ID] = round_id
            parent = span_id_for(trace_id, "round")
        record = SpanRecord(
            trace_id=trace_id, span_id=span_id_for(trace_id, kind, own_id), name=name,
            start_time_unix_nano=start, parent_span_id=parent, kind=SPAN_KIND_INTERNAL, attributes=attrs,
        )
        self.records.append(record)
        return record

    def turn(self, event: dict[str, Any]) -> SpanRecord:
        key = (event["conversation_id"], event["round_id"])
        record = self.turns.get(key)
        if record is None:
            record = self.base(event, "round", "", "invoke_agent", to_nanos(event["timestamp"]))
            record.parent_span_id = ""
            record.attributes["gen_ai.operation.name"] = "invoke_agent"
            self.turns[key] = record
        if event.get("agent_name"):
            record.name = f"invoke_agent {event['agent_name']}"
            record.attributes["gen_ai.agent.name"] = event["agent_name"]
        _set(record.attributes, sc.ROUND_USER_MESSAGE, event.get("user_message"))
        return record

    def add(self, event: dict[str, Any]) -> None:
        getattr(self, f"add_{event['type']}")(event)

    def add_conversation(self, event: dict[str, Any]) -> None:
        # Applied at the end (`_apply_conversations`): it describes the whole conversation.
        self.conversations.setdefault(event["conversation_id"], event)

    def add_round_start(self, event: dict[str, Any]) -> None:
        record = self.turn(event)
        record.start_time_unix_nano = min(record.start_time_unix_nano, to_nanos(event["timestamp"]))
        self.undated.pop(id(record), None)

    def add_round_end(self, event: dict[str, Any]) -> None:
        key = (event["conversation_id"], event["round_id"])
        had_start = key in self.turns
        record = self.turn(event)
        if event.get("started_at"):
            record.start_time_unix_nano = to_nanos(event["started_at"])
        elif not had_start:
            self.undated[id(record)] = record
        record.end_time_unix_nano = to_nanos(event["timestamp"])
        _set(record.attributes, sc.ROUND_FINAL_ANSWER, event.get("final_answer"))
        _outcome(record, event)

    def add_llm_call(self, event: dict[str, Any]) -> None:
        start = to_nanos(event["started_at"])
        record = self.base(event, "llm_call", event["call_id"], f"chat {event['model']}", start)
        record.kind = SPAN_KIND_CLIENT
        record.end_time_unix_nano = _end(start, event)
        attrs = record.attributes
        attrs["gen_ai.operation.name"] = "chat"
        attrs["gen_ai.request.model"] = event["model"]
        _set(attrs, "gen_ai.response.model", event.get("response_model"))
        _set(attrs, "gen_ai.provider.name", event.get("provider"))
        for field, key in (
            ("input_tokens", "gen_ai.usage.input_tokens"),
            ("output_tokens", "gen_ai.usage.output_tokens"),
            ("cache_read_tokens", "gen_ai.usage.cache_read.input_tokens"),
            ("cache_write_tokens", "gen_ai.usage.cache_creation.input_tokens"),
            ("reasoning_tokens", "gen_ai.usage.reasoning.output_tokens"),
            ("context_window", sc.CONTEXT_WINDOW),
            ("context_tokens", sc.CONTEXT_TOKENS),
        ):
            _set(attrs, key, event.get(field))
        if event.get("context_composition") is not None:
            attrs[sc.CONTEXT_COMPOSITION] = _json(event["context_composition"])
        if event.get("input_messages") is not None:
            attrs["gen_ai.input.messages"] = _messages(event["input_messages"])
        if event.get("output_messages") is not None:
            attrs["gen_ai.output.messages"] = _messages(event["output_messages"])
        if event.get("finish_reason"):
            attrs["gen_ai.response.finish_reasons"] = [event["finish_reason"]]
        _outcome(record, event)

    def add_tool_call(self, event: dict[str, Any]) -> None:
        start = to_nanos(event["started_at"])
        own_id = event.get("call_id") or event["tool_call_id"]
        record = self.base(event, "tool_call", own_id, f"execute_tool {event['tool_name']}", start)
        record.end_time_unix_nano = _end(start, event)
        attrs = record.attributes
        attrs["gen_ai.operation.name"] = "execute_tool"
        attrs["gen_ai.tool.name"] = event["tool_name"]
        _set(attrs, "gen_ai.tool.call.id", event.get("tool_call_id"))
        arguments = event.get("arguments", {})
        attrs["gen_ai.tool.call.arguments"] = arguments if isinstance(arguments, str) else _json(arguments)
        observation = event.get("observation")
        if observation is not None:
            attrs["gen_ai.tool.call.result"] = observation if isinstance(observation, str) else _json(observation)
        for field, key in (
            ("observation_tokens", sc.TOOL_OBSERVATION_TOKENS),
            ("input_tokens", sc.SEED_TOOL_INPUT_TOKENS),
            ("output_level", sc.TOOL_OUTPUT_LEVEL),
            ("retry_count", sc.TOOL_RETRY_COUNT),
            ("cache_hit", sc.TOOL_CACHE_HIT),
            ("error_code", sc.TOOL_ERROR_CODE),
            ("artifact_id", sc.TOOL_ARTIFACT_ID),
        ):
            _set(attrs, key, event.get(field))
        if event.get("status") == "error":
            _set(attrs, sc.TOOL_ERROR_TYPE, event.get("error_type"))
        _outcome(record, event)

    def add_compression(self, event: dict[str, Any]) -> None:
        start = to_nanos(event["timestamp"])
        record = self.base(event, "compression", event["compression_id"], "compress_context", start)
        record.end_time_unix_nano = _end(start, event)
        attrs = record.attributes
        attrs[sc.SPAN_KIND] = sc.SPAN_KIND_COMPRESSION
        attrs[sc.COMPRESSION_STRATEGY] = event["strategy"]
        attrs[sc.COMPRESSION_TOKENS_BEFORE] = event["tokens_before"]
        attrs[sc.COMPRESSION_TOKENS_AFTER] = event["tokens_after"]
        before, after = event.get("before_messages"), event.get("after_messages")
        _set(attrs, sc.COMPRESSION_MESSAGES_BEFORE, event.get("messages_before", len(before or ()) or None))
        _set(attrs, sc.COMPRESSION_MESSAGES_AFTER, event.get("messages_after", len(after or ()) or None))
        _set(attrs, sc.COMPRESSION_CONTEXT_WINDOW, event.get("context_window"))
        for field, key in (
            ("tokens_before_by_category", sc.COMPRESSION_TOKENS_BEFORE_BY_CATEGORY),
            ("tokens_after_by_category", sc.COMPRESSION_TOKENS_AFTER_BY_CATEGORY),
            ("dropped", sc.COMPRESSION_DROPPED),
            ("summarised", sc.COMPRESSION_SUMMARISED),
        ):
            if event.get(field) is not None:
                attrs[key] = _json(event[field])
        if before is not None:
            attrs[sc.COMPRESSION_BEFORE_MESSAGES] = _messages(before)
        if after is not None:
            attrs[sc.COMPRESSION_AFTER_MESSAGES] = _messages(after)
        _set(attrs, sc.COMPRESSION_SUMMARY, event.get("summary"))
        if event.get("estimated_costs") is not None:
            attrs[sc.COMPRESSION_ESTIMATED_COSTS] = _json(event["estimated_costs"])
        _set(attrs, sc.COMPRESSION_SELECTION, event.get("selection"))
        record.status_code = STATUS_OK

    def add_skill_activation(self, event: dict[str, Any]) -> None:
        start = to_nanos(event["timestamp"])
        name = event["skill_name"]
        record = self.base(event, "skill_activation", event["activation_id"], f"activate_skill {name}", start)
        record.end_time_unix_nano = _end(start, event)
        attrs = record.attributes
        attrs[sc.SPAN_KIND] = sc.SPAN_KIND_SKILL
        attrs[sc.SKILL_NAME] = name
        attrs[sc.SKILL_LEVEL] = int(event.get("level", 2))
        chain = event.get("chain")
        if chain is not None:
            attrs[sc.SKILL_CHAIN] = _json(chain)
        _set(attrs, sc.SKILL_DEPTH, event.get("depth") or (len(chain) if chain else None))
        if event.get("context_modifier") is not None:
            attrs[sc.SKILL_CONTEXT_MODIFIER] = _json(event["context_modifier"])
        _set(attrs, sc.SKILL_TOKENS, event.get("tokens"))
        if event.get("resources"):
            attrs[sc.SKILL_RESOURCES] = _json(event["resources"])
        if event.get("messages"):
            attrs[sc.SKILL_MESSAGES] = _json(event["messages"])
        _outcome(record, event)


def _apply_conversations(batch: _Batch) -> None:
    """Conversation metadata onto the conversation's spans in this request.

    When the request has other events of the conversation, the metadata rides on their spans;
    alone, it is one `conversation` span (ctxlens.span.kind=conversation), which creates or
    describes the conversation and belongs to no turn.
    """
    by_conversation: dict[str, list[SpanRecord]] = {}
    for record in batch.records:
        by_conversation.setdefault(record.attributes[sc.CONVERSATION_ID], []).append(record)
    for conversation_id, event in batch.conversations.items():
        records = by_conversation.get(conversation_id)
        if not records:
            start = to_nanos(event["started_at"] if event.get("started_at") else timezone.now())
            record = batch.base(event, "conversation", "", "conversation", start)
            record.end_time_unix_nano = start
            record.status_code = STATUS_OK
            record.attributes[sc.SPAN_KIND] = sc.SPAN_KIND_CONVERSATION
            records = [record]
        _set(records[0].attributes, sc.CONVERSATION_TITLE, event.get("title"))
        for record in records:
            if event.get("agent_name"):
                record.attributes.setdefault("gen_ai.agent.name", event["agent_name"])
            _set(record.attributes, "user.id", event.get("user_id"))
            if event.get("service_name"):
                record.resource = {"service.name": event["service_name"]}


def _date_turns(batch: _Batch) -> None:
    """A round_end without a start: the turn began with its earliest event in this request, if any."""
    earliest: dict[str, int] = {}
    for record in batch.records:
        if id(record) not in batch.undated:
            earliest[record.trace_id] = min(earliest.get(record.trace_id, record.start_time_unix_nano),
                                            record.start_time_unix_nano)
    for record in batch.undated.values():
        record.start_time_unix_nano = min(earliest.get(record.trace_id, record.end_time_unix_nano),
                                          record.end_time_unix_nano)


def events_to_records(events: list[dict[str, Any]]) -> list[SpanRecord]:
    """SpanRecords for validated events (IngestRequestSerializer), in event order."""
    batch = _Batch()
    for event in events:
        batch.add(event)
    _date_turns(batch)
    _apply_conversations(batch)
    return batch.records
