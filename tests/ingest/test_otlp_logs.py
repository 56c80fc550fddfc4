"""POST /v1/logs with the real OpenTelemetry SDK log exporter: GenAI message events reach their spans."""

from __future__ import annotations

import json

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

from pipeline.ingest.records import LogRecord, SpanRecord
from pipeline.ingest.write.store import store_spans
from pipeline.models import Conversation, LLMCall, Round, SpanLog
from tests.otlp_support import JSON, auth, make_key, row_counts, send_chat_with_its_details_event

pytestmark = pytest.mark.django_db(transaction=True)


def test_sdk_log_events_fill_the_messages_of_their_chat_span(otlp_server):
    key = make_key()
    send_chat_with_its_details_event(OTLPSpanExporter(endpoint=f"{otlp_server.url}/v1/traces", headers=auth(key)),
                                     OTLPLogExporter(endpoint=f"{otlp_server.url}/v1/logs", headers=auth(key)))

    call = LLMCall.objects.get()
    assert call.input_messages == [{"role": "user", "parts": [{"type": "text", "content": "Hi?"}]}]
    assert call.output_messages[0]["parts"] == [{"type": "text", "content": "Hello."}]
    assert call.finish_reason == "stop"
    assert SpanLog.objects.get().span_id == call.span_id
    # the turn and the conversation are named after the user's message, as when the span carries it
    assert Round.objects.get().user_message == "Hi?"
    assert Conversation.objects.get().title == "Hi?"


T0 = 1_763_800_000_000_000_000
MS = 1_000_000


@pytest.mark.parametrize("logs_first", [False, True], ids=["span first", "logs first"])
def test_a_turn_whose_messages_come_as_per_message_events_gets_its_user_message(logs_first):
    """OpenLLMetry's deprecated per-message events name the trace's root span: the chat call's input
    is rebuilt from them, and the turn and conversation take the user's question from it."""
    trace, root, chat = "6" * 32, "00000000000000a1", "00000000000000c1"
    spans = [SpanRecord(trace, root, "agent run", T0, T0 + 10 * MS, attributes={"traceloop.span.kind": "workflow"}),
             SpanRecord(trace, chat, "chat gpt-4o", T0 + MS, T0 + 5 * MS, parent_span_id=root, attributes={
                 "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
                 "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 3})]
    logs = [LogRecord(trace, root, T0 + 2 * MS, "gen_ai.system.message", {"content": "You are terse."}),
            LogRecord(trace, root, T0 + 2 * MS, "gen_ai.user.message", {"content": "What is 6 x 7?\nQuickly."}),
            LogRecord(trace, root, T0 + 4 * MS, "gen_ai.choice",
                      {"index": 0, "finish_reason": "stop", "message": {"content": "42"}})]
    for batch in ([([], logs), (spans, [])] if logs_first else [(spans, []), ([], logs)]):
        store_spans(batch[0], logs=batch[1])

    assert LLMCall.objects.get().input_messages[-1]["parts"][0]["content"] == "What is 6 x 7?\nQuickly."
    turn = Round.objects.get()
    assert (turn.user_message, turn.final_answer) == ("What is 6 x 7?\nQuickly.", "42")
    assert Conversation.objects.get().title == "What is 6 x 7?"


def test_logs_endpoint_answers_in_json_and_rejects_bad_ids(otlp_server):
    body = {"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"timeUnixNano": "1763800000000000000", "traceId": "5b8efff798038103d269b633813fc60c",
         "spanId": "eee19b7ec3c1b174", "eventName": "gen_ai.user.message", "body": {"kvlistValue": {"values": [
             {"key": "content", "value": {"stringValue": "Hi"}}]}}},
        {"traceId": "W47/95gDgQPSabYzgT/GDA==", "spanId": "7uGbfsPBsXQ=", "eventName": "gen_ai.user.message"},
    ]}]}]}
    before = row_counts()
    reply = httpx.post(f"{otlp_server.url}/v1/logs", content=json.dumps(body),
                       headers={**auth(make_key()), "Content-Type": JSON})
    assert (reply.status_code, reply.headers["content-type"]) == (200, JSON)
    partial = reply.json()["partialSuccess"]
    assert partial["rejectedLogRecords"] == "1" and "hex" in partial["errorMessage"]
    assert row_counts() == before
    assert SpanLog.objects.get().body == {"content": "Hi"}
