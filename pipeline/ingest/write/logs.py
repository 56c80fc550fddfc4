"""GenAI message events that arrive as OTLP logs, attached to their LLM calls.

Instrumentations in event mode send the messages of a chat call as log records rather than
span attributes: the current `gen_ai.client.inference.operation.details` event, or the
deprecated per-message events (`gen_ai.system.message`, `gen_ai.user.message`,
`gen_ai.assistant.message`, `gen_ai.tool.message`, `gen_ai.choice`). They are kept as
SpanLog rows and applied whenever a log or an LLM span of the trace arrives, so either may
come first. A record that names the LLM call's span goes to that call; OpenLLMetry names
the trace's root span instead (research doc §5.3), so those are split at each `gen_ai.choice`
(one per call) and handed to the trace's LLM calls in start order.
Messages carried on the span itself always win: logs only fill calls whose span has none, and
a call's messages are rebuilt from all its logs whenever more of them arrive.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from pipeline.ingest.normalise import messages as msg
from pipeline.ingest.write import sql
from pipeline.ingest.write.linking import save_requests
from pipeline.ingest.normalise.span import llm_fields
from pipeline.ingest.records import LogRecord, SpanRecord
from pipeline.ingest.write.rows import jsonable
from pipeline.ingest.write.sql import update_rows
from pipeline.insight.costs import price_llm_call
from pipeline.ingest.normalise.values import json_dict, present, to_text
from pipeline.models import LLMCall, Span, SpanLog

DETAILS = "gen_ai.client.inference.operation.details"
CHOICE = "gen_ai.choice"
ROLE_EVENTS = {
    "gen_ai.system.message": "system", "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant", "gen_ai.tool.message": "tool",
}
GENAI_EVENTS = {DETAILS, CHOICE, *ROLE_EVENTS}
# What a call's log messages decide; the rest of the call is its span's.
REBUILT_FIELDS = ["input_messages", "output_messages", "input_digest", "output_digest", "finish_reason",
                  "input_tokens", "output_tokens", "total_tokens", "context_window", "context_tokens", "context_composition",
                  "tokens_pending", "cost_usd"]
# What pricing reads of a call besides the rebuilt counts (pipeline.insight.costs.PricedCall).
PRICED_FIELDS = ("model", "request_model", "provider", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens",
                 "started_at", "cost_usd")


def save_logs(logs: Iterable[LogRecord]) -> int:
    rows = []
    for log in logs:
        if not log.trace_id or log.event_name not in GENAI_EVENTS:
            continue
        body, attributes = jsonable(log.body), jsonable(log.attributes)
        digest = hashlib.sha256(json.dumps(
            [log.trace_id, log.span_id, log.time_unix_nano, log.event_name, body, attributes],
            sort_keys=True, default=str,
        ).encode()).hexdigest()
        rows.append(SpanLog(trace_id=log.trace_id, span_id=log.span_id, time_unix_nano=log.time_unix_nano,
                            event_name=log.event_name, body=body, attributes=attributes, digest=digest))
    SpanLog.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def _tool_call_parts(calls: Any) -> list[dict[str, Any]]:
    parts = []
    for call in calls if isinstance(calls, list) else []:
        if isinstance(call, dict):
            function = call.get("function") if isinstance(call.get("function"), dict) else call
            parts.append(msg.tool_call_part(call.get("id"), function.get("name"), function.get("arguments")))
    return parts


def _event_message(log: SpanLog) -> msg.Message:
    body = log.body if isinstance(log.body, dict) else {"content": log.body}
    if log.event_name == CHOICE:
        inner = body.get("message") if isinstance(body.get("message"), dict) else {}
        parts = [msg.text_part(inner["content"])] if present(inner.get("content")) else []
        parts += _tool_call_parts(inner.get("tool_calls") or body.get("tool_calls"))
        message: msg.Message = {"role": to_text(inner.get("role") or "assistant"), "parts": parts}
        if present(body.get("finish_reason")):
            message["finish_reason"] = body["finish_reason"]
        return message
    role = ROLE_EVENTS[log.event_name]
    if role == "tool" and present(body.get("id")):
        return {"role": role, "parts": [{"type": "tool_call_response", "id": to_text(body["id"]),
                                         "response": body.get("content", "")}]}
    parts = [msg.text_part(body["content"])] if present(body.get("content")) else []
    return {"role": role, "parts": parts + _tool_call_parts(body.get("tool_calls"))}


def messages_from_logs(logs: list[SpanLog]) -> tuple[list[msg.Message], list[msg.Message]]:
    """(input messages, output messages) of one LLM call from its log records."""
    inputs: list[msg.Message] = []
    outputs: list[msg.Message] = []
    for log in logs:
        if log.event_name == DETAILS:
            attrs = {**(log.attributes or {}), **json_dict(log.body)}
            inputs += msg.input_messages(attrs)
            outputs += msg.output_messages(attrs)
        elif log.event_name == CHOICE:
            outputs.append(_event_message(log))
        else:
            inputs.append(_event_message(log))
    return inputs, outputs


def _split_per_call(logs: list[SpanLog]) -> list[list[SpanLog]]:
    """Consecutive events of one trace, cut after each choice / details event: one group per call."""
    groups: list[list[SpanLog]] = [[]]
    for log in logs:
        groups[-1].append(log)
        if log.event_name in (CHOICE, DETAILS):
            groups.append([])
    return [g for g in groups if g]


def rebuilt_conversations(trace_ids: Iterable[str]) -> set[int]:
    """The conversations `apply_logs(trace_ids)` may write: those of the traces' LLM calls (a call
    sits in its span's conversation unless an operator moved it)."""
    out: set[int] = set()
    for chunk in sql.chunked(sorted(set(trace_ids))):
        out.update(c for (c,) in sql.fetch(f"SELECT DISTINCT conversation_id FROM {sql.table(LLMCall)} "
                                           f"WHERE trace_id IN ({sql.marks(chunk)})", list(chunk)))
    return out


