"""What the executor does is visible: cache hits and partial results, sent by the runtime's own
telemetry over the real OTLP exporter to a live server, then read back through the read API and
the conversation and tools pages."""

from __future__ import annotations

import threading

from django.urls import reverse
from langchain_core.tools import StructuredTool

from pipeline.models import Conversation, ToolCall
from pipeline.runtime.agent import run_agent
from pipeline.runtime.demo.fake_model import ScriptedChatModel, calls, tool_call
from pipeline.runtime.executor import RetryPolicy
from pipeline.runtime.telemetry.config import ObservabilityConfig
from pipeline.runtime.telemetry.spans import Telemetry
from tests.api_client import client_with
from tests.otlp_support import auth, make_key

SQL = "SELECT region, SUM(units * unit_price) FROM sales GROUP BY region"


def export_to(server) -> Telemetry:
    config = ObservabilityConfig(otlp_endpoint=server.url, otlp_headers=auth(make_key()))
    return Telemetry.from_config(config, batch=False)


def sales_tool(runs: list[str]) -> StructuredTool:
    def query_sales(sql: str) -> list[dict]:
        """Run SQL on the sales table."""
        runs.append(sql)
        return [{"region": "north", "revenue": 1200}, {"region": "south", "revenue": 900}]

    return StructuredTool.from_function(query_sales, metadata={"ctxlens_cache_policy": "cacheable"})


def test_a_cache_hit_is_stored_and_shown_in_the_timeline_and_tool_statistics(otlp_server, client, alice):
    runs: list[str] = []
    model = ScriptedChatModel.from_script([
        calls(tool_call("query_sales", {"sql": SQL}, "call_first")), "North leads.",
        calls(tool_call("query_sales", {"sql": SQL}, "call_again")), "Still north.",
    ])
    telemetry = export_to(otlp_server)
    run_agent(model, [sales_tool(runs)], [], turns=["Revenue by region?", "And again?"],
              conversation_id="conv-cache", telemetry=telemetry)
    telemetry.shutdown()

    assert runs == [SQL]  # the second round was answered from the cache
    stored = dict(ToolCall.objects.values_list("tool_call_id", "cache_hit"))
    assert stored == {"call_first": False, "call_again": True}

    api = client_with(make_key(scope="read"))
    conversation = Conversation.objects.get(external_id="conv-cache")
    listed = api.get(f"/api/conversations/{conversation.pk}/").json()
    tool_calls = [t for r in listed["rounds"] for t in r["tool_calls"]]
    assert [(t["tool_call_id"], t["cache_hit"]) for t in tool_calls] == [("call_first", False), ("call_again", True)]
    stats = api.get("/api/tools/stats/").json()
    assert [(s["tool_name"], s["calls"], s["cache_hits"], s["cache_hit_rate"]) for s in stats] == [("query_sales", 2, 1, 0.5)]

    client.force_login(alice)
    page = client.get(reverse("conversation", args=[conversation.pk])).content.decode()
    again = page[page.index('id="tool-' + str(ToolCall.objects.get(tool_call_id="call_again").pk)):]
    first = page[page.index('id="tool-' + str(ToolCall.objects.get(tool_call_id="call_first").pk)):]
    assert "Cache hit" in again[: again.index("</li>")]
    assert "Cache hit" not in first[: first.index("</li>")]
    tools = client.get(reverse("tools") + "?window=all").content.decode()
    assert 'data-stat="cache-hit-rate" title="1 of 2 calls answered from the cache">50.0%' in tools


def test_a_partial_result_after_a_timeout_reaches_the_store_as_the_model_read_it(otlp_server):
    release = threading.Event()

    def scan_orders(region: str) -> list:
        """Scan orders page by page."""
        for page in range(2):
            yield {"region": region, "page": page}
        release.wait(10)

    scan = StructuredTool.from_function(scan_orders, metadata={"ctxlens_timeout_ms": 400})
    model = ScriptedChatModel.from_script([calls(tool_call("scan_orders", {"region": "north"}, "call_scan")), "Partial."])
    telemetry = export_to(otlp_server)
    try:
        run = run_agent(model, [scan], [], turns=["Scan north"], conversation_id="conv-partial",
                        telemetry=telemetry, retry_policy=RetryPolicy(max_retries=0))
    finally:
        release.set()
    telemetry.shutdown()

    result = run.rounds[0].tool_results[0]
    stored = ToolCall.objects.get(tool_call_id="call_scan")
    assert (stored.success, stored.error_type, stored.error_code) == (False, "timeout", "TIMEOUT_PARTIAL")
    assert stored.observation == result.content
    assert "Partial result (2 items before the deadline)" in stored.observation and '"page": 1' in stored.observation
