"""Tool error types through OTLP to a live uvicorn: the design documents' names are kept, the
names older ctxlens agents sent (or an older ctxlens stored) are read as those names, and each
failure shows its class (retryable, permanent, needs a person) in the read API and on the
conversation page."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.urls import reverse
from django.utils import timezone
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode

from pipeline import semconv as sc
from pipeline.models import ToolCall
from pipeline.models.apikeys import Scope
from tests.api_client import client_with
from tests.otlp_support import auth, make_key

pytestmark = pytest.mark.django_db(transaction=True)

# (tool, attribute the agent sets, the name it sends) → (stored name, class)
FAILURES = [
    ("old_pipeline_search", sc.TOOL_ERROR_TYPE, "rate_limited", "rate_limit", "retryable"),  # ctxlens before
    ("old_pipeline_sql", sc.TOOL_ERROR_TYPE, "invalid_input", "invalid_parameters", "permanent"),
    ("old_pipeline_store", "error.type", "internal", "internal_error", "needs_human"),
    ("seed_crm", sc.SEED_TOOL_ERROR_TYPE, "dependency_error", "dependency_error", "needs_human"),  # the documents
    ("seed_form", sc.SEED_TOOL_ERROR_TYPE, "validation_error", "validation_error", "permanent"),
    ("seed_fetch", sc.TOOL_ERROR_TYPE, "resource_error", "resource_error", "retryable"),
    ("third_party", "error.type", "ValueError", "ValueError", ""),  # not ours: kept, no class
]


def send_failures(server) -> None:
    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers=auth(make_key())))
    )
    tracer = provider.get_tracer("agent")
    with tracer.start_as_current_span("invoke_agent helper", attributes={
        "gen_ai.operation.name": "invoke_agent", sc.CONVERSATION_ID: "conv-errors",
    }):
        for tool, attribute, name, _, _ in FAILURES:
            with tracer.start_as_current_span(f"execute_tool {tool}", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool, attribute: name,
            }) as span:
                span.set_status(Status(StatusCode.ERROR, f"{tool} failed"))
    assert provider.force_flush(10_000)
    provider.shutdown()


def test_error_types_are_stored_under_the_documents_names_with_their_class(otlp_server):
    send_failures(otlp_server)

    stored = {t.tool_name: t.error_type for t in ToolCall.objects.all()}
    assert stored == {tool: kept for tool, _, _, kept, _ in FAILURES}
    conversation_id = ToolCall.objects.first().conversation_id
    detail = client_with(make_key(Scope.READ)).get(f"/api/conversations/{conversation_id}/").json()
    served = {t["tool_name"]: (t["error_type"], t["error_class"]) for t in detail["rounds"][0]["tool_calls"]}
    assert served == {tool: (kept, error_class) for tool, _, _, kept, error_class in FAILURES}


def test_the_conversation_page_says_which_failures_need_a_person(otlp_server, client, alice):
    send_failures(otlp_server)
    client.force_login(alice)

    page = client.get(reverse("conversation", args=[ToolCall.objects.first().conversation_id])).content.decode()

    assert page.count("(needs a person)") == 2
    assert page.count("(retryable)") == 2 and page.count("(permanent)") == 2
    assert "<code>internal_error</code>" in page and "<code>internal</code>" not in page


def test_the_migration_renames_rows_stored_under_earlier_names(transactional_db):
    """Rows an earlier ctxlens stored as rate_limited or internal group with the new ones."""
    before = [("pipeline", "0002_tokens_estimated")]
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    now = timezone.now()
    conversation = old.get_model("pipeline", "Conversation").objects.create(
        external_id="stored-earlier", started_at=now, last_activity_at=now)
    for n, error_type in enumerate(("rate_limited", "internal", "ValueError", "")):
        old.get_model("pipeline", "ToolCall").objects.create(
            conversation=conversation, trace_id="a" * 32, span_id=f"{n:016x}", started_at=now,
            tool_name=f"tool{n}", error_type=error_type, success=not error_type)

    executor = MigrationExecutor(connection)
    executor.migrate(latest)

    stored = dict(ToolCall.objects.values_list("tool_name", "error_type"))
    assert stored == {"tool0": "rate_limit", "tool1": "internal_error", "tool2": "ValueError", "tool3": ""}
    assert ToolCall.objects.get(tool_name="tool1").error_class == "needs_human"
