"""The pipeline's spans: configuration, sampling, GenAI shapes, and the in-process store exporter."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from django.db import connections, transaction
from django.utils import timezone
from langchain_core.tools import StructuredTool, tool
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from pipeline import semconv as sc
from pipeline.adapters import in_process_telemetry
from pipeline.ingest.decode.sdk import span_record
from pipeline.runtime.agent import Agent
from pipeline.runtime.demo.fake_model import ScriptedChatModel, calls, tool_call
from pipeline.models import CompressionEvent, Conversation, LLMCall, Round, SkillActivation, Span, ToolCall
from pipeline.runtime.protocol import ToolError, ToolErrorType
from pipeline.runtime.skills import SkillRegistry
from pipeline.runtime.telemetry.spans import Telemetry
from pipeline.runtime.telemetry.config import ObservabilityConfig, build_tracer_provider, parse_headers
from pipeline.runtime.executor import RetryPolicy

ROOT = Path(__file__).resolve().parents[2]
FAST = RetryPolicy(max_retries=2, initial_delay_s=0.001, max_delay_s=0.002)


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


def flaky_factory():
    state = {"n": 0}

    def flaky(q: str) -> str:
        """Rate limited once."""
        state["n"] += 1
        if state["n"] == 1:
            raise ToolError(ToolErrorType.RATE_LIMITED, "429")
        return "ok"

    return StructuredTool.from_function(flaky, name="flaky")


def memory_telemetry(**config) -> tuple[Telemetry, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    telemetry = Telemetry.from_config(ObservabilityConfig(**config), exporters=[exporter], batch=False)
    return telemetry, exporter


def by_name(spans, prefix):
    return [s for s in spans if s.name.startswith(prefix)]


def run_scenario(telemetry: Telemetry, settings) -> Agent:
    settings.CTXLENS_SKILLS_DIR = ROOT / "skills"
    model = ScriptedChatModel.from_script([
        calls(tool_call("activate_skill", {"name": "report-writing"}), thought="Loading the report skill."),
        calls(tool_call("lookup", {"key": "q3"}), tool_call("flaky", {"q": "x"}), tool_call("nope")),
        "The answer.",
    ])
    agent = Agent(
        model, [lookup, flaky_factory()], skills=SkillRegistry(), telemetry=telemetry, retry_policy=FAST,
        conversation_id="conv-tel", agent_name="tester", user_id="u-1",
    )
    agent.turn("What happened in Q3?")
    return agent


# ---- configuration ----------------------------------------------------------------------------

def test_config_comes_from_settings(settings):
    settings.CTXLENS_SAMPLING = "medium"
    settings.CTXLENS_OTLP_ENDPOINT = "http://collector:4318"
    settings.CTXLENS_OTLP_HEADERS = "Authorization=Bearer%20abc,x-team=ops"
    settings.CTXLENS_OTLP_COMPRESSION = "deflate"
    settings.CTXLENS_SERVICE_NAME = "my-agent"
    settings.CTXLENS_ENVIRONMENT = "staging"
    config = ObservabilityConfig.from_settings()
    assert config.sampling_rate == 0.1
    assert config.otlp_headers == {"Authorization": "Bearer abc", "x-team": "ops"}
    assert (config.otlp_endpoint, config.otlp_compression) == ("http://collector:4318", "deflate")
    assert (config.service_name, config.environment) == ("my-agent", "staging")
    assert ObservabilityConfig.from_settings(sampling="never").sampling_rate == 0


@pytest.mark.parametrize("name, rate", [("always", 1.0), ("high", 0.5), ("medium", 0.1), ("low", 0.01), ("never", 0.0)])
def test_sampling_names_map_to_rates(name, rate):
    assert ObservabilityConfig(sampling=name).sampling_rate == rate


def test_bad_sampling_and_headers_are_refused():
    with pytest.raises(ValueError, match="sampling must be one of"):
        ObservabilityConfig(sampling="sometimes").sampling_rate
    with pytest.raises(ValueError, match="key=value"):
        parse_headers("no-equals-sign")
    assert parse_headers("") == {}


def test_the_global_tracer_provider_is_never_set():
    before = trace.get_tracer_provider()
    telemetry, _ = memory_telemetry()
    assert trace.get_tracer_provider() is before
    assert telemetry.provider is not before
    telemetry.shutdown()


def test_the_resource_names_service_and_environment():
    provider = build_tracer_provider(ObservabilityConfig(service_name="svc", environment="prod"))
    assert provider.resource.attributes["service.name"] == "svc"
    assert provider.resource.attributes["deployment.environment.name"] == "prod"


def test_sampling_never_exports_nothing_and_always_everything(settings):
    telemetry, exporter = memory_telemetry(sampling="never")
    run_scenario(telemetry, settings)
    assert exporter.get_finished_spans() == ()
    telemetry, exporter = memory_telemetry(sampling="always")
    run_scenario(telemetry, settings)
    assert len(exporter.get_finished_spans()) >= 8


def test_ratio_sampling_keeps_whole_turns():
    telemetry, exporter = memory_telemetry(sampling="high")
    model = ScriptedChatModel.from_script([s for _ in range(60) for s in (calls(tool_call("lookup", {"key": "k"})), "a")])
    agent = Agent(model, [lookup], telemetry=telemetry)
    for n in range(60):
        agent.turn(f"q{n}")
    spans = exporter.get_finished_spans()
    turns = {s.context.trace_id for s in by_name(spans, "invoke_agent")}
    assert 10 < len(turns) < 50  # about half of 60
    assert {s.context.trace_id for s in spans} == turns  # children follow their turn's decision


# ---- span shapes ------------------------------------------------------------------------------

def test_spans_follow_the_genai_conventions(settings):
    telemetry, exporter = memory_telemetry()
    agent = run_scenario(telemetry, settings)
    spans = exporter.get_finished_spans()
    [turn] = by_name(spans, "invoke_agent")
    assert turn.name == "invoke_agent tester" and turn.parent is None
    assert turn.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert turn.attributes[sc.CONVERSATION_ID] == "conv-tel" and turn.attributes["user.id"] == "u-1"
    assert turn.attributes[sc.ROUND_USER_MESSAGE] == "What happened in Q3?"
    assert turn.attributes[sc.ROUND_FINAL_ANSWER] == "The answer."
    assert all(s.context.trace_id == turn.context.trace_id for s in spans)
    assert all(s.parent.span_id == turn.context.span_id for s in spans if s is not turn)

    chats = by_name(spans, "chat ")
    assert len(chats) == 3 and chats[0].name == "chat gpt-4o-mini"
    first = chats[0].attributes
    assert first["gen_ai.request.model"] == "gpt-4o-mini" and first["gen_ai.provider.name"] == "demo"
    assert first["gen_ai.usage.input_tokens"] > 0 and first["gen_ai.usage.output_tokens"] > 0
    assert first["gen_ai.response.finish_reasons"] == ("tool_call",)
    composition = json.loads(first[sc.CONTEXT_COMPOSITION])
    assert list(composition) == list(sc.CONTEXT_CATEGORIES)
    assert first[sc.CONTEXT_WINDOW] == 128_000 and first[sc.CONTEXT_TOKENS] == sum(v for k, v in composition.items() if k != "free")
    assert json.loads(first["gen_ai.input.messages"]) == [{"role": "user", "parts": [{"type": "text", "content": "What happened in Q3?"}]}]
    output = json.loads(first["gen_ai.output.messages"])[0]
    assert output["role"] == "assistant" and output["finish_reason"] == "tool_call"
    assert output["parts"][1] == {"type": "tool_call", "id": agent.rounds[0].tool_call_ids[0], "name": "activate_skill", "arguments": {"name": "report-writing"}}
    assert json.loads(chats[1].attributes[sc.CONTEXT_COMPOSITION])["skills"] > 0

    tools = by_name(spans, "execute_tool ")
    assert [s.attributes["gen_ai.tool.call.id"] for s in tools] == agent.rounds[0].tool_call_ids
    look = next(s for s in tools if s.name == "execute_tool lookup").attributes
    assert look["gen_ai.operation.name"] == "execute_tool" and look["gen_ai.tool.name"] == "lookup"
    assert json.loads(look["gen_ai.tool.call.arguments"]) == {"key": "q3"}
    assert look["gen_ai.tool.call.result"] == "value of q3"
    assert look[sc.TOOL_OUTPUT_LEVEL] == "standard" and look[sc.TOOL_RETRY_COUNT] == 0 and look[sc.TOOL_OBSERVATION_TOKENS] > 0
    flaky = next(s for s in tools if s.name == "execute_tool flaky")
    assert flaky.attributes[sc.TOOL_RETRY_COUNT] == 1
    assert [e.attributes["error.type"] for e in flaky.events] == ["rate_limit"]
    nope = next(s for s in tools if s.name == "execute_tool nope")
    assert nope.status.status_code is StatusCode.ERROR
    assert nope.attributes[sc.TOOL_ERROR_TYPE] == "not_found" == nope.attributes["error.type"]

    [skill] = by_name(spans, "activate_skill report-writing")
    assert skill.attributes[sc.SPAN_KIND] == sc.SPAN_KIND_SKILL and skill.attributes[sc.SKILL_LEVEL] == 2
    assert json.loads(skill.attributes[sc.SKILL_CHAIN]) == ["report-writing"] and skill.attributes[sc.SKILL_TOKENS] > 0
    assert json.loads(skill.attributes[sc.SKILL_CONTEXT_MODIFIER])["allowed_tools"] is None
    assert skill.start_time <= skill.end_time


def test_a_compression_span_carries_before_and_after():
    telemetry, exporter = memory_telemetry()

    def essay(topic: str) -> str:
        """Long text."""
        return f"{topic} " * 2500

    tool_ = StructuredTool.from_function(essay, metadata={"ctxlens_store_artifacts": False})
    model = ScriptedChatModel.from_script([s for n in range(3) for s in (calls(tool_call("essay", {"topic": f"t{n}"})), "done")])
    agent = Agent(model, [tool_], telemetry=telemetry, context_window=8_000, output_levels={"essay": "full"})
    for n in range(3):
        agent.turn(f"essay {n}")
    [span, *_] = by_name(exporter.get_finished_spans(), "compress_context")
    attrs = span.attributes
    assert attrs[sc.SPAN_KIND] == sc.SPAN_KIND_COMPRESSION and attrs[sc.COMPRESSION_STRATEGY] == "extract"
    assert attrs[sc.COMPRESSION_TOKENS_AFTER] < attrs[sc.COMPRESSION_TOKENS_BEFORE]
    assert attrs[sc.COMPRESSION_CONTEXT_WINDOW] == 8_000
    before = json.loads(attrs[sc.COMPRESSION_BEFORE_MESSAGES])
    assert len(before) == attrs[sc.COMPRESSION_MESSAGES_BEFORE]
    assert len(json.loads(attrs[sc.COMPRESSION_AFTER_MESSAGES])) == attrs[sc.COMPRESSION_MESSAGES_AFTER]
    assert json.loads(attrs[sc.COMPRESSION_SUMMARISED])
    by_cat = json.loads(attrs[sc.COMPRESSION_TOKENS_AFTER_BY_CATEGORY])
    before_by_cat = json.loads(attrs[sc.COMPRESSION_TOKENS_BEFORE_BY_CATEGORY])
    assert by_cat["compressed_summaries"] > before_by_cat["compressed_summaries"]
    assert before_by_cat["tool_observations"] > by_cat["tool_observations"]
    assert sum(v for k, v in before_by_cat.items() if k != "free") == attrs[sc.COMPRESSION_TOKENS_BEFORE]
    assert span.parent is not None


def test_a_turn_is_a_new_trace_linked_to_the_callers_span():
    telemetry, exporter = memory_telemetry()
    outer_provider = TracerProvider()
    with outer_provider.get_tracer("app").start_as_current_span("http request") as outer:
        Agent(ScriptedChatModel.from_script(["hi"]), [], telemetry=telemetry).turn("hello")
    [turn] = by_name(exporter.get_finished_spans(), "invoke_agent")
    assert turn.parent is None and turn.context.trace_id != outer.get_span_context().trace_id
    assert turn.links[0].context.span_id == outer.get_span_context().span_id


def test_content_capture_can_be_turned_off(settings):
    telemetry, exporter = memory_telemetry(capture_content=False)
    run_scenario(telemetry, settings)
    keys = {k for s in exporter.get_finished_spans() for k in s.attributes}
    assert not keys & {"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.call.arguments",
                       "gen_ai.tool.call.result", sc.ROUND_USER_MESSAGE, sc.ROUND_FINAL_ANSWER}
    assert sc.CONTEXT_COMPOSITION in keys


def test_long_contents_are_clipped_on_spans():
    telemetry, exporter = memory_telemetry()
    telemetry.max_chars = 100
    Agent(ScriptedChatModel.from_script(["x" * 500]), [], telemetry=telemetry).turn("y" * 500)
    [turn] = by_name(exporter.get_finished_spans(), "invoke_agent")
    assert turn.attributes[sc.ROUND_FINAL_ANSWER].startswith("x" * 100 + "… [400 more characters")


def test_span_record_keeps_ids_kinds_status_events_and_resource(settings):
    telemetry, exporter = memory_telemetry(service_name="svc")
    run_scenario(telemetry, settings)
    spans = exporter.get_finished_spans()
    chat = by_name(spans, "chat ")[0]
    record = span_record(chat)
    assert record.trace_id == format(chat.context.trace_id, "032x") and len(record.span_id) == 16
    assert record.parent_span_id == format(chat.parent.span_id, "016x")
    assert record.kind == 3  # OTLP CLIENT
    assert record.resource["service.name"] == "svc" and record.scope_name == "ctxlens.pipeline"
    assert record.attributes["gen_ai.response.finish_reasons"] == ["tool_call"]
    flaky = span_record(next(s for s in spans if s.name == "execute_tool flaky"))
    assert flaky.kind == 1 and flaky.events[0].name == "ctxlens.tool.attempt_failed"
    failed = span_record(next(s for s in spans if s.name == "execute_tool nope"))
    assert failed.status_code == 2 and "Unknown tool" in failed.status_message


# ---- in-process store -------------------------------------------------------------------------

@pytest.mark.django_db
def test_the_in_process_exporter_stores_what_the_dashboard_shows(settings):
    telemetry = in_process_telemetry(ObservabilityConfig(), batch=False)
    agent = run_scenario(telemetry, settings)
    telemetry.shutdown()
    conversation = Conversation.objects.get(external_id="conv-tel")
    assert conversation.agent_name == "tester"
    round_ = Round.objects.get(conversation=conversation)
    assert round_.user_message == "What happened in Q3?" and round_.final_answer == "The answer."
    llm = LLMCall.objects.filter(round=round_).order_by("started_at")
    assert llm.count() == 3 and llm[0].context_window == 128_000 and llm[0].context_composition["free"] > 0
    assert llm[0].input_tokens == agent.rounds[0].input_tokens - llm[1].input_tokens - llm[2].input_tokens
    stored = list(ToolCall.objects.filter(round=round_).order_by("started_at").values_list("tool_call_id", "success", "retry_count"))
    assert [s[0] for s in stored] == agent.rounds[0].tool_call_ids
    assert stored[2] == (agent.rounds[0].tool_call_ids[2], True, 1)
    skill = SkillActivation.objects.get(conversation=conversation)
    assert (skill.skill_name, skill.load_level, skill.chain) == ("report-writing", 2, ["report-writing"])
    assert not CompressionEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_exporting_on_the_agents_own_thread_leaves_its_transaction_alone():
    """An agent inside a Django view or a worker thread, with spans stored synchronously (batch=False)."""
    telemetry = in_process_telemetry(ObservabilityConfig(), batch=False)
    outcome: dict[str, object] = {}

    def agent_thread() -> None:
        try:
            with transaction.atomic():
                Conversation.objects.create(external_id="caller", started_at=timezone.now(), last_activity_at=timezone.now())
                Agent(ScriptedChatModel.from_script(["hi"]), [], telemetry=telemetry, conversation_id="conv-own").turn("hello")
                outcome["callers"] = Conversation.objects.filter(external_id="caller").count()
        except Exception as exc:
            outcome["error"] = repr(exc)
        finally:
            connections.close_all()

    worker = threading.Thread(target=agent_thread)
    worker.start()
    worker.join(30)
    telemetry.shutdown()
    assert outcome == {"callers": 1}
    assert Conversation.objects.filter(external_id__in=["caller", "conv-own"]).count() == 2


@pytest.mark.django_db
def test_the_store_and_another_destination_get_the_same_spans(settings):
    other = InMemorySpanExporter()
    telemetry = in_process_telemetry(ObservabilityConfig(), exporters=[other], batch=False)
    run_scenario(telemetry, settings)
    telemetry.shutdown()
    sent = {format(s.context.span_id, "016x") for s in other.get_finished_spans()}
    assert len(sent) >= 8
    assert set(Span.objects.values_list("span_id", flat=True)) == sent


# ---- the message mapping, both directions ------------------------------------------------------

def test_messages_on_spans_read_back_the_same_through_the_ingest_normaliser():
    from langchain_core.messages import AIMessage, AIMessageChunk, ChatMessage, HumanMessage, SystemMessage, ToolMessage

    from pipeline.runtime.genai_messages import output_message, to_genai_messages
    from pipeline.ingest.normalise.messages import input_messages, message_text, output_messages, tool_calls_of, tool_responses_of

    call = {"id": "call_7", "name": "query_sales", "args": {"sql": "SELECT 1", "limit": 5}}
    sent = [
        SystemMessage("You are an analyst."),
        ChatMessage(role="developer", content="Answer in EUR."),
        HumanMessage([{"type": "text", "text": "Q3 revenue?"}, {"type": "image_url", "image_url": {"url": "x"}}]),
        AIMessageChunk(content="Querying.", tool_calls=[call]),
        ToolMessage([{"type": "text", "text": "rows"}], tool_call_id="call_7"),
        ToolMessage("Operation failed.", tool_call_id="call_8", status="error", name="web_search"),
    ]
    answer = AIMessage([{"type": "reasoning", "reasoning": "sum the rows"}, {"type": "text", "text": "EUR 1.2M"}],
                       response_metadata={"finish_reason": "stop"})
    attrs = {"gen_ai.input.messages": json.dumps(to_genai_messages(sent)),
             "gen_ai.output.messages": json.dumps([output_message(answer)])}

    read = input_messages(attrs)
    assert [m["role"] for m in read] == ["system", "developer", "user", "assistant", "tool", "tool"]
    assert [message_text(m) for m in read[:3]] == ["You are an analyst.", "Answer in EUR.", "Q3 revenue?"]
    assert tool_calls_of(read) == [{"type": "tool_call", "id": "call_7", "name": "query_sales", "arguments": call["args"]}]
    assert tool_responses_of(read) == {"call_7": "rows", "call_8": "Operation failed."}
    assert read[5]["name"] == "web_search"
    [out] = output_messages(attrs)
    assert (out["role"], out["finish_reason"], message_text(out)) == ("assistant", "stop", "sum the rows\nEUR 1.2M")
