"""Skills: loading at levels 1/2/3, nested activation, cycles, the stack, modifiers and messages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool

from pipeline.runtime.protocol import ContextModifier, ToolError, ToolErrorType
from pipeline.runtime.skills import (
    ACTIVATE_TOOL,
    RESOURCE_TOOL,
    SkillActivationStack,
    SkillCycleError,
    SkillDepthError,
    SkillError,
    SkillNotFound,
    SkillRegistry,
    SkillSession,
    filter_tools,
    parse_front_matter,
)
from pipeline.tokens.counting import count_tokens

ROOT = Path(__file__).resolve().parents[2]
MODEL = "gpt-4o"


def make_skill(base: Path, name: str, *, body: str = "Do the thing.", **front: object) -> Path:
    directory = base / name
    directory.mkdir(parents=True, exist_ok=True)
    lines = [f"name: {front.pop('front_name', name)}", f"description: {front.pop('description', 'Skill ' + name)}"]
    for key, value in front.items():
        lines.append(f"{key.replace('_', '-')}: {value}")
    (directory / "SKILL.md").write_text("---\n" + "\n".join(lines) + "\n---\n" + body + "\n")
    return directory


@pytest.fixture
def skills_dir(tmp_path, settings) -> Path:
    path = tmp_path / "skills"
    path.mkdir()
    settings.CTXLENS_SKILLS_DIR = path
    return path


def test_it_loads_the_shipped_skills_at_level_one_with_token_counts():
    registry = SkillRegistry(ROOT / "skills")
    assert registry.problems == []
    assert set(registry.skills) >= {"sales-analysis", "report-writing"}
    assert "- sales-analysis: Answer questions about the company's sales" in registry.listing()
    tokens = registry.level_tokens("sales-analysis", MODEL)
    assert 0 < tokens[1] < tokens[2]
    assert tokens[3] > 0  # references, scripts and assets
    assert tokens[1] == count_tokens(registry.get("sales-analysis").metadata.listing, MODEL)


def test_level_two_is_the_body_without_front_matter():
    skill = SkillRegistry(ROOT / "skills").get("report-writing")
    body = skill.instructions()
    assert body.startswith("# Report writing")
    assert "description:" not in body


def test_it_reads_the_skills_dir_from_settings(skills_dir):
    make_skill(skills_dir, "alpha")
    assert list(SkillRegistry().skills) == ["alpha"]


def test_front_matter_fields_become_a_context_modifier(skills_dir):
    make_skill(skills_dir, "alpha", allowed_tools="query_sales, calculator", model="gpt-4o-mini")
    metadata = SkillRegistry().get("alpha").metadata
    assert metadata.allowed_tools == {"query_sales", "calculator"}
    modifier = metadata.context_modifier()
    assert modifier.model == "gpt-4o-mini"
    assert modifier.allows("calculator") and modifier.allows(ACTIVATE_TOOL) and not modifier.allows("web_search")


@pytest.mark.parametrize(
    "text, problem",
    [
        ("no front matter\n", "must start with YAML front matter"),
        ("---\nname: broken\ndescription: x\n", "not closed"),
        ("---\nname: broken\ndescription: [unclosed\n---\n", "not valid YAML"),
        ("---\nname: broken\n---\nbody", "'description' is required"),
        ("---\nname: Broken Name\ndescription: x\n---\n", "lower-case letters"),
        ("---\nname: other\ndescription: x\n---\n", "the directory must have that name"),
    ],
)
def test_a_broken_skill_is_skipped_and_described_without_stopping_the_others(skills_dir, text, problem):
    make_skill(skills_dir, "good")
    (skills_dir / "broken").mkdir()
    (skills_dir / "broken" / "SKILL.md").write_text(text)
    registry = SkillRegistry()
    assert list(registry.skills) == ["good"]
    assert len(registry.problems) == 1 and problem in registry.problems[0]
    assert str(skills_dir) not in registry.problems[0]


def test_parse_front_matter_accepts_a_bom_and_returns_the_body():
    data, body = parse_front_matter("\ufeff---\nname: a\ndescription: b\n---\n\n# Title\n")
    assert data == {"name": "a", "description": "b"} and body == "# Title"


def test_level_three_lists_and_reads_resources_and_describes_binary_assets(skills_dir):
    directory = make_skill(skills_dir, "alpha")
    (directory / "references").mkdir()
    (directory / "references" / "notes.md").write_text("glossary")
    (directory / "scripts").mkdir()
    (directory / "scripts" / "run.py").write_text("print(1)")
    (directory / "assets").mkdir()
    (directory / "assets" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    (directory / "references" / ".hidden").write_text("secret")
    skill = SkillRegistry().get("alpha")
    assert skill.resources() == ["scripts/run.py", "references/notes.md", "assets/logo.png"]
    assert skill.read_resource("references/notes.md") == "glossary"
    assert skill.read_resource("assets/logo.png") == "[binary asset assets/logo.png: 10 bytes]"


def test_a_resource_over_the_size_limit_is_refused(skills_dir):
    directory = make_skill(skills_dir, "alpha")
    (directory / "references").mkdir()
    (directory / "references" / "huge.md").write_text("x" * (256 * 1024 + 1))
    (directory / "references" / "fits.md").write_text("x" * (256 * 1024))
    skill = SkillRegistry().get("alpha")
    with pytest.raises(SkillError, match="larger than 262144 bytes"):
        skill.read_resource("references/huge.md")
    assert len(skill.read_resource("references/fits.md")) == 256 * 1024


@pytest.mark.parametrize(
    "path",
    [
        "../beta/SKILL.md",
        "references/../../beta/SKILL.md",
        "/etc/passwd",
        "SKILL.md",
        "references/notes.md\x00.png",
        "references%2F..%2F..%2Fbeta%2FSKILL.md",
        "references\\..\\..\\beta\\SKILL.md",
        "references/link.md",
        "references/missing.md",
        "",
        "references",
    ],
)
def test_level_three_never_leaves_the_skill_directory(skills_dir, path):
    directory = make_skill(skills_dir, "alpha")
    make_skill(skills_dir, "beta")
    (directory / "references").mkdir()
    (directory / "references" / "notes.md").write_text("ok")
    os.symlink(skills_dir / "beta" / "SKILL.md", directory / "references" / "link.md")
    skill = SkillRegistry().get("alpha")
    with pytest.raises(SkillNotFound) as caught:
        skill.read_resource(path)
    assert str(skills_dir) not in str(caught.value)
    assert "references/link.md" not in skill.resources()


def test_activation_injects_visible_metadata_and_hidden_instruction_and_permissions(skills_dir):
    make_skill(skills_dir, "alpha", body="Use SQL.", allowed_tools="query_sales")
    session = SkillSession(SkillRegistry(), model=MODEL)
    [activation] = session.activate("alpha")
    assert activation.level == 2 and activation.chain == ["alpha"]
    assert [(m.kind, m.visible) for m in activation.messages] == [
        ("metadata", True), ("instruction", False), ("permissions", False)
    ]
    assert activation.tokens == sum(count_tokens(m.content, MODEL) for m in activation.messages)
    messages = session.drain_messages()
    assert all(isinstance(m, HumanMessage) for m in messages)
    assert "Use SQL." in messages[1].content
    assert messages[1].additional_kwargs["ctxlens"] == {
        "category": "skills", "skill": "alpha", "kind": "instruction", "visible": False
    }
    assert "query_sales" in messages[2].content
    assert session.drain_messages() == []


def test_nested_activation_through_requires_narrows_the_modifier(skills_dir):
    make_skill(skills_dir, "outer", allowed_tools="query_sales, calculator", requires="inner")
    make_skill(skills_dir, "inner", allowed_tools="calculator, web_search", model="small-model")
    session = SkillSession(SkillRegistry(), model=MODEL)
    done = session.activate("outer")
    assert [(a.skill, a.chain) for a in done] == [("outer", ["outer"]), ("inner", ["outer", "inner"])]
    assert session.stack.chain == ["outer", "inner"]
    modifier = session.modifier
    assert modifier.allowed_tools == {"calculator", ACTIVATE_TOOL, RESOURCE_TOOL}
    assert modifier.model == "small-model"


def test_a_direct_cycle_names_the_path_and_pushes_nothing(skills_dir):
    make_skill(skills_dir, "loop", requires="loop")
    session = SkillSession(SkillRegistry(), model=MODEL)
    with pytest.raises(SkillCycleError, match="Circular skill activation: loop → loop"):
        session.activate("loop")
    assert session.stack.depth == 0 and session.active == [] and session.drain_messages() == []
    [failed] = session.drain_events()
    assert failed.error and "loop → loop" in failed.error


def test_an_indirect_cycle_names_the_full_path(skills_dir):
    make_skill(skills_dir, "a", requires="b")
    make_skill(skills_dir, "b", requires="c")
    make_skill(skills_dir, "c", requires="a")
    session = SkillSession(SkillRegistry(), model=MODEL, max_depth=5)
    with pytest.raises(SkillCycleError) as caught:
        session.activate("a")
    assert str(caught.value) == "Circular skill activation: a → b → c → a"
    assert caught.value.path == ["a", "b", "c", "a"]
    assert session.stack.depth == 0


def test_the_model_reactivating_an_active_skill_is_a_cycle(skills_dir):
    make_skill(skills_dir, "a")
    make_skill(skills_dir, "b")
    session = SkillSession(SkillRegistry(), model=MODEL)
    session.activate("a")
    session.activate("b")  # nested under a
    assert session.stack.chain == ["a", "b"]
    with pytest.raises(SkillCycleError, match="a → b → a"):
        session.activate("a")
    assert session.stack.chain == ["a", "b"]


def test_depth_is_limited_to_three(skills_dir):
    for name, nxt in [("d1", "d2"), ("d2", "d3"), ("d3", "d4"), ("d4", None)]:
        make_skill(skills_dir, name, **({"requires": nxt} if nxt else {}))
    session = SkillSession(SkillRegistry(), model=MODEL)
    with pytest.raises(SkillDepthError, match="deeper than 3: d1 → d2 → d3 → d4"):
        session.activate("d1")
    assert session.stack.depth == 0
    assert [a.skill for a in session.activate("d2")] == ["d2", "d3", "d4"]


def test_the_stack_pops_in_order_and_refuses_a_mismatched_pop():
    stack = SkillActivationStack()
    assert stack.push("a") == ["a"]
    assert stack.push("b") == ["a", "b"]
    with pytest.raises(SkillError, match="innermost active skill is 'b'"):
        stack.pop("a")
    stack.pop("b")
    stack.pop("a")
    assert stack.depth == 0 and stack.top is None


def test_end_turn_pops_every_active_skill(skills_dir):
    make_skill(skills_dir, "a", allowed_tools="calculator")
    session = SkillSession(SkillRegistry(), model=MODEL)
    session.activate("a")
    assert session.modifier is not None
    session.end_turn()
    assert session.stack.depth == 0 and session.modifier is None
    session.activate("a")  # no cycle once the turn is over


def test_a_skill_that_disables_model_invocation_is_hidden_from_the_model(skills_dir):
    make_skill(skills_dir, "manual", disable_model_invocation="true")
    make_skill(skills_dir, "auto")
    registry = SkillRegistry()
    assert [m.name for m in registry.for_model()] == ["auto"]
    session = SkillSession(registry, model=MODEL)
    with pytest.raises(SkillError, match="cannot be activated by the model"):
        session.activate("manual")
    assert session.activate("manual", by_model=False)[0].modifier.disable_model_invocation


def test_the_modifier_filters_the_tool_set(skills_dir):
    @tool
    def query_sales(sql: str) -> str:
        """Run SQL."""
        return sql

    @tool
    def web_search(query: str) -> str:
        """Search."""
        return query

    make_skill(skills_dir, "a", allowed_tools="query_sales")
    session = SkillSession(SkillRegistry(), model=MODEL)
    everything = [query_sales, web_search, *session.tools()]
    assert filter_tools(everything, session.modifier) == everything
    session.activate("a")
    assert [t.name for t in filter_tools(everything, session.modifier)] == ["query_sales", ACTIVATE_TOOL, RESOURCE_TOOL]
    assert filter_tools(everything, ContextModifier(allowed_tools=frozenset())) == []


def test_the_skill_tools_activate_and_read_resources_and_raise_tool_errors(skills_dir):
    directory = make_skill(skills_dir, "alpha", description="Analyse things")
    (directory / "references").mkdir()
    (directory / "references" / "notes.md").write_text("the glossary")
    session = SkillSession(SkillRegistry(), model=MODEL)
    activate, read = session.tools()
    assert "- alpha: Analyse things" in activate.description
    with pytest.raises(ToolError) as caught:
        read.invoke({"skill": "alpha", "path": "references/notes.md"})
    assert caught.value.error_type is ToolErrorType.INVALID_INPUT  # not active yet
    assert "Skill alpha activated at level 2; chain: alpha" in activate.invoke({"name": "alpha"})
    assert read.invoke({"skill": "alpha", "path": "references/notes.md"}) == "the glossary"
    with pytest.raises(ToolError) as caught:
        read.invoke({"skill": "alpha", "path": "../alpha/SKILL.md"})
    assert caught.value.error_type is ToolErrorType.NOT_FOUND
    with pytest.raises(ToolError) as caught:
        activate.invoke({"name": "nope"})
    assert caught.value.error_type is ToolErrorType.NOT_FOUND
    events = session.drain_events()
    assert [(e.skill, e.level, e.resource) for e in events] == [("alpha", 2, None), ("alpha", 3, "references/notes.md")]
    assert events[1].tokens == count_tokens("the glossary", MODEL)


def test_the_load_level_is_per_request_and_nested_activations_inherit_it(skills_dir):
    make_skill(skills_dir, "outer", requires="[inner]", allowed_tools="[lookup]", model="gpt-4o-mini",
               body="Outer instructions.")
    inner = make_skill(skills_dir, "inner", body="Inner instructions.")
    (inner / "references").mkdir()
    (inner / "references" / "notes.md").write_text("inner notes")
    session = SkillSession(SkillRegistry(), model=MODEL)
    activate, _ = session.tools()

    assert "activated at level 1" in activate.invoke({"name": "outer", "level": 1})
    outer, nested = session.drain_events()
    assert (outer.level, nested.level) == (1, 1)
    assert [(m.kind, m.visible) for m in outer.messages] == [("metadata", True)]  # no instructions at level 1
    assert "Allowed tools: lookup." in outer.messages[0].content and "Model: gpt-4o-mini." in outer.messages[0].content
    assert "Outer instructions." not in outer.messages[0].content
    assert outer.tokens == count_tokens(outer.messages[0].content, MODEL)
    session.end_turn()

    session.activate("inner", level=3)
    [loaded] = session.drain_events()
    assert loaded.resources == ["references/notes.md"]
    [resource] = [m for m in loaded.messages if m.resource]
    assert not resource.visible and resource.content.endswith("inner notes")
    assert loaded.tokens == sum(loaded.message_tokens) == sum(count_tokens(m.content, MODEL) for m in loaded.messages)
    session.end_turn()

    with pytest.raises(ToolError) as caught:
        activate.invoke({"name": "inner", "level": 4})
    assert caught.value.error_type is ToolErrorType.INVALID_INPUT and "1, 2 or 3" in str(caught.value)
