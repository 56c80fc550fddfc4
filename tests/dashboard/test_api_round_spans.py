"""GET /api/rounds/<id>/spans/: one turn's spans as a tree on a time axis (the waterfall).

Turns arrive the ways an agent sends them: a LangGraph agent traced by the real OpenInference and
OpenLLMetry instrumentations and exported over OTLP/HTTP to a live server; spans made with the
OpenTelemetry SDK (parent cycles, several rounds in one trace); REST events through /api/ingest/.
"""

from __future__ import annotations

import time

import pytest
from django.urls import reverse
from langchain_core.messages import AIMessage, HumanMessage
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from pipeline import semconv as sc
from pipeline.ingest.decode.rest import span_id_for
from pipeline.models import ApiKey, CompressionEvent, Conversation, LLMCall, Round, Span, ToolCall
from pipeline.models.apikeys import Scope
from tests.api_client import client_with
from tests.langchain_support import instrumented, react_agent
from tests.otlp_support import auth, make_key

ANSWER = "It is sunny and 21C in Paris."


def read(path: str):
    return client_with(ApiKey.generate("reader", scope=Scope.READ)[1]).get(path)


def waterfall(round_: Round) -> dict:
    reply = read(f"/api/rounds/{round_.pk}/spans/")
    assert reply.status_code == 200, reply.content
    return reply.json()


def shape(spans: list[dict]) -> list[tuple]:
    """(depth, name, kind, index of the parent row or None) per row, in the order returned."""
    index = {s["span_id"]: i for i, s in enumerate(spans)}
    return [(s["depth"], s["name"], s["kind"], index.get(s["parent_span_id"])) for s in spans]


def assert_children_inside_parents(spans: list[dict]) -> None:
    by_id = {s["span_id"]: s for s in spans}
    for span in spans:
        parent = by_id.get(span["parent_span_id"])
        if parent is not None:
            assert parent["start_offset_ms"] <= span["start_offset_ms"], span["name"]
            assert (span["start_offset_ms"] + span["duration_ms"]
                    <= parent["start_offset_ms"] + parent["duration_ms"] + 0.001), span["name"]


def run_weather_agent(instrumentor, server) -> None:
    with instrumented(instrumentor, server, make_key()):
        state = react_agent([
            AIMessage(content="", tool_calls=[{"id": "call_w1", "name": "get_weather", "args": {"city": "Paris"}}],
                      usage_metadata={"input_tokens": 42, "output_tokens": 7, "total_tokens": 49}),
            AIMessage(content=ANSWER, usage_metadata={"input_tokens": 60, "output_tokens": 12, "total_tokens": 72}),
        ]).invoke({"messages": [HumanMessage("What's the weather in Paris?")]},
                  config={"configurable": {"thread_id": "waterfall-thread"}})
    assert state["messages"][-1].text == ANSWER


# --- a LangGraph agent, traced by the real instrumentations ----------------------------------

# LangGraph's ReAct agent: the graph, its "agent" node (call_model, the model's RunnableSequence of
# prompt and chat model, the should_continue edge), its "tools" node, and the "agent" node again.
OPENINFERENCE_TREE = [
    (0, "LangGraph", "chain", None),
    (1, "agent", "agent", 0),
    (2, "call_model", "chain", 1),
    (2, "RunnableSequence", "chain", 1),
    (3, "Prompt", "chain", 3),
    (3, "FakeToolChat", "llm", 3),
    (2, "should_continue", "chain", 1),
    (1, "tools", "chain", 0),
    (2, "get_weather", "tool", 7),
    (1, "agent", "agent", 0),
    (2, "call_model", "chain", 9),
    (2, "RunnableSequence", "chain", 9),
    (3, "Prompt", "chain", 11),
    (3, "FakeToolChat", "llm", 11),
    (2, "should_continue", "chain", 9),
]
OPENINFERENCE_NODES = ["", *["agent"] * 6, "tools", "tools", *["agent"] * 6]

