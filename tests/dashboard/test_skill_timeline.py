"""Skills as an agent developer sees them: the load level the request asked for, the level-3 resource files,
the context modifier (allowed tools, model switch) and the visibility of the injected messages on the
timeline; a model switch without `model_for`; the level-1 listing counted as Skills in the context bar."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.urls import reverse
from langchain_core.language_models import BaseChatModel
from langchain_core.tools import tool

from pipeline.adapters import in_process_telemetry
from pipeline.models import Conversation, LLMCall, SkillActivation
from pipeline.runtime.agent import Agent
from pipeline.runtime.demo.fake_model import ScriptedChatModel, calls, tool_call
from pipeline.runtime.skills import ACTIVATE_TOOL, SkillRegistry
from pipeline.runtime.telemetry.config import ObservabilityConfig
from pipeline.runtime.telemetry.spans import Telemetry
from pipeline.tokens.counting import count_tokens
from tests.otlp_support import make_key

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(transaction=True)


@tool
def query_sales(sql: str) -> str:
    """Run SQL against the sales table."""
    return "revenue=1200"


def factory_model(name: str) -> BaseChatModel:
    """What CTXLENS_MODEL_FACTORY names in a test: a model that says where it came from."""
    return ScriptedChatModel.from_script([f"answered by the configured factory's {name}"], model_name=name)


def write_skill(directory: Path, name: str, front: str) -> None:
    (directory / name).mkdir(parents=True)
    (directory / name / "SKILL.md").write_text(f"---\nname: {name}\ndescription: Short answers.\n{front}---\n"
                                               "Answer in five words.\n")


def page_of(client, alice, conversation_id: str) -> str:
    client.force_login(alice)
    conversation = Conversation.objects.get(external_id=conversation_id)
    return client.get(reverse("conversation", args=[conversation.pk])).content.decode()


def test_a_level_3_activation_shows_its_resource_files_modifier_and_message_visibility(
        otlp_server, settings, client, alice):
    settings.CTXLENS_SKILLS_DIR = ROOT / "skills"
    telemetry = Telemetry.from_config(ObservabilityConfig(
        otlp_endpoint=otlp_server.url, otlp_headers={"Authorization": f"Bearer {make_key()}"}), batch=False)
    model = ScriptedChatModel.from_script([
        calls(tool_call(ACTIVATE_TOOL, {"name": "sales-analysis", "level": 3})), "Revenue was 1,200."], model_name="gpt-4o")
    agent = Agent(model, [query_sales], skills=SkillRegistry(), telemetry=telemetry, conversation_id="skills-l3")
    agent.turn("Q3 revenue?")
    telemetry.shutdown()

    resources = SkillRegistry().get("sales-analysis").resources()
    stored = SkillActivation.objects.get(conversation__external_id="skills-l3")
    assert (stored.load_level, stored.resources) == (3, resources) and len(resources) == 4
    assert stored.context_modifier["allowed_tools"] == sorted(
        ["query_sales", "calculator", "read_artifact", "activate_skill", "read_skill_resource"])
    kinds = [(m["kind"], m["visibility"], m["resource"]) for m in stored.messages]
    assert kinds[:2] == [("metadata", "visible", None), ("instruction", "hidden", None)]
    assert [r for _, _, r in kinds if r] == resources and all(v == "hidden" for _, v, r in kinds if r)
    assert stored.tokens == sum(m["tokens"] for m in stored.messages)

    page = page_of(client, alice, "skills-l3")
    step = page[page.index('class="step step-skill'):]
    step = step[:step.index("</ul>", step.index('class="skill-messages"'))]
    assert "level 3" in step
    assert all(f"<code>{name}</code>" in step for name in resources)
    assert re.search(r'data-modifier="allowed-tools">Allowed tools: activate_skill, calculator, query_sales', step)
    hidden = 2 + len(resources)  # instructions, permissions (allowed tools) and each resource file
    assert ("permissions", "hidden", None) in kinds and sum(v == "hidden" for _, v, _ in kinds) == hidden
    assert len(re.findall(r'data-visibility="hidden"', step)) == hidden
    assert len(re.findall(r'data-visibility="visible"', step)) == 1
    assert "hidden from the user" in step and "# Sales analysis" in step  # the hidden instructions, for debugging

    detail = client.get(f"/api/conversations/{stored.conversation_id}/").json()
    [api] = detail["rounds"][0]["skill_activations"]
    assert (api["load_level"], api["resources"], api["messages"]) == (3, resources, stored.messages)


def test_a_skills_model_switch_needs_no_model_for(settings, tmp_path):
    write_skill(tmp_path, "brief-mode", "model: gpt-4o-mini\n")
    settings.CTXLENS_SKILLS_DIR = tmp_path
    telemetry = in_process_telemetry(batch=False)
    # Without model_for or a configured factory: the same provider's model of that name.
    model = ScriptedChatModel.from_script(["Five words exactly, no more."], model_name="gpt-4o")
    agent = Agent(model, [query_sales], skills=SkillRegistry(), telemetry=telemetry, conversation_id="switch-1")
    assert agent.turn("Explain", activate=["brief-mode"]).final_answer == "Five words exactly, no more."
    # With CTXLENS_MODEL_FACTORY: that factory makes the model.
    settings.CTXLENS_MODEL_FACTORY = f"{__name__}:factory_model"
    agent = Agent(ScriptedChatModel.from_script([], model_name="gpt-4o"), [query_sales], skills=SkillRegistry(),
                  telemetry=telemetry, conversation_id="switch-2")
    assert agent.turn("Explain", activate=["brief-mode"]).final_answer == "answered by the configured factory's gpt-4o-mini"
    telemetry.shutdown()

    for conversation_id in ("switch-1", "switch-2"):
        [call] = LLMCall.objects.filter(conversation__external_id=conversation_id)
        assert call.model == "gpt-4o-mini"
        skill = SkillActivation.objects.get(conversation__external_id=conversation_id)
        assert skill.context_modifier["model"] == "gpt-4o-mini"


def test_a_skills_model_switch_shows_on_the_timeline(settings, tmp_path, client, alice):
    write_skill(tmp_path, "brief-mode", "model: gpt-4o-mini\nallowed-tools: []\n")
    settings.CTXLENS_SKILLS_DIR = tmp_path
    telemetry = in_process_telemetry(batch=False)
    agent = Agent(ScriptedChatModel.from_script(["Short."], model_name="gpt-4o"), [query_sales],
                  skills=SkillRegistry(), telemetry=telemetry, conversation_id="switch-page")
    agent.turn("Explain", activate=["brief-mode"])
    telemetry.shutdown()
    page = page_of(client, alice, "switch-page")
    assert 'data-modifier="model">Model switched to <code>gpt-4o-mini</code>' in page
    assert 'data-modifier="allowed-tools">Allowed tools: activate_skill, read_skill_resource' in page


def test_the_level_1_listing_counts_as_skills_in_the_context_bar(settings, client, alice):
    settings.CTXLENS_SKILLS_DIR = ROOT / "skills"
    telemetry = in_process_telemetry(batch=False)
    agent = Agent(ScriptedChatModel.from_script(["No skill needed."], model_name="gpt-4o"), [query_sales],
                  skills=SkillRegistry(), telemetry=telemetry, conversation_id="listing-1")
    agent.turn("Hello")
    telemetry.shutdown()
    listing = next(t for t in agent.tools if t.name == ACTIVATE_TOOL).description
    assert "- sales-analysis:" in listing and "- report-writing:" in listing

    [call] = LLMCall.objects.filter(conversation__external_id="listing-1")
    assert call.context_composition["skills"] == count_tokens(listing, "gpt-4o") > 0
    assert call.context_tokens == sum(v for k, v in call.context_composition.items() if k != "free")
    page = page_of(client, alice, "listing-1")
    skills = f"{call.context_composition['skills']} tokens"
    assert re.search(r'<span class="seg cat-skills" [^>]*title="Skills: ' + skills, page)
