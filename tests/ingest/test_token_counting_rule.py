"""One counting rule: a chat span sent without usage counts (OTel GenAI messages with parts, a
tool call, a tool result and an image) is counted by the server exactly as the runtime counts
the same conversation as LangChain messages for its compression decision — totals and
composition — and counts of a model without a public tokenizer are marked approximate in the
read API and with "≈" on the pages."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from pipeline.models import LLMCall
from pipeline.runtime.context import measure
from pipeline.tokens.counting import MEDIA_TOKENS
from tests.otlp_support import auth, make_key, wait_for_deferred_tokens

pytestmark = pytest.mark.django_db(transaction=True)

REPORT = "Quarterly revenue by region, EUR: north 1.2M, south 0.9M, 东部 1.5M, 西部 0.7M. " * 30
GENAI_MESSAGES = [
    {"role": "system", "parts": [{"type": "text", "content": "You are a sales analyst. Answer in EUR."}]},
    {"role": "user", "parts": [{"type": "text", "content": "What was Q3 revenue? See the chart."},
                               {"type": "uri", "modality": "image", "uri": "https://example.com/q3.png"}]},
    {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_q3", "name": "query_sales",
                                     "arguments": {"quarter": "Q3", "group_by": "region"}}]},
    {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_q3", "response": REPORT}]},
]
LANGCHAIN_MESSAGES = [
    SystemMessage("You are a sales analyst. Answer in EUR."),
    HumanMessage([{"type": "text", "text": "What was Q3 revenue? See the chart."},
                  {"type": "image_url", "image_url": {"url": "https://example.com/q3.png"}}]),
    AIMessage("", tool_calls=[{"id": "call_q3", "name": "query_sales", "args": {"quarter": "Q3", "group_by": "region"}}]),
    ToolMessage(REPORT, tool_call_id="call_q3"),
]


def send_chat_without_usage(server, model: str) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "sales-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers=auth(make_key()))))
    with provider.get_tracer("t").start_as_current_span(f"chat {model}", attributes={
        "gen_ai.operation.name": "chat", "gen_ai.request.model": model, "gen_ai.conversation.id": f"conv-{model}",
        "gen_ai.input.messages": json.dumps(GENAI_MESSAGES, ensure_ascii=False),
    }):
        pass
    provider.shutdown()


@pytest.mark.parametrize("model,approximate", [("claude-sonnet-4-5", True), ("gpt-4o", False)])
def test_server_counts_stored_messages_as_the_runtime_counts_them(otlp_server, client, alice, model, approximate):
    send_chat_without_usage(otlp_server, model)
    wait_for_deferred_tokens()

    runtime = measure(LANGCHAIN_MESSAGES, model)  # what the compression decision sees
    client.force_login(alice)
    call = LLMCall.objects.get()
    detail = client.get(f"/api/conversations/{call.conversation_id}/").json()
    stored = detail["rounds"][0]["llm_calls"][0]
    assert stored["input_tokens"] == runtime.tokens
    assert stored["context_composition"] == runtime.by_category
    assert stored["context_composition"]["user"] > MEDIA_TOKENS  # the image part counts as a media block
    assert stored["context_composition"]["tool_observations"] > 1000
    assert stored["approximate"] is approximate

    page = client.get(reverse("llm-call", args=[call.pk])).content.decode()
    timeline = client.get(reverse("conversation", args=[call.conversation_id])).content.decode()
    assert ('class="approx"' in page, 'class="approx"' in timeline) == (approximate, approximate)