# OpenLLMetry: an invoke_agent span around the workflow, one execute_task span per node and runnable.
OPENLLMETRY_TREE = [
    (0, "invoke_agent LangGraph", "agent", None),
    (1, "LangGraph.workflow", "agent", 0),
    (2, "execute_task agent", "chain", 1),
    (3, "execute_task call_model", "chain", 2),
    (3, "execute_task RunnableSequence", "chain", 2),
    (4, "execute_task Prompt", "chain", 4),
    (4, "FakeToolChat.chat", "llm", 4),
    (3, "execute_task should_continue", "chain", 2),
    (2, "execute_task tools", "chain", 1),
    (3, "execute_tool get_weather", "tool", 8),
    (2, "execute_task agent", "chain", 1),
    (3, "execute_task call_model", "chain", 10),
    (3, "execute_task RunnableSequence", "chain", 10),
    (4, "execute_task Prompt", "chain", 12),
    (4, "FakeToolChat.chat", "llm", 12),
    (3, "execute_task should_continue", "chain", 10),
]
OPENLLMETRY_NODES = ["", "", *["agent"] * 6, "tools", "tools", *["agent"] * 6]


def _instrumentor(name: str):
    if name == "openinference":
        from openinference.instrumentation.langchain import LangChainInstrumentor

        return LangChainInstrumentor()
    from opentelemetry.instrumentation.langchain import LangchainInstrumentor

    return LangchainInstrumentor()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("instrumentation", "tree", "nodes"), [
    ("openinference", OPENINFERENCE_TREE, OPENINFERENCE_NODES),
    ("openllmetry", OPENLLMETRY_TREE, OPENLLMETRY_NODES),
])
def test_a_langgraph_turn_shows_its_nodes_and_chains_in_the_tree(otlp_server, instrumentation, tree, nodes):
    run_weather_agent(_instrumentor(instrumentation), otlp_server)
    turn = Round.objects.get(conversation__external_id="waterfall-thread")

    body = waterfall(turn)

    spans = body["spans"]
    assert shape(spans) == tree
    assert [s["langgraph_node"] for s in spans] == nodes
    assert (body["round_id"], body["conversation_id"], body["trace_id"]) == (turn.pk, turn.conversation_id, turn.trace_id)
    assert (body["span_count"], body["spans_omitted"], body["max_spans"]) == (len(tree), 0, 2000)
    assert [s["orphan"] for s in spans] == [False] * len(tree)
    assert {s["status"] for s in spans} <= {"ok", "unset"}
    root = spans[0]
    assert (root["start_offset_ms"], root["parent_span_id"]) == (0.0, "")
    assert body["duration_ms"] == root["duration_ms"] > 0
    assert_children_inside_parents(spans)

    # The spans the timeline shows link to their entries; the others (nodes, chains) to none.
    asked, answered = LLMCall.objects.filter(round=turn).order_by("step")
    weather = ToolCall.objects.get(round=turn)
    page = reverse("conversation", args=[turn.conversation_id])
    links = [(s["name"], s["timeline"]) for s in spans if s["timeline"]]
    llm_name = tree[5][1] if instrumentation == "openinference" else tree[6][1]
    tool_name = tree[8][1] if instrumentation == "openinference" else tree[9][1]
    assert links == [
        (llm_name, {"type": "llm", "id": asked.pk, "anchor": f"llm-{asked.pk}", "url": f"{page}#llm-{asked.pk}"}),
        (tool_name, {"type": "tool", "id": weather.pk, "anchor": f"tool-{weather.pk}",
                     "url": f"{page}#tool-{weather.pk}"}),
        (llm_name, {"type": "llm", "id": answered.pk, "anchor": f"llm-{answered.pk}",
                    "url": f"{page}#llm-{answered.pk}"}),
    ]
    by_link = {s["timeline"]["anchor"]: s for s in spans if s["timeline"]}
    first, tool, second = (by_link[f"llm-{asked.pk}"], by_link[f"tool-{weather.pk}"], by_link[f"llm-{answered.pk}"])
    assert [first["span_id"], tool["span_id"], second["span_id"]] == [asked.span_id, weather.span_id, answered.span_id]
    assert (first["input_tokens"], first["output_tokens"]) == (42, 7)
    assert (second["input_tokens"], second["output_tokens"]) == (60, 12)
    assert tool["tool_name"] == "get_weather"
    assert [s["model"] for s in spans if s["kind"] == "llm"] == [asked.model, answered.model]
    kinds = {s["attributes"].get("openinference.span.kind") or s["attributes"].get("gen_ai.operation.name")
             for s in spans}
    expected = ({"CHAIN", "AGENT", "LLM", "TOOL"} if instrumentation == "openinference"
                else {"invoke_agent", "execute_task", "chat", "execute_tool"})
    assert kinds == expected


