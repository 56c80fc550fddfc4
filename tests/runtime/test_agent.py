"""The agent loop with real tools, the real executor and langchain_core's fake chat models."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import StructuredTool, tool

from pipeline.runtime.agent import Agent, run_agent
from pipeline.runtime.artifacts import LocalArtifactStore
from pipeline.runtime.context import marker, pairing_problems
from pipeline.runtime.demo.fake_model import ScriptedChatModel, calls, tool_call
from pipeline.runtime.protocol import ToolError, ToolErrorType
from pipeline.runtime.skills import ACTIVATE_TOOL, RESOURCE_TOOL, SkillRegistry
from pipeline.tokens.counting import count_conversation_tokens
from pipeline.runtime.executor import RetryPolicy

ROOT = Path(__file__).resolve().parents[2]
FAST = RetryPolicy(max_retries=2, initial_delay_s=0.001, max_delay_s=0.002)


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@tool
def rows(n: int) -> list[dict]:
    """Return n rows."""
    return [{"id": i, "name": f"row {i}"} for i in range(n)]


@tool
def broken(x: int) -> str:
    """Always fails."""
    raise ToolError(ToolErrorType.INVALID_INPUT, "x must be positive", code="BAD_X")


def write_essay(topic: str) -> str:
    """Write a long text."""
    return f"{topic} " * 3000


essay = StructuredTool.from_function(write_essay, name="essay", metadata={"ctxlens_store_artifacts": False})


@tool
def web_search(query: str) -> str:
    """Search."""
    return "results"


def test_it_answers_every_tool_call_with_the_models_own_id():
    model = ScriptedChatModel.from_script([
        calls(tool_call("lookup", {"key": "a"}), tool_call("lookup", {"key": "b"}, call_id="call_given")),
        "a and b looked up.",
    ])
    run = run_agent(model, [lookup], [HumanMessage("Look up a and b")])
    [round_] = run.rounds
    assert round_.status == "ok" and round_.final_answer == "a and b looked up."
    ai = run.messages[1]
    assert round_.tool_call_ids == [c["id"] for c in ai.tool_calls] and "call_given" in round_.tool_call_ids
    assert [m.tool_call_id for m in run.messages[2:4]] == round_.tool_call_ids
    assert [m.content for m in run.messages[2:4]] == ["value of a", "value of b"]
    assert pairing_problems(run.messages) == []
    assert round_.llm_calls == 2 and round_.input_tokens > 0 and round_.output_tokens > 0
    assert model.offered_tools[0] == ["lookup", "read_artifact"]  # the agent adds the artifact reader


def test_the_second_call_sees_the_tool_messages():
    model = ScriptedChatModel.from_script([calls(tool_call("lookup", {"key": "z"})), "done"])
    run_agent(model, [lookup], [SystemMessage("Be brief."), HumanMessage("z?")])
    second = model.seen[1]
    assert isinstance(second[-1], ToolMessage) and second[-1].content == "value of z"
    assert isinstance(second[0], SystemMessage)


def test_it_stops_at_the_step_limit_with_a_valid_history():
    model = ScriptedChatModel.from_script(itertools.repeat(calls(tool_call("lookup", {"key": "again"}))))
    run = run_agent(model, [lookup], [HumanMessage("loop")], max_steps=3)
    [round_] = run.rounds
    assert round_.status == "max_steps" and round_.llm_calls == 3 and "after 3 model calls" in round_.error
    assert pairing_problems(run.messages) == []


def test_a_failing_tool_becomes_an_error_observation_and_the_loop_goes_on():
    model = ScriptedChatModel.from_script([calls(tool_call("broken", {"x": -1})), "Sorry, x was invalid."])
    run = run_agent(model, [broken], [HumanMessage("go")])
    observation = run.messages[2]
    assert observation.status == "error"
    assert "Error Type: invalid_parameters" in observation.content and "Error Code: BAD_X" in observation.content
    assert run.rounds[0].status == "ok" and not run.rounds[0].tool_results[0].success


def test_an_unknown_tool_is_answered_not_raised():
    model = ScriptedChatModel.from_script([calls(tool_call("nope")), "ok"])
    run = run_agent(model, [lookup], [HumanMessage("go")])
    assert run.messages[2].status == "error" and "Unknown tool 'nope'" in run.messages[2].content


def test_invalid_tool_calls_get_an_error_answer_with_their_id():
    bad = AIMessage("", invalid_tool_calls=[{"id": "call_bad", "name": "lookup", "args": "{not json", "error": "bad JSON"}])
    model = ScriptedChatModel.from_script([bad, "fixed"])
    run = run_agent(model, [lookup], [HumanMessage("go")])
    answer = run.messages[2]
    assert answer.tool_call_id == "call_bad" and answer.status == "error" and "bad JSON" in answer.content
    assert run.rounds[0].tool_call_ids == ["call_bad"] and pairing_problems(run.messages) == []


@tool
def sales_by_region_quarter() -> dict:
    """Revenue keyed by (region, quarter)."""
    return {("EMEA", "Q3"): 1200.5, ("APAC", "Q3"): 980.0}


def test_a_tool_result_json_cannot_hold_still_answers_its_call(tmp_path):
    model = ScriptedChatModel.from_script([calls(tool_call("sales_by_region_quarter", {}, "c1")), "EMEA leads."])
    agent = Agent(model, [sales_by_region_quarter], artifact_store=LocalArtifactStore(tmp_path))
    round_ = agent.turn("Q3 by region?")
    assert round_.status == "ok" and round_.final_answer == "EMEA leads."
    assert pairing_problems(agent.messages) == []
    assert "('EMEA', 'Q3')" in model.seen[1][-1].content


def test_it_works_with_a_model_without_bind_tools_and_never_invents_ids():
    with_id = AIMessage("", tool_calls=[{"id": "call_1", "name": "lookup", "args": {"key": "k"}}])
    model = GenericFakeChatModel(messages=iter([with_id, "answer"]))
    run = run_agent(model, [lookup], [HumanMessage("go")])
    assert run.rounds[0].final_answer == "answer" and run.messages[2].tool_call_id == "call_1"

    without_id = AIMessage("", tool_calls=[{"id": None, "name": "lookup", "args": {"key": "k"}}])
    model = GenericFakeChatModel(messages=iter([without_id]))
    run = run_agent(model, [lookup], [HumanMessage("go")])
    assert run.rounds[0].status == "error" and "without an id" in run.rounds[0].error
    assert run.messages == [HumanMessage("go")]


def test_a_model_error_marks_the_round_and_propagates():
    def fail(messages):
        raise ConnectionError("provider unreachable")

    agent = Agent(ScriptedChatModel.from_script([fail]), [lookup])
    with pytest.raises(ConnectionError):
        agent.turn("hello")
    assert agent.rounds[0].status == "error" and "provider unreachable" in agent.rounds[0].error


def test_run_agent_runs_the_pending_message_and_further_turns():
    model = ScriptedChatModel.from_script(["first", calls(tool_call("lookup", {"key": "x"})), "second", "third"])
    run = run_agent(model, [lookup], [HumanMessage("one")], turns=["two", HumanMessage("three")], conversation_id="conv-1")
    assert [r.final_answer for r in run.rounds] == ["first", "second", "third"]
    assert [r.index for r in run.rounds] == [0, 1, 2] and run.conversation_id == "conv-1"
    with pytest.raises(ValueError, match="starts with a user message"):
        Agent(model, [lookup], messages=[AIMessage("hi")]).turn()


def test_explicit_output_levels_shape_observations():
    model = ScriptedChatModel.from_script([calls(tool_call("rows", {"n": 12})), "ok"])
    run = run_agent(model, [rows], [HumanMessage("rows")], output_levels={"rows": "brief"})
    assert run.messages[2].content == "Found 12 items"
    assert run.rounds[0].tool_results[0].output_level.value == "brief"


def test_a_skill_narrows_the_tools_injects_its_messages_and_ends_with_the_turn(settings):
    settings.CTXLENS_SKILLS_DIR = ROOT / "skills"
    model = ScriptedChatModel.from_script([
        calls(tool_call(ACTIVATE_TOOL, {"name": "sales-analysis"})),
        calls(tool_call("web_search", {"query": "market"})),
        "Answered from the table.",
        "next turn",
    ])
    agent = Agent(model, [lookup, web_search], skills=SkillRegistry(), retry_policy=FAST)
    round_ = agent.turn("Q3 revenue by region?")
    assert model.offered_tools[0] == ["lookup", "web_search", ACTIVATE_TOOL, RESOURCE_TOOL, "read_artifact"]
    # The skill allows none of the others; its allowed read_artifact is there because the agent added it.
    assert model.offered_tools[1] == [ACTIVATE_TOOL, RESOURCE_TOOL, "read_artifact"]
    activation_result = agent.messages[2]
    assert isinstance(activation_result, ToolMessage) and marker(activation_result)["category"] == "skills"
    injected = agent.messages[3:6]
    assert [marker(m)["kind"] for m in injected] == ["metadata", "instruction", "permissions"]
    assert "# Sales analysis" in injected[1].content
    denied = round_.tool_results[1]
    assert not denied.success and denied.error_type is ToolErrorType.PERMISSION_DENIED
    assert [a.skill for a in round_.skill_activations] == ["sales-analysis"]
    assert pairing_problems(agent.messages) == []
    agent.turn("and now?")
    assert model.offered_tools[-1] == ["lookup", "web_search", ACTIVATE_TOOL, RESOURCE_TOOL, "read_artifact"]


def test_a_user_invoked_skill_is_active_before_the_first_call_and_its_model_is_used(tmp_path, settings):
    skill = tmp_path / "skills" / "brief-mode"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        "---\nname: brief-mode\ndescription: Terse answers.\nmodel: small-model\ndisable-model-invocation: true\n---\nAnswer in five words.\n"
    )
    settings.CTXLENS_SKILLS_DIR = tmp_path / "skills"
    big = ScriptedChatModel.from_script([], model_name="big-model")
    small = ScriptedChatModel.from_script(["Five words exactly, no more."], model_name="small-model")
    agent = Agent(big, [lookup], skills=SkillRegistry(), model_for=lambda name: {"small-model": small}[name])
    assert "brief-mode" not in agent.tools[1].description  # hidden from the model
    round_ = agent.turn("Explain", activate=["brief-mode"])
    assert round_.final_answer == "Five words exactly, no more." and big.seen == []
    assert any("Answer in five words." in str(m.content) for m in small.seen[0])
    assert round_.skill_activations[0].modifier.disable_model_invocation


def test_it_compresses_when_the_window_fills_and_keeps_the_history_valid():
    model = ScriptedChatModel.from_script(
        [step for n in range(4) for step in (calls(tool_call("essay", {"topic": f"topic{n}"})), f"essay {n} done")]
    )
    agent = Agent(model, [essay], context_window=12_000, output_levels={"essay": "full"})
    for n in range(4):
        agent.turn(f"Write essay {n}")
    compressions = [c for r in agent.rounds for c in r.compressions]
    assert compressions and all(c.tokens_after < c.tokens_before for c in compressions)
    assert pairing_problems(agent.messages) == []
    assert all(count_conversation_tokens(sent, model.model_name) <= 12_000 for sent in model.seen)
    assert [m.content for m in agent.messages if isinstance(m, HumanMessage)] == [f"Write essay {n}" for n in range(4)]


def test_the_instructions_of_an_active_skill_survive_compression_within_its_round(settings):
    settings.CTXLENS_SKILLS_DIR = ROOT / "skills"
    script = [calls(tool_call(ACTIVATE_TOOL, {"name": "report-writing"}))]
    script += [calls(tool_call("essay", {"topic": f"t{n}"})) for n in range(4)] + ["report done", "next"]
    model = ScriptedChatModel.from_script(script)
    agent = Agent(model, [essay], skills=SkillRegistry(), context_window=12_000, output_levels={"essay": "full"})
    round_ = agent.turn("Write a report from four essays")
    assert round_.compressions and round_.status == "ok"
    instruction = next(m for m in model.seen[1] if marker(m).get("kind") == "instruction")
    assert all(any(m is instruction for m in sent) for sent in model.seen[1:])
    assert "# Report writing" in instruction.content


def test_the_newest_tool_result_reaches_the_model_whole_when_skill_messages_follow_it(settings):
    settings.CTXLENS_SKILLS_DIR = ROOT / "skills"
    table = " ".join(f"row{i}=value{i}" for i in range(900))
    query_sales = StructuredTool.from_function(
        lambda q: table, name="query_sales", description="Query the sales table.",
        metadata={"ctxlens_store_artifacts": False, "ctxlens_output_level": "full"},
    )
    model = ScriptedChatModel.from_script([
        calls(tool_call(ACTIVATE_TOOL, {"name": "sales-analysis"}, "a1"), tool_call("query_sales", {"q": "q3"}, "q1")),
        "Revenue answer.",
    ])
    history = [HumanMessage("Last year?"), AIMessage("Last year's figures were flat. " * 100)]
    agent = Agent(model, [query_sales], skills=SkillRegistry(), context_window=5200, messages=history)
    round_ = agent.turn("Q3 revenue by region? " + "context " * 1000)
    assert round_.status == "ok" and round_.compressions  # the old answer gave way …
    observation = next(m for m in model.seen[1] if getattr(m, "tool_call_id", None) == "q1")
    assert observation.content == table  # … the result the model is about to read did not
    assert pairing_problems(model.seen[1]) == []


def test_observations_turn_brief_when_the_window_stays_over_80_percent():
    model = ScriptedChatModel.from_script([calls(tool_call("rows", {"n": 5})), "five rows"])
    question = "Summarise these notes, all of them: " + "quarterly revenue notes " * 400  # CRITICAL: never compressed
    window = int(count_conversation_tokens([HumanMessage(question)], model.model_name) / 0.85)
    agent = Agent(model, [rows], context_window=window)
    round_ = agent.turn(question)
    [result] = round_.tool_results
    assert (result.output_level.value, result.observation) == ("brief", "Found 5 items")
    roomy = Agent(ScriptedChatModel.from_script([calls(tool_call("rows", {"n": 5})), "five rows"]), [rows])
    assert roomy.turn(question).tool_results[0].observation.startswith("Found 5 items:\n  - ")
