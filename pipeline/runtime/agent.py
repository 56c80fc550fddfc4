"""The ReAct loop on LangChain: model → tool calls → ToolMessages → model …, one round per user turn.

    run = run_agent(ChatOpenAI(model="gpt-4o"), [query_sales, web_search], [HumanMessage("Q3 revenue?")],
                    skills=SkillRegistry(), telemetry=Telemetry.from_config())
    run.rounds[-1].final_answer

Each step: apply ready background summaries (at a round's start) and compress when the window
is over the threshold; offer the model the tools the active skills allow (`bind_tools` when the
model supports it) and switch model if a skill asks for one (`model_for`, else the configured
CTXLENS_MODEL_FACTORY, else the same provider's model of that name: pipeline.runtime.model_factory);
run every tool call through the ToolExecutor and append its ToolMessage (the id is the model's;
every tool is offered with an optional `output_level` argument, the explicit level of the
seeds' chain, and a `read_artifact` tool joins when artifacts can be produced);
inject the messages of skills activated on the way. The round ends at an answer without tool
calls or at `max_steps`. Works with any LangChain chat model that supports tool calling.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from pipeline.runtime.artifact_tool import needs_artifact_reader, read_artifact_tool
from pipeline.runtime.artifacts import ArtifactStore
from pipeline.runtime.cache import Cache
from pipeline.runtime.compression import CompressionResult, CompressionStrategy, ContextCompressor
from pipeline.runtime.context import SKILLS_CATEGORY, measure, with_extra, with_marker
from pipeline.runtime.model_factory import ModelSwitch
from pipeline.runtime.observations import LEVEL_ARGUMENT
from pipeline.runtime.protocol import (
    ContextModifier,
    ExecutionContext,
    OutputLevel,
    ToolErrorType,
    ToolExecutionResult,
    format_error_observation,
)
from pipeline.runtime.settings import runtime_settings
from pipeline.runtime.skills import ACTIVATE_TOOL, SKILL_TOOLS, SkillActivation, SkillRegistry, SkillSession, filter_tools
from pipeline.runtime.summariser import Summariser
from pipeline.runtime.telemetry.spans import Telemetry
from pipeline.tokens.counting import count_tokens
from pipeline.runtime.executor import RetryPolicy, ToolExecutor

logger = logging.getLogger(__name__)

DEFAULT_AGENT_NAME = "ctxlens-agent"


@dataclass
class AgentRound:
    """One user turn: what was asked, what the model did, and how it ended."""

    index: int
    user_message: str
    final_answer: str = ""
    status: str = "running"  # ok | max_steps | error
    error: str = ""
    llm_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    tool_results: list[ToolExecutionResult] = field(default_factory=list)
    tool_call_ids: list[str] = field(default_factory=list)  # as the model sent them, in order
    compressions: list[CompressionResult] = field(default_factory=list)
    skill_activations: list[SkillActivation] = field(default_factory=list)
    trace_id: str = ""
    duration_ms: float = 0.0


@dataclass
class AgentRun:
    conversation_id: str
    rounds: list[AgentRound]
    messages: list[BaseMessage]


def model_name_of(chat_model: BaseChatModel) -> str:
    for attr in ("model_name", "model", "model_id"):
        value = getattr(chat_model, attr, None)
        if isinstance(value, str) and value:
            return value
    try:
        return str(chat_model._get_ls_params().get("ls_model_name") or chat_model._llm_type)
    except Exception:
        return type(chat_model).__name__


def provider_of(chat_model: BaseChatModel) -> str:
    try:
        return str(chat_model._get_ls_params().get("ls_provider") or "")
    except Exception:
        return ""


LEVEL_SCHEMA = {
    "type": "string",
    "enum": [level.value for level in OutputLevel],
    "description": "Optional: how detailed the result should be. brief = key facts, standard = the "
    "actionable part, full = everything, stored as an artifact you can read back by its id.",
}


def tool_definition(tool: BaseTool) -> dict[str, Any]:
    """The tool as the model sees it (OpenAI function format), with the optional `output_level`
    argument the executor understands; skill tools and tools with their own such parameter stay as they are."""
    definition = convert_to_openai_tool(tool)
    if tool.name in SKILL_TOOLS:
        return definition
    parameters = definition["function"].setdefault("parameters", {"type": "object", "properties": {}})
    parameters.setdefault("properties", {}).setdefault(LEVEL_ARGUMENT, dict(LEVEL_SCHEMA))
    return definition


def bind(chat_model: BaseChatModel, tools: Sequence[BaseTool]) -> Any:
    """The model with `tools` bound, or the bare model if it has no tool calling."""
    if not tools:
        return chat_model
    try:
        return chat_model.bind_tools([tool_definition(tool) for tool in tools])
    except NotImplementedError:
        return chat_model


class Agent:
    """One conversation: its messages, skills, compressor and telemetry, run turn by turn."""

    def __init__(
        self,
        chat_model: BaseChatModel,
        tools: Sequence[BaseTool],
        *,
        messages: Sequence[BaseMessage] = (),
        system_prompt: str = "",
        model: str = "",
        conversation_id: str = "",
        agent_name: str = DEFAULT_AGENT_NAME,
        user_id: str = "",
        max_steps: int = 10,
        skills: SkillRegistry | SkillSession | None = None,
        compressor: ContextCompressor | None = None,
        compression_strategy: CompressionStrategy | str = CompressionStrategy.AUTO,
        summariser: Summariser | None = None,
        context_window: int | None = None,
        executor: ToolExecutor | None = None,
        retry_policy: RetryPolicy | None = None,
        cache: Cache | None = None,
        artifact_store: ArtifactStore | None = None,
        on_worker_exit: Callable[[], None] | None = None,
        telemetry: Telemetry | None = None,
        model_for: Callable[[str], BaseChatModel] | None = None,
        conversation: Any = None,
        output_levels: Mapping[str, OutputLevel | str] | None = None,
        cleanup_artifacts: bool | None = None,
    ) -> None:
        self.chat_model = chat_model
        self.model = model or model_name_of(chat_model)
        self.provider = provider_of(chat_model)
        self.conversation_id = conversation_id or uuid.uuid4().hex
        self.agent_name = agent_name
        self.user_id = user_id
        self.max_steps = max_steps
        self.model_for = model_for
        self.models = ModelSwitch(chat_model, self.model, model_for)  # a skill's model switch
        self.conversation = conversation
        self.telemetry = telemetry or Telemetry.disabled()
        if isinstance(skills, SkillRegistry):
            skills = SkillSession(skills, model=self.model)
        self.skills = skills
        self.tools = list(tools) + (skills.tools() if skills and skills.registry.skills else [])
        if executor is not None and output_levels:
            raise ValueError("pass output_levels to the ToolExecutor you give the agent")
        self.executor = executor or ToolExecutor(
            self.tools, model=self.model, cache=cache, artifact_store=artifact_store, on_worker_exit=on_worker_exit,
            output_levels=output_levels, **({"retry_policy": retry_policy} if retry_policy else {}),
        )
        if needs_artifact_reader(tool for tool in self.tools if getattr(tool, "name", "") not in SKILL_TOOLS):
            reader = read_artifact_tool(self.executor.artifact_store)
            self.tools.append(reader)
            self.executor.add_tool(reader)
        self.compressor = compressor or ContextCompressor(
            self.model, window=context_window, strategy=compression_strategy, summariser=summariser
        )
        self.messages: list[BaseMessage] = list(messages)
        if system_prompt and not (self.messages and isinstance(self.messages[0], SystemMessage)):
            self.messages.insert(0, SystemMessage(system_prompt))
        self.rounds: list[AgentRound] = []
        # close() removes the session's artifacts (None: runtime_settings().artifact_cleanup_on_session_end)
        self.cleanup_artifacts = cleanup_artifacts
        self._active_skill_messages: set[int] = set()  # ids of this round's skill messages: kept whole

    @property
    def run(self) -> AgentRun:
        return AgentRun(self.conversation_id, self.rounds, self.messages)

    def artifact_ids(self) -> set[str]:
        """The artifacts this session's tool calls stored (or reused)."""
        return {t.artifact_id for r in self.rounds for t in r.tool_results if t.artifact_id}

    def close(self) -> int:
        """End the session: when configured, remove the artifacts it stored; the number removed.

        Only stores that offer `remove(ids)` are cleaned (LocalArtifactStore). A server's store
        (ctxlens's ServerArtifactStore) has none on purpose: there an artifact a stored tool call
        refers to stays until its conversation is pruned, so the dashboard can still show it, and
        the server's own cleanup applies the TTL and size cap. Artifacts are content-addressed: one
        another session of the same store produced with the same content goes too (its reads then
        answer that the artifact does not exist).
        """
        enabled = runtime_settings().artifact_cleanup_on_session_end if self.cleanup_artifacts is None \
            else self.cleanup_artifacts
        remove = getattr(self.executor.artifact_store, "remove", None)
        if not enabled or remove is None:
            return 0
        removed = remove(self.artifact_ids())
        logger.info("session %s ended: removed %d artifact(s)", self.conversation_id, removed)
        return removed

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _model(self, modifier: ContextModifier | None) -> tuple[BaseChatModel, str]:
        return self.models.get(modifier.model if modifier else None)

    def turn(self, user_message: str | HumanMessage | None = None, *, activate: Sequence[str] = ()) -> AgentRound:
        """Run one round. Without `user_message` the conversation must already end with one.

        `activate` names skills the user invokes for this round (like a slash command): they are
        activated before the first model call, even those that disable model invocation.
        """
        if user_message is not None:
            message = user_message if isinstance(user_message, HumanMessage) else HumanMessage(user_message)
            self.messages.append(message)
        last = self.messages[-1] if self.messages else None
        if not isinstance(last, HumanMessage):
            raise ValueError("a round starts with a user message")
        round_ = AgentRound(index=len(self.rounds), user_message=str(last.text))
        self.rounds.append(round_)
        started = time.perf_counter()
        with self.telemetry.turn(
            conversation_id=self.conversation_id, agent_name=self.agent_name,
            user_message=round_.user_message, user_id=self.user_id,
        ) as span:
            round_.trace_id = format(span.get_span_context().trace_id, "032x")
            try:
                for name in activate:
                    self._activate_for_user(round_, name)
                self._loop(round_)
            except Exception as exc:
                round_.status, round_.error = "error", f"{type(exc).__name__}: {exc}"
                self.telemetry.finish_turn(span, final_answer="", error=round_.error)
                raise
            finally:
                if self.skills:
                    self.skills.end_turn()
                self._active_skill_messages.clear()
                round_.duration_ms = (time.perf_counter() - started) * 1000
            self.telemetry.finish_turn(
                span, final_answer=round_.final_answer, error=round_.error if round_.status != "ok" else ""
            )
        return round_

    def _loop(self, round_: AgentRound) -> None:
        for step in range(self.max_steps):
            self._compress(round_, round_start=step == 0)
            modifier = self.skills.modifier if self.skills else None
            offered = filter_tools(self.tools, modifier)
            model, model_name = self._model(modifier)
            usage = measure(self.messages, model_name, self.compressor.window)
            provider = self.provider if model is self.chat_model else provider_of(model)
            listing = next((t for t in offered if t.name == ACTIVATE_TOOL), None)
            if listing is not None:  # level 1 of every skill, read by the model in the tool's description
                usage = with_extra(usage, SKILLS_CATEGORY, count_tokens(listing.description, model_name))
            with self.telemetry.chat(
                model=model_name, provider=provider, conversation_id=self.conversation_id,
                agent_name=self.agent_name, messages=self.messages, usage=usage, tools=[t.name for t in offered],
            ) as span:
                response = bind(model, offered).invoke(self.messages)
                self.telemetry.record_response(span, response, model=model_name, provider=provider)
            round_.llm_calls += 1
            if response.usage_metadata:
                round_.input_tokens += response.usage_metadata.get("input_tokens", 0)
                round_.output_tokens += response.usage_metadata.get("output_tokens", 0)
            if any(not call.get("id") for call in response.tool_calls):
                # Ids are never generated: an unanswerable call must not enter the history.
                round_.status, round_.error = "error", "the model returned a tool call without an id"
                return
            self.messages.append(response)
            if not response.tool_calls and not response.invalid_tool_calls:
                round_.final_answer, round_.status = str(response.text), "ok"
                return
            context = ExecutionContext(
                modifier=modifier, context_usage=usage.ratio, model=model_name, conversation=self.conversation
            )
            for call in response.tool_calls:
                self._call_tool(round_, call, context)
            for bad in response.invalid_tool_calls:
                self._answer_invalid(round_, bad)
            self._inject_skill_messages()
        round_.status, round_.error = "max_steps", f"no final answer after {self.max_steps} model calls"

    def _activate_for_user(self, round_: AgentRound, name: str) -> None:
        if self.skills is None:
            raise ValueError("this agent has no skills")
        try:
            self.skills.activate(name, by_model=False)
        finally:
            for activation in self.skills.drain_events():
                round_.skill_activations.append(activation)
                self.telemetry.record_skill(activation, conversation_id=self.conversation_id)
        self._inject_skill_messages()

    def _inject_skill_messages(self) -> None:
        if self.skills:
            injected = self.skills.drain_messages()
            self._active_skill_messages.update(id(m) for m in injected)
            self.messages.extend(injected)

    def _compress(self, round_: AgentRound, *, round_start: bool) -> None:
        active = self._active_skill_messages
        self.messages, results = self.compressor.prepare(
            self.messages, round_start=round_start, keep=(lambda m: id(m) in active) if active else None
        )
        for result in results:
            round_.compressions.append(result)
            self.telemetry.record_compression(result, conversation_id=self.conversation_id)

    def _call_tool(self, round_: AgentRound, call: dict[str, Any], context: ExecutionContext) -> None:
        round_.tool_call_ids.append(call["id"])
        with self.telemetry.tool(call, conversation_id=self.conversation_id) as span:
            result = self.executor.execute_tool_call(call, context=context)
            self.telemetry.record_tool_result(span, result)
        round_.tool_results.append(result)
        message: BaseMessage = result.to_tool_message()
        if call["name"] in SKILL_TOOLS:
            message = with_marker(message, category=SKILLS_CATEGORY)
        self.messages.append(message)
        if self.skills:
            for activation in self.skills.drain_events():
                round_.skill_activations.append(activation)
                self.telemetry.record_skill(activation, conversation_id=self.conversation_id)

    def _answer_invalid(self, round_: AgentRound, bad: dict[str, Any]) -> None:
        """A call whose arguments did not parse still needs an answer, or the history is invalid."""
        if not bad.get("id"):
            return
        round_.tool_call_ids.append(bad["id"])
        text = format_error_observation(bad["id"], ToolErrorType.INVALID_PARAMETERS, "INVALID_ARGUMENTS", bad.get("error") or "arguments are not valid JSON")
        self.messages.append(ToolMessage(content=text, tool_call_id=bad["id"], name=bad.get("name") or None, status="error"))


def run_agent(
    chat_model: BaseChatModel,
    tools: Sequence[BaseTool],
    messages: Sequence[BaseMessage],
    *,
    turns: Sequence[str | HumanMessage] = (),
    **options: Any,
) -> AgentRun:
    """Run the conversation's pending user message (if it ends with one), then each of `turns`.

    Options are Agent's: system_prompt, model, conversation_id, agent_name, user_id, max_steps,
    skills, compressor / compression_strategy / summariser / context_window, executor /
    retry_policy, the executor's adapters (cache, artifact_store, on_worker_exit), output_levels (tool name →
    OutputLevel: the tool configuration, which a level the model asks for in a call's arguments
    overrides), telemetry, model_for, conversation, cleanup_artifacts. When a tool can produce
    artifacts the agent adds `read_artifact` (reading its executor's artifact store) unless a tool
    of that name is given. The run is one session: it ends with Agent.close().
    """
    with Agent(chat_model, tools, messages=messages, **options) as agent:
        if agent.messages and isinstance(agent.messages[-1], HumanMessage):
            agent.turn()
        for user_message in turns:
            agent.turn(user_message)
    return agent.run
