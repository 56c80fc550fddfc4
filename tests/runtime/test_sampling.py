"""Sampling as the design documents do it (MEDIUM, each tool call on its own) and as ctxlens
does by default (every turn), seen in what the server stores from a real agent's spans."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from langchain_core.tools import tool

from pipeline.adapters import in_process_telemetry
from pipeline.models import LLMCall, Round, ToolCall
from pipeline.runtime.agent import Agent
from pipeline.runtime.demo.fake_model import ScriptedChatModel, calls, tool_call
from pipeline.runtime.settings import RuntimeSettings
from pipeline.runtime.telemetry.config import ObservabilityConfig, build_tracer_provider

TURNS, CALLS_PER_TURN = 40, 5


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


def run_turns(config: ObservabilityConfig) -> None:
    """TURNS turns, each one model call asking for CALLS_PER_TURN lookups and one answering."""
    telemetry = in_process_telemetry(config, batch=False)
    script = [
        step for turn in range(TURNS) for step in (
            calls(*(tool_call("lookup", {"key": f"{turn}-{n}"}) for n in range(CALLS_PER_TURN))), f"answer {turn}",
        )
    ]
    agent = Agent(ScriptedChatModel.from_script(script), [lookup], telemetry=telemetry, conversation_id="sampled")
    for turn in range(TURNS):
        agent.turn(f"question {turn}")
    telemetry.shutdown()


@pytest.mark.django_db(transaction=True)
def test_the_documents_medium_per_tool_call_sampling_keeps_every_turn_and_one_tool_call_in_ten():
    run_turns(ObservabilityConfig(sampling="medium", sampling_scope="tool_call"))

    assert Round.objects.count() == TURNS  # turns and model calls are never sampled out
    assert LLMCall.objects.count() == 2 * TURNS
    kept = ToolCall.objects.count()
    assert 5 <= kept <= 45  # about 10 % of 200: 20, with a standard deviation of about 4
    per_turn = {r.tool_call_count for r in Round.objects.all()}
    assert per_turn - {0, CALLS_PER_TURN}, "each tool call is decided on its own, not its whole turn"


@pytest.mark.django_db(transaction=True)
def test_ctxlens_default_keeps_every_turn_whole():
    assert ObservabilityConfig().sampling == RuntimeSettings().sampling == "always"

    run_turns(ObservabilityConfig())

    assert (Round.objects.count(), ToolCall.objects.count()) == (TURNS, TURNS * CALLS_PER_TURN)


def test_sampling_scope_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("CTXLENS_SAMPLING", "medium")
    monkeypatch.setenv("CTXLENS_SAMPLING_SCOPE", "tool_call")
    settings = RuntimeSettings.from_env()
    assert (settings.sampling, settings.sampling_scope) == ("medium", "tool_call")


def test_sampling_scope_comes_from_the_servers_settings(settings):
    settings.CTXLENS_SAMPLING_SCOPE = "tool_call"
    assert ObservabilityConfig.from_settings().sampling_scope == "tool_call"


def test_an_unknown_sampling_scope_is_refused(settings):
    with pytest.raises(ValueError, match="sampling_scope must be one of turn, tool_call"):
        build_tracer_provider(ObservabilityConfig(sampling_scope="per_span"))
    settings.CTXLENS_SAMPLING_SCOPE = "per_span"
    assert "pipeline.E071" in {message.id for message in run_checks()}
