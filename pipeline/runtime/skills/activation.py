"""Skill activation: the stack, nesting and cycles, the combined modifier, injected messages.

A `SkillSession` holds one conversation's skill state: the activation stack (push on
activation, pop at the end of the turn), nested activation (a skill's `requires`, or the model
activating a skill while another is active) with a depth limit of 3 and cycle detection whose
error names the whole path (a → b → a), the active skills' ContextModifiers narrowed together,
and the skill messages waiting to be injected into the conversation. `tools()` gives the model
its two skill tools: `activate_skill` (at the load level the request asks for, 2 by default) and
`read_skill_resource` (one level-3 file).

Load levels, per request as the seeds' SkillActivationRequest has them (nested activations
inherit the level of the request that caused them):
1. metadata only: the front matter (name, description, allowed tools, model), one visible message;
2. the full instructions (SKILL.md body) too, hidden from the user's transcript;
3. every resource file (scripts/, references/, assets/) as well, each one hidden message.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from langchain_core.messages import HumanMessage
from langchain_core.tools import BaseTool, StructuredTool

from pipeline.runtime.protocol import ContextModifier, ToolError, ToolErrorType
from pipeline.runtime.skills.loader import (
    ACTIVATE_TOOL,
    RESOURCE_TOOL,
    Skill,
    SkillCycleError,
    SkillDepthError,
    SkillError,
    SkillNotFound,
    SkillRegistry,
)
from pipeline.tokens.counting import count_tokens

MAX_DEPTH = 3


LEVELS = (1, 2, 3)


@dataclass(frozen=True)
class SkillMessage:
    """A message a skill injects: metadata (visible), its instructions and permissions (hidden)."""

    skill: str
    kind: Literal["metadata", "instruction", "permissions"]
    content: str
    visible: bool
    resource: str | None = None  # level 3: the file this message carries

    def to_message(self) -> HumanMessage:
        # Hidden messages still go to the model; `visible` is for a UI that shows the transcript.
        marker = {"category": "skills", "skill": self.skill, "kind": self.kind, "visible": self.visible}
        if self.resource:
            marker["resource"] = self.resource
        return HumanMessage(content=self.content, additional_kwargs={"ctxlens": marker})

    def describe(self, tokens: int) -> dict[str, object]:
        """What the timeline shows of it: kind, visibility, the resource it carries, tokens, text."""
        return {"kind": self.kind, "visibility": "visible" if self.visible else "hidden",
                "resource": self.resource, "tokens": tokens, "content": self.content}


@dataclass
class SkillActivation:
    """One activation (level 2) or resource load (level 3), with what it cost and when it happened."""

    skill: str
    level: int
    chain: list[str]
    modifier: ContextModifier
    messages: list[SkillMessage] = field(default_factory=list)
    tokens: int = 0
    resource: str | None = None  # read_skill_resource: the one file read
    resources: list[str] = field(default_factory=list)  # level 3: every resource file loaded
    message_tokens: list[int] = field(default_factory=list)  # of each of `messages`
    error: str | None = None
    started_ns: int = 0
    ended_ns: int = 0

    @property
    def depth(self) -> int:
        return len(self.chain)

    def described_messages(self) -> list[dict[str, object]]:
        return [m.describe(t) for m, t in zip(self.messages, self.message_tokens, strict=False)]


class SkillActivationStack:
    """The chain of skills active right now, outermost first. Push on activation, pop when done."""

    def __init__(self, max_depth: int = MAX_DEPTH) -> None:
        self.max_depth = max_depth
        self._names: list[str] = []

    def push(self, name: str) -> list[str]:
        path = [*self._names, name]
        if name in self._names:
            raise SkillCycleError(path)
        if len(path) > self.max_depth:
            raise SkillDepthError(path, self.max_depth)
        self._names.append(name)
        return path

    def pop(self, name: str) -> None:
        if not self._names or self._names[-1] != name:
            raise SkillError(f"cannot pop {name!r}: the innermost active skill is {self.top!r}")
        self._names.pop()

    @property
    def top(self) -> str | None:
        return self._names[-1] if self._names else None

    @property
    def chain(self) -> list[str]:
        return list(self._names)

    @property
    def depth(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names


class SkillSession:
    """One conversation's skills: activation, the combined modifier, and messages to inject."""

    def __init__(self, registry: SkillRegistry, *, model: str = "", max_depth: int = MAX_DEPTH) -> None:
        self.registry = registry
        self.model = model
        self.stack = SkillActivationStack(max_depth)
        self.active: list[SkillActivation] = []
        self._events: list[SkillActivation] = []
        self._pending: list[SkillMessage] = []

    def activate(self, name: str, *, level: int = 2, by_model: bool = True) -> list[SkillActivation]:
        """Activate a skill at `level` (1-3), nested under whatever is active, then its `requires`.

        All or nothing: on a cycle or a too-deep chain, everything this call pushed is popped
        and a SkillError naming the full path is raised (and recorded as a failed activation).
        """
        if level not in LEVELS:
            raise SkillError(f"load level must be 1, 2 or 3, not {level!r}")
        skill = self.registry.get(name)
        if by_model and skill.metadata.disable_model_invocation:
            raise SkillError(f"skill {name} cannot be activated by the model")
        pushed: list[SkillActivation] = []
        try:
            self._activate(skill, pushed, level)
        except SkillError as exc:
            failed = SkillActivation(name, level, [*self.stack.chain], self.modifier or ContextModifier(), error=str(exc))
            failed.started_ns = failed.ended_ns = time.time_ns()
            for activation in reversed(pushed):
                self.stack.pop(activation.skill)
            self._events.append(failed)
            raise
        self.active.extend(pushed)
        self._events.extend(pushed)
        for activation in pushed:
            self._pending.extend(activation.messages)
        return pushed

    def _activate(self, skill: Skill, pushed: list[SkillActivation], level: int) -> None:
        started = time.time_ns()
        chain = self.stack.push(skill.name)
        activation = SkillActivation(skill.name, level, chain, skill.metadata.context_modifier(), started_ns=started)
        pushed.append(activation)
        activation.messages = self._messages(skill, chain, level)
        activation.resources = [m.resource for m in activation.messages if m.resource]
        activation.message_tokens = [count_tokens(m.content, self.model) for m in activation.messages]
        activation.tokens = sum(activation.message_tokens)
        activation.ended_ns = time.time_ns()
        for required in skill.metadata.requires:
            self._activate(self.registry.get(required), pushed, level)

    def _messages(self, skill: Skill, chain: list[str], level: int = 2) -> list[SkillMessage]:
        via = f" (via {' → '.join(chain)})" if len(chain) > 1 else ""
        mod = skill.metadata
        if level == 1:
            about = [f'The "{skill.name}" skill is active{via}: {mod.description}']
            if mod.allowed_tools is not None:
                about.append("Allowed tools: " + (", ".join(sorted(mod.allowed_tools)) or "none") + ".")
            if mod.model:
                about.append(f"Model: {mod.model}.")
            return [SkillMessage(skill.name, "metadata", " ".join(about), True)]
        resources = skill.resources()
        body = skill.instructions()
        if resources and level == 2:
            body += f"\n\nResources on demand with {RESOURCE_TOOL}: " + ", ".join(resources)
        messages = [
            SkillMessage(skill.name, "metadata", f'The "{skill.name}" skill is loading{via}.', True),
            SkillMessage(skill.name, "instruction", f"Instructions of skill {skill.name}:\n\n{body}", False),
        ]
        if level == 3:
            messages += [
                SkillMessage(skill.name, "instruction", f"Resource {rel} of skill {skill.name}:\n\n"
                             f"{skill.read_resource(rel)}", False, resource=rel)
                for rel in resources
            ]
        limits = []
        if mod.allowed_tools is not None:
            limits.append("tools limited to " + (", ".join(sorted(mod.allowed_tools)) or "none"))
        if mod.model:
            limits.append(f"model {mod.model}")
        if limits:
            messages.append(SkillMessage(skill.name, "permissions", f"Skill {skill.name}: {'; '.join(limits)}.", False))
        return messages

    def load_resource(self, name: str, relative: str) -> tuple[SkillActivation, str]:
        """Level 3: one resource of an active skill."""
        if name not in self.stack:
            raise SkillError(f"activate skill {name} before reading its resources")
        started = time.time_ns()
        skill = self.registry.get(name)
        text = skill.read_resource(relative)
        activation = SkillActivation(
            name, 3, self.stack.chain[: self.stack.chain.index(name) + 1], skill.metadata.context_modifier(),
            tokens=count_tokens(text, self.model), resource=relative, started_ns=started, ended_ns=time.time_ns(),
        )
        self._events.append(activation)
        return activation, text

    @property
    def modifier(self) -> ContextModifier | None:
        """The active skills' modifiers narrowed together, outermost first; None when none is active."""
        combined: ContextModifier | None = None
        for activation in self.active:
            combined = activation.modifier if combined is None else combined.narrow(activation.modifier)
        return combined

    def end_turn(self) -> None:
        """Pop every active skill, innermost first: modifiers last for the turn that activated them."""
        for activation in reversed(self.active):
            self.stack.pop(activation.skill)
        self.active.clear()

    def drain_events(self) -> list[SkillActivation]:
        events, self._events = self._events, []
        return events

    def drain_messages(self) -> list[HumanMessage]:
        messages, self._pending = self._pending, []
        return [m.to_message() for m in messages]

    def tools(self) -> list[BaseTool]:
        """The two tools the model uses: activate a skill (level 2) and read a resource (level 3)."""
        listing = self.registry.listing() or "(no skills installed)"

        def activate_skill(name: str, level: int = 2) -> str:
            """level: 1 = what the skill is, 2 = its full instructions, 3 = also every resource file."""
            try:
                done = self.activate(name, level=level)
            except SkillNotFound as exc:
                raise ToolError(ToolErrorType.NOT_FOUND, str(exc), code="SKILL_NOT_FOUND") from None
            except SkillError as exc:
                raise ToolError(ToolErrorType.INVALID_INPUT, str(exc), code="SKILL_ACTIVATION_FAILED") from None
            names = " → ".join(done[0].chain)
            extra = f" (also loaded: {', '.join(a.skill for a in done[1:])})" if len(done) > 1 else ""
            follows = {1: "Its description follows.", 2: "Its instructions follow.",
                       3: "Its instructions and resources follow."}[level]
            return f"Skill {name} activated at level {level}; chain: {names}{extra}. {follows}"

        def read_skill_resource(skill: str, path: str) -> str:
            try:
                _, text = self.load_resource(skill, path)
            except SkillNotFound as exc:
                raise ToolError(ToolErrorType.NOT_FOUND, str(exc), code="SKILL_RESOURCE_NOT_FOUND") from None
            except SkillError as exc:
                raise ToolError(ToolErrorType.INVALID_INPUT, str(exc), code="SKILL_RESOURCE_FAILED") from None
            return text

        return [
            StructuredTool.from_function(
                activate_skill,
                name=ACTIVATE_TOOL,
                description="Load a skill when the task matches it: level 1 says what it is, 2 (the default) "
                            "gives its full instructions, 3 also every resource file. Skills:\n" + listing,
            ),
            StructuredTool.from_function(
                read_skill_resource,
                name=RESOURCE_TOOL,
                description="Read one resource file (e.g. 'references/glossary.md') of an active skill.",
            ),
        ]


def filter_tools(tools: Iterable[BaseTool], modifier: ContextModifier | None) -> list[BaseTool]:
    """The tools an active modifier lets the model see."""
    return [t for t in tools if modifier is None or modifier.allows(t.name)]