# --- spans from the OpenTelemetry SDK -----------------------------------------------------------

TRACE = 0x5A5A_0000_0000_0000_0000_0000_0000_0001
BASE_NS = (time.time_ns() // 1_000_000_000 - 3600) * 1_000_000_000  # an hour ago: the server refuses the future


def _context(span_id: int) -> SpanContext:
    return SpanContext(TRACE, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def _span(name: str, span_id: int, parent: int | None, start_ms: int, end_ms: int, **attributes) -> ReadableSpan:
    """A finished span with the ids a test needs, which the SDK's tracer cannot be told to use."""
    return ReadableSpan(
        name=name, context=_context(span_id), parent=_context(parent) if parent else None,
        resource=Resource.create({"service.name": "waterfall-test"}), kind=SpanKind.INTERNAL,
        attributes={sc.CONVERSATION_ID: "sdk-conversation", **attributes},
        start_time=BASE_NS + start_ms * 1_000_000, end_time=BASE_NS + end_ms * 1_000_000,
        status=Status(StatusCode.OK), instrumentation_scope=InstrumentationScope("tests.waterfall"),
    )


def export(server, spans: list[ReadableSpan]) -> None:
    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers=auth(make_key()))
    assert exporter.export(spans) == SpanExportResult.SUCCESS
    assert Span.objects.count() == len(spans)  # none refused (a partial success is a SUCCESS too)


@pytest.mark.django_db(transaction=True)
def test_spans_in_a_parent_cycle_or_their_own_parent_show_once_at_the_root_level(otlp_server):
    export(otlp_server, [
        _span("invoke_agent cyclic", 1, None, 0, 100, **{"gen_ai.operation.name": "invoke_agent"}),
        _span("step", 2, 1, 10, 20),
        _span("loop a", 3, 4, 30, 40),
        _span("loop b", 4, 3, 35, 38),
        _span("self", 5, 5, 50, 60),
    ])
    turn = Round.objects.get(conversation__external_id="sdk-conversation")

    spans = waterfall(turn)["spans"]

    assert shape(spans) == [
        (0, "invoke_agent cyclic", "agent", None), (1, "step", "other", 0),
        (0, "loop a", "other", 3), (1, "loop b", "other", 2), (0, "self", "other", 4),
    ]
    assert [s["orphan"] for s in spans] == [False, False, True, False, True]
    assert [s["start_offset_ms"] for s in spans] == [0.0, 10.0, 30.0, 35.0, 50.0]
    assert [s["duration_ms"] for s in spans] == [100.0, 10.0, 10.0, 3.0, 10.0]


@pytest.mark.django_db(transaction=True)
def test_a_trace_split_into_rounds_by_round_id_gives_each_round_its_own_spans(otlp_server):
    export(otlp_server, [
        _span("invoke_agent outer", 1, None, 0, 100),
        _span("first turn", 2, 1, 10, 40, **{sc.ROUND_ID: "turn-a"}),
        _span("first turn's call", 3, 2, 15, 30, **{sc.ROUND_ID: "turn-a"}),
        _span("second turn", 4, 1, 50, 90, **{sc.ROUND_ID: "turn-b"}),
        _span("outer step", 5, 1, 95, 99),
    ])
    conversation = Conversation.objects.get(external_id="sdk-conversation")
    trace_id = f"{TRACE:032x}"
    rounds = {r.key: r for r in Round.objects.filter(conversation=conversation)}
    assert set(rounds) == {trace_id, "turn-a", "turn-b"}

    outer, first, second = (waterfall(rounds[key]) for key in (trace_id, "turn-a", "turn-b"))

    assert shape(outer["spans"]) == [(0, "invoke_agent outer", "other", None), (1, "outer step", "other", 0)]
    # A round's spans under a parent in another round start at its root level.
    assert shape(first["spans"]) == [(0, "first turn", "other", None), (1, "first turn's call", "other", 0)]
    assert [s["orphan"] for s in first["spans"]] == [True, False]
    assert first["spans"][0]["parent_span_id"] == f"{1:016x}"
    assert [s["start_offset_ms"] for s in first["spans"]] == [0.0, 5.0]
    assert (first["duration_ms"], first["span_count"]) == (30.0, 2)
    assert shape(second["spans"]) == [(0, "second turn", "other", None)]
    assert (outer["span_count"], second["span_count"]) == (2, 1)


# --- REST ingest ----------------------------------------------------------------------------

def ingest(*events: dict) -> None:
    key = ApiKey.generate("agent", scope=Scope.INGEST)[1]
    reply = client_with(key).post("/api/ingest/", {"schema_version": "1.0", "events": list(events)}, format="json")
    assert reply.status_code == 200, reply.json()


TURN = {"conversation_id": "rest-conversation", "round_id": "r1"}


def rest_turn(*, start: bool = True, end: bool = True) -> list[dict]:
    events = [
        {**TURN, "type": "llm_call", "call_id": "llm-1", "model": "gpt-4o", "started_at": "2026-05-01T12:00:00.100Z",
         "ended_at": "2026-05-01T12:00:00.900Z", "input_tokens": 120, "output_tokens": 15},
        {**TURN, "type": "tool_call", "tool_name": "calculator", "tool_call_id": "call_1", "observation": "42",
         "started_at": "2026-05-01T12:00:01Z", "duration_ms": 12.5, "status": "error", "error_type": "timeout",
         "error_message": "calculator timed out"},
        {**TURN, "type": "llm_call", "call_id": "llm-2", "model": "claude-sonnet-4", "started_at": "2026-05-01T12:00:01.100Z",
         "duration_ms": 400, "input_tokens": 140, "output_tokens": 8},
    ]
    if start:
        events.insert(0, {**TURN, "type": "round_start", "timestamp": "2026-05-01T12:00:00Z", "user_message": "6 x 7?"})
    if end:
        events.append({**TURN, "type": "round_end", "timestamp": "2026-05-01T12:00:02Z", "final_answer": "42"})
    return events


@pytest.mark.django_db
def test_a_rest_turn_is_its_round_span_with_the_calls_under_it():
    ingest(*rest_turn())
    turn = Round.objects.get(key="r1")
    first, second = LLMCall.objects.filter(round=turn).order_by("started_at")
    tool = ToolCall.objects.get(round=turn)

    body = waterfall(turn)

    spans = body["spans"]
    assert shape(spans) == [
        (0, "invoke_agent", "agent", None), (1, "chat gpt-4o", "llm", 0),
        (1, "execute_tool calculator", "tool", 0), (1, "chat claude-sonnet-4", "llm", 0),
    ]
    assert [s["start_offset_ms"] for s in spans] == [0.0, 100.0, 1000.0, 1100.0]
    assert [s["duration_ms"] for s in spans] == [2000.0, 800.0, 12.5, 400.0]
    assert [s["status"] for s in spans] == ["ok", "ok", "error", "ok"]
    assert spans[2]["status_message"] == "calculator timed out"
    assert spans[2]["attributes"] == {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "calculator",
                                      "gen_ai.tool.call.id": "call_1", "error.type": "timeout"}
    assert [(s["model"], s["input_tokens"], s["output_tokens"]) for s in spans] == [
        ("", None, None), ("gpt-4o", 120, 15), ("", None, None), ("claude-sonnet-4", 140, 8)]
    assert [s["timeline"] and s["timeline"]["anchor"] for s in spans] == [
        None, f"llm-{first.pk}", f"tool-{tool.pk}", f"llm-{second.pk}"]
    assert (body["started_at"], body["duration_ms"]) == ("2026-05-01T12:00:00Z", 2000.0)
    assert (body["span_count"], body["spans_omitted"]) == (4, 0)


@pytest.mark.django_db
def test_a_rest_turn_without_its_round_span_shows_its_calls_as_orphans_at_the_root_level():
    ingest(*rest_turn(start=False, end=False))
    turn = Round.objects.get(key="r1")

    spans = waterfall(turn)["spans"]

    assert shape(spans) == [(0, "chat gpt-4o", "llm", None), (0, "execute_tool calculator", "tool", None),
                            (0, "chat claude-sonnet-4", "llm", None)]
    assert [s["orphan"] for s in spans] == [True, True, True]
    # Each names the round span that a round_start or round_end would have made.
    assert {s["parent_span_id"] for s in spans} == {span_id_for(turn.trace_id, "round")}
    assert [s["start_offset_ms"] for s in spans] == [0.0, 900.0, 1000.0]


@pytest.mark.django_db
def test_a_running_turn_shows_its_open_round_span_as_running():
    ingest(*rest_turn(end=False))

    spans = waterfall(Round.objects.get(key="r1"))["spans"]

    assert [(s["name"], s["running"], s["duration_ms"]) for s in spans] == [
        ("invoke_agent", True, None), ("chat gpt-4o", False, 800.0), ("execute_tool calculator", False, 12.5),
        ("chat claude-sonnet-4", False, 400.0)]


@pytest.mark.django_db
def test_the_conversation_metadata_span_belongs_to_no_turn():
    # Events without a round id share one trace per conversation, and so does a conversation
    # event sent on its own: the turn is the calls, not the metadata span beside them.
    calls = [{k: v for k, v in event.items() if k != "round_id"} for event in rest_turn(start=False, end=False)]
    ingest(*calls)
    ingest({"type": "conversation", "conversation_id": "rest-conversation", "title": "Arithmetic",
            "started_at": "2026-05-01T11:59:00Z"})
    turn = Round.objects.get(conversation__external_id="rest-conversation")

    body = waterfall(turn)

    assert [s["name"] for s in body["spans"]] == ["chat gpt-4o", "execute_tool calculator", "chat claude-sonnet-4"]
    assert (body["span_count"], body["started_at"]) == (3, "2026-05-01T12:00:00.100000Z")


@pytest.mark.django_db
def test_a_turn_past_the_cap_keeps_its_first_spans_and_counts_the_rest():
    tools = [{**TURN, "type": "tool_call", "tool_name": "ping", "tool_call_id": f"call_{i}", "observation": "pong",
              "started_at": f"2026-05-01T12:00:{i // 1000:02d}.{i % 1000:03d}Z", "duration_ms": 0.5}
             for i in range(2002)]
    ingest({**TURN, "type": "round_start", "timestamp": "2026-05-01T11:59:59Z"}, *tools,
           {**TURN, "type": "round_end", "timestamp": "2026-05-01T12:00:03Z"})

    body = waterfall(Round.objects.get(key="r1"))

    assert (body["span_count"], body["spans_omitted"], len(body["spans"])) == (2003, 3, 2000)
    assert shape(body["spans"][:2]) == [(0, "invoke_agent", "agent", None), (1, "execute_tool ping", "tool", 0)]
    assert body["spans"][-1]["attributes"]["gen_ai.tool.call.id"] == "call_1998"
    assert body["duration_ms"] == 4000.0  # the round span's, which is kept


@pytest.mark.django_db
def test_a_compression_span_links_to_its_timeline_entry():
    ingest(*rest_turn(), {**TURN, "type": "compression", "compression_id": "cmp-1", "strategy": "truncate",
                          "timestamp": "2026-05-01T12:00:01.050Z", "tokens_before": 9000, "tokens_after": 4000})
    compression = CompressionEvent.objects.get()

    spans = waterfall(Round.objects.get(key="r1"))["spans"]

    entry = next(s["timeline"] for s in spans if s["name"] == "compress_context")
    assert entry == {"type": "compression", "id": compression.pk, "anchor": f"compression-{compression.pk}",
                     "url": f"/conversations/{compression.conversation_id}/#compression-{compression.pk}"}


@pytest.mark.django_db
def test_a_turn_older_than_the_pages_latest_links_to_the_page_of_turns_it_is_on():
    conversation = {"conversation_id": "long-conversation"}

    def turn(round_id: str, at: str, *, call: bool = False) -> list[dict]:
        events = [{**conversation, "round_id": round_id, "type": "round_start", "timestamp": f"2026-05-01T{at}Z"}]
        if call:
            events.append({**conversation, "round_id": round_id, "type": "llm_call", "call_id": "llm",
                           "model": "gpt-4o", "started_at": f"2026-05-01T{at}Z", "duration_ms": 10})
        return events

    newer = [e for i in range(20) for e in turn(f"r{i}", f"12:{i // 60:02d}:{i % 60:02d}", call=i == 0)]
    ingest(*turn("old", "11:00:00", call=True), *newer)
    page = reverse("conversation", args=[Conversation.objects.get(external_id="long-conversation").pk])

    def link(key: str) -> str:
        return next(s["timeline"]["url"] for s in waterfall(Round.objects.get(key=key))["spans"] if s["timeline"])

    # Turns of one call or none: the page shows the latest 20, "r0" the 20th newest; "old" is on the next page.
    old_call, first_call = (LLMCall.objects.get(round__key=key) for key in ("old", "r0"))
    assert link("old") == f"{page}?page=2#llm-{old_call.pk}"
    assert link("r0") == f"{page}#llm-{first_call.pk}"


# --- errors and the schema -----------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/api/rounds/999999/spans/", "/api/rounds/0/spans/",
                                  f"/api/rounds/{2**70}/spans/"])