def apply_logs(trace_ids: set[str]) -> tuple[set[int], set[int]]:
    """Rebuild the messages of the LLM calls of `trace_ids` from their logs; (round ids, conversation ids).

    Each call's messages are rebuilt from all its log records, in time order, whenever they
    differ from what is stored, so logs that arrive in a later request extend the call, and a
    re-send changes nothing. A call whose span carries messages itself keeps them.
    """
    traces = sorted(trace_ids)
    if not sql.fetch(f"SELECT 1 FROM {sql.table(SpanLog)} WHERE trace_id IN ({sql.marks(traces)}) LIMIT 1", traces):
        return set(), set()  # the common case, checked without the ORM's per-query cost
    logs_by_trace: dict[str, list[SpanLog]] = defaultdict(list)
    for log in SpanLog.objects.filter(trace_id__in=traces).order_by("time_unix_nano", "id"):
        logs_by_trace[log.trace_id].append(log)
    calls_by_trace: dict[str, list[LLMCall]] = defaultdict(list)
    for call in LLMCall.objects.filter(trace_id__in=list(logs_by_trace)).only(
        "id", "trace_id", "span_id", "round_id", "conversation_id", "input_messages", "output_messages", *PRICED_FIELDS,
    ).order_by("started_at", "id"):
        calls_by_trace[call.trace_id].append(call)

    rebuilt: dict[tuple[str, str], tuple[LLMCall, list[msg.Message], list[msg.Message]]] = {}
    for trace_id, logs in logs_by_trace.items():
        calls = calls_by_trace.get(trace_id, [])
        by_span = {c.span_id: c for c in calls}
        direct: dict[int, list[SpanLog]] = defaultdict(list)
        shared: list[SpanLog] = []
        for log in logs:
            call = by_span.get(log.span_id)
            (direct[call.id] if call else shared).append(log)
        others = [c for c in calls if c.id not in direct]
        assigned = {c.id: g for c, g in zip(others, _split_per_call(shared), strict=False)}
        assigned.update(direct)
        for call in calls:
            if call.id in assigned:
                inputs, outputs = messages_from_logs(assigned[call.id])
                if (inputs or outputs) and (inputs, outputs) != (call.input_messages, call.output_messages):
                    rebuilt[(call.trace_id, call.span_id)] = (call, inputs, outputs)
    changed = _rebuild(rebuilt)
    return {c.round_id for c in changed if c.round_id}, {c.conversation_id for c in changed}


def _rebuild(rebuilt: dict[tuple[str, str], tuple[LLMCall, list[msg.Message], list[msg.Message]]]) -> list[LLMCall]:
    """The LLM fields of each call as if its span had carried the messages from its logs.

    Token counts, context composition and finish reason are derived again from the span and
    the messages (pipeline.ingest.normalise.span.llm_fields), and the cost from the counts, so
    nothing stays computed from an earlier, shorter set of messages.
    """
    spans: list[tuple[str, str, dict[str, Any]]] = []
    for chunk in sql.chunked(sorted(rebuilt)):
        spans += Span.objects.filter(
            trace_id__in={k[0] for k in chunk}, span_id__in={k[1] for k in chunk}
        ).values_list("trace_id", "span_id", "attributes")
    changed = []
    for trace_id, span_id, attributes in spans:
        if (trace_id, span_id) not in rebuilt:
            continue
        call, inputs, outputs = rebuilt[(trace_id, span_id)]
        if msg.input_messages(attributes) or msg.output_messages(attributes):
            continue  # the span's own messages win
        record = SpanRecord(trace_id, span_id, "", 0, attributes={
            **attributes, "gen_ai.input.messages": inputs, "gen_ai.output.messages": outputs,
        })
        for name, value in llm_fields(record).items():
            if name in REBUILT_FIELDS:
                setattr(call, name, value)
        price_llm_call(call)  # the counts may have changed with the messages
        changed.append(call)
    update_rows(LLMCall, sorted(changed, key=lambda c: c.pk), REBUILT_FIELDS)
    save_requests(changed, replace=True)
    return changed
