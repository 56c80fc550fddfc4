"""Output levels by the seeds' chain: the model's request → tool configuration → BRIEF above 80 % → default,
and the artifact reader the agent adds so a FULL result can be read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import StructuredTool, tool

from pipeline.adapters import in_process_telemetry, tool_adapters
from pipeline.models import Artifact, ToolCall
from pipeline.runtime.agent import Agent, run_agent, tool_definition
from pipeline.runtime.demo.fake_model import ScriptedChatModel, calls, tool_call
from pipeline.runtime.executor import ToolExecutor
from pipeline.runtime.protocol import ExecutionContext, ToolErrorType
from pipeline.runtime.skills import ACTIVATE_TOOL, SkillRegistry
from pipeline.runtime.telemetry.config import ObservabilityConfig
from tests.api_client import client_with
from tests.otlp_support import make_key

ROOT = Path(__file__).resolve().parents[2]
REGIONS = ["north", "south", "east", "west"]
ROWS = [{"region": REGIONS[i % 4], "quarter": "Q3", "order": i, "revenue": 1000 + i} for i in range(40)]


def sales_tool(received: list[dict]) -> StructuredTool:
    def query_sales(sql: str) -> list[dict]:
        """Run SQL on the sales table."""
        received.append({"sql": sql})
        return ROWS

    return StructuredTool.from_function(query_sales)


def call(name: str, call_id: str = "c1", **args) -> dict:
    return {"id": call_id, "name": name, "args": args, "type": "tool_call"}


# ---- the chain ---------------------------------------------------------------------------------


def test_the_models_requested_level_wins_over_tool_configuration_and_context_pressure(settings):
    settings.CTXLENS_TOOL_OUTPUT_LEVELS = {"query_sales": "standard"}
    received: list[dict] = []
    executor = ToolExecutor([sales_tool(received)], output_levels={"query_sales": "brief"})
    full_window = ExecutionContext(context_usage=0.95)
    asked = executor.execute_tool_call(call("query_sales", sql="SELECT 1", output_level="FULL"), context=full_window)
    assert asked.output_level.value == "full" and asked.artifact_id
    assert received == [{"sql": "SELECT 1"}]  # the level is the executor's, not an argument of the tool
    configured = executor.execute_tool_call(call("query_sales", "c2", sql="SELECT 1"), context=full_window)
    assert (configured.output_level.value, configured.observation) == ("brief", "Found 40 items")


def test_the_level_argument_never_reaches_a_plain_function_tool():
    def count_rows(sql: str) -> int:
        return 40

    result = ToolExecutor([count_rows]).execute_tool_call(call("count_rows", sql="x", output_level="brief"))
    assert (result.success, result.output_level.value, result.observation) == (True, "brief", "40")


def test_tool_configuration_comes_from_the_agent_then_the_environment_then_the_tools_metadata(settings):
    settings.CTXLENS_TOOL_OUTPUT_LEVELS = {"b": "full"}
    settings.CTXLENS_DEFAULT_OUTPUT_LEVEL = "standard"
    made = {name: StructuredTool.from_function(lambda: ROWS, name=name, description=name,
                                               metadata={"ctxlens_output_level": "brief"}) for name in "abc"}
    executor = ToolExecutor(made.values(), output_levels={"a": "standard"})
    levels = {name: executor.execute_tool_call(call(name), context=ExecutionContext(context_usage=0.95)).output_level.value
              for name in "abc"}
    assert levels == {"a": "standard", "b": "full", "c": "brief"}
    plain = ToolExecutor([StructuredTool.from_function(lambda: ROWS, name="d", description="d")])
    assert plain.execute_tool_call(call("d"), context=ExecutionContext(context_usage=0.95)).output_level.value == "brief"
    assert plain.execute_tool_call(call("d"), context=ExecutionContext(context_usage=0.5)).output_level.value == "standard"


def test_an_unknown_level_is_answered_as_invalid_input_without_running_the_tool():
    received: list[dict] = []
    result = ToolExecutor([sales_tool(received)]).execute_tool_call(call("query_sales", sql="x", output_level="everything"))
    assert received == []
    assert result.error_type is ToolErrorType.INVALID_INPUT
    assert "unknown output level 'everything'; use brief, standard or full" in result.content


def test_a_tool_with_its_own_output_level_parameter_still_receives_it():
    @tool
    def report(topic: str, output_level: str = "standard") -> str:
        """Write a report at a level of detail."""
        return f"{topic} report at {output_level}"

    result = ToolExecutor([report]).execute_tool_call(call("report", topic="q3", output_level="brief"))
    assert (result.output_level.value, result.observation) == ("brief", "q3 report at brief")


def test_every_tool_is_offered_with_the_optional_level_argument_except_the_skill_tools(settings):
    settings.CTXLENS_SKILLS_DIR = ROOT / "skills"
    agent = Agent(ScriptedChatModel.from_script([]), [sales_tool([])], skills=SkillRegistry())
    definitions = {t.name: tool_definition(t)["function"]["parameters"] for t in agent.tools}
    level = definitions["query_sales"]["properties"]["output_level"]
    assert level["enum"] == ["brief", "standard", "full"] and "output_level" not in definitions["query_sales"].get("required", [])
    assert "output_level" in definitions["read_artifact"]["properties"]
    assert "output_level" not in definitions[ACTIVATE_TOOL]["properties"]


# ---- the artifact reader ---------------------------------------------------------------------------


def test_no_reader_is_added_when_no_tool_can_store_artifacts_or_one_is_given():
    quiet = StructuredTool.from_function(lambda: "ok", name="ping", description="ping",
                                         metadata={"ctxlens_store_artifacts": False})
    assert [t.name for t in Agent(ScriptedChatModel.from_script([]), [quiet]).tools] == ["ping"]
    own = StructuredTool.from_function(lambda artifact_id: "mine", name="read_artifact", description="mine")
    assert [t.name for t in Agent(ScriptedChatModel.from_script([]), [sales_tool([]), own]).tools] == [
        "query_sales", "read_artifact"]
    with pytest.raises(ValueError, match="output_levels"):
        Agent(ScriptedChatModel.from_script([]), [own], executor=ToolExecutor([own]), output_levels={"x": "full"})


@pytest.mark.django_db(transaction=True)
def test_the_skill_asks_for_full_rows_and_reads_them_back_through_the_reader_the_agent_added(settings, artifact_dir):
    """The sales-analysis skill tells the model to ask for output_level "full" when it wants raw rows:
    the result becomes an artifact, and the reader the agent added (which the skill allows) returns it."""
    settings.CTXLENS_SKILLS_DIR = ROOT / "skills"

    def read_back(messages) -> object:
        artifact_id = next(m for m in reversed(messages) if isinstance(m, ToolMessage)).artifact["artifact_id"]
        return calls(tool_call("read_artifact", {"artifact_id": artifact_id}, "call_read"))

    model = ScriptedChatModel.from_script([
        calls(tool_call(ACTIVATE_TOOL, {"name": "sales-analysis"}, "call_skill")),
        calls(tool_call("query_sales", {"sql": "SELECT * FROM sales", "output_level": "full"}, "call_rows")),
        read_back,
        "Forty orders; west has the most revenue.",
    ])
    telemetry = in_process_telemetry(ObservabilityConfig(), batch=False)
    received: list[dict] = []
    run = run_agent(model, [sales_tool(received)], [], turns=["Show me the raw Q3 rows"], skills=SkillRegistry(),
                    conversation_id="conv-levels", output_levels={"query_sales": "brief"}, telemetry=telemetry,
                    **tool_adapters())
    telemetry.shutdown()

    [round_] = run.rounds
    assert round_.status == "ok" and received == [{"sql": "SELECT * FROM sales"}]
    rows, read = round_.tool_results[1:]
    assert rows.output_level.value == "full" and rows.content.startswith(f"Data stored as artifact: {rows.artifact_id}")
    # The whole window, not a STANDARD excerpt: the reader the agent added reads at FULL level.
    assert read.success and read.output_level.value == "full"
    assert json.loads(read.observation.split("\n\n", 1)[1]) == ROWS

    stored = {t.tool_call_id: t for t in ToolCall.objects.select_related("artifact")}
    assert stored["call_rows"].output_level == "full" and stored["call_rows"].artifact.artifact_id == rows.artifact_id
    assert stored["call_read"].success and '"region": "west"' in stored["call_read"].observation
    assert Artifact.objects.filter(artifact_id=rows.artifact_id).exists()
    api = client_with(make_key(scope="read"))
    listed = api.get(f"/api/conversations/{stored['call_rows'].conversation_id}/").json()
    by_id = {t["tool_call_id"]: t for r in listed["rounds"] for t in r["tool_calls"]}
    assert (by_id["call_rows"]["output_level"], by_id["call_rows"]["artifact_id"]) == ("full", rows.artifact_id)