def test_an_unknown_round_is_a_json_404(path):
    reply = read(path)

    assert reply.status_code == 404
    assert reply.json() == {"detail": "No such round."}


@pytest.mark.django_db
def test_a_round_id_that_is_not_a_number_is_a_json_404():
    reply = read("/api/rounds/first/spans/")

    assert reply.status_code == 404
    assert reply.json() == {"detail": "No such API endpoint; see /api/schema/."}


@pytest.mark.django_db
def test_reading_spans_needs_credentials():
    ingest(*rest_turn())

    reply = client_with().get(f"/api/rounds/{Round.objects.get().pk}/spans/")

    assert reply.status_code == 401
    assert reply.json() == {"detail": "Authentication credentials were not provided."}


@pytest.mark.django_db
def test_the_schema_documents_the_waterfall_as_it_is_returned():
    ingest(*rest_turn())
    body = waterfall(Round.objects.get())
    schema = read("/api/schema/?format=json").json()

    operation = schema["paths"]["/api/rounds/{id}/spans/"]["get"]
    assert {"200", "401", "403", "404"} <= set(operation["responses"])
    components = schema["components"]["schemas"]
    assert set(components["Waterfall"]["properties"]) == set(body)
    assert set(components["WaterfallSpan"]["properties"]) == set(body["spans"][0])
    assert set(components["TimelineEntry"]["properties"]) == set(body["spans"][1]["timeline"])

