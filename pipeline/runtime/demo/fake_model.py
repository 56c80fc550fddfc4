"""A scripted chat model for the demo and tests: langchain_core's GenericFakeChatModel that
supports tool calling, reports token usage, and lets a script step look at the conversation.

A step is an AIMessage, a string (a final answer), or a callable taking the messages so far and
returning either. Tool calls without an id get one from the *model*, as a provider would
("call_" + 24 hex characters); the agent never invents ids. Usage is counted with the
pipeline's tokenizer for `model_name`, so the demo's numbers look like a real model's.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field

from pipeline.tokens.counting import count_conversation_tokens, count_message_tokens

Step = AIMessage | str | Callable[[list[BaseMessage]], "AIMessage | str"]


def tool_call(name: str, args: dict[str, Any] | None = None, call_id: str | None = None) -> dict[str, Any]:
    """A tool call for a script; leave `call_id` out and the model assigns one."""
    return {"name": name, "args": args or {}, "id": call_id, "type": "tool_call"}


def calls(*tool_calls: dict[str, Any], thought: str = "") -> AIMessage:
    return AIMessage(content=thought, tool_calls=list(tool_calls))


class ScriptedChatModel(GenericFakeChatModel):
    """Plays `messages` (the script) one step per call."""

    model_name: str = "gpt-4o-mini"
    provider: str = "demo"
    offered_tools: list[list[str]] = Field(default_factory=list)  # tool names bound at each call
    seen: list[list[BaseMessage]] = Field(default_factory=list)  # what each call was sent

    @classmethod
    def from_script(cls, script: Sequence[Step] | Iterator[Step], **fields: Any) -> ScriptedChatModel:
        steps = iter(list(script)) if isinstance(script, Sequence) else iter(script)
        return cls(messages=steps, **fields)

    @property
    def _llm_type(self) -> str:
        return "scripted-fake-chat"

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params.update(ls_provider=self.provider, ls_model_name=self.model_name)
        return params

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(
        self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self.seen.append(list(messages))
        self.offered_tools.append([t["function"]["name"] for t in kwargs.get("tools") or []])
        try:
            step = next(self.messages)
        except StopIteration:
            raise RuntimeError("the script has no more steps") from None
        if callable(step) and not isinstance(step, AIMessage):
            step = step(list(messages))
        message = AIMessage(content=step) if isinstance(step, str) else step.model_copy(deep=True)
        message.tool_calls = [
            {**call, "id": call.get("id") or f"call_{secrets.token_hex(12)}"} for call in message.tool_calls
        ]
        message.usage_metadata = {
            "input_tokens": count_conversation_tokens(messages, self.model_name),
            "output_tokens": count_message_tokens(message, self.model_name),
            "total_tokens": 0,
        }
        message.usage_metadata["total_tokens"] = (
            message.usage_metadata["input_tokens"] + message.usage_metadata["output_tokens"]
        )
        finish = "tool_calls" if message.tool_calls else "stop"
        message.response_metadata = {"model_name": self.model_name, "finish_reason": finish}
        return ChatResult(generations=[ChatGeneration(message=message)])

