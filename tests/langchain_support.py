"""Pieces the real-LangChain instrumentation tests share: a fake tool-calling chat model, a tool,
LangGraph's prebuilt ReAct agent over them, and an instrumentor whose spans go to a span
processor (`instrumented_in_process`) or over OTLP to a live server (`instrumented`)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from langchain_core.callbacks import BaseCallbackManager
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from tests.otlp_support import auth


class FakeToolChat(GenericFakeChatModel):
    """GenericFakeChatModel that accepts bind_tools, like a real provider model."""

    model_name: str = "fake-gpt-4o"

    @property
    def _llm_type(self) -> str:
        return "fake-tool-chat"

    def bind_tools(self, tools: list[Any], **kwargs: Any):
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _get_ls_params(self, stop=None, **kwargs: Any) -> dict[str, Any]:
        return {**super()._get_ls_params(stop=stop, **kwargs), "ls_provider": "faketool",
                "ls_model_name": self.model_name}


@tool
def get_weather(city: str) -> str:
    """Return the weather for a city."""
    return f"Sunny, 21C in {city}"


def react_agent(replies: list[AIMessage], tools: list | None = None, **kwargs: Any):
    """LangGraph's prebuilt ReAct agent over a FakeToolChat that gives `replies`, with `tools`
    (get_weather by default).

    `create_react_agent` is deprecated in favour of `langchain.agents.create_agent`, which needs
    the `langchain` package; both build the same graph of an "agent" and a "tools" node."""
    from langgraph.prebuilt import create_react_agent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return create_react_agent(FakeToolChat(messages=iter(replies)), tools or [get_weather],
                                  prompt="You are a weather bot.", **kwargs)


def _patched_methods() -> list[tuple[type, str]]:
    """Methods the LangChain instrumentations wrap that OpenLLMetry's uninstrument leaves wrapped
    (0.62.4 unwraps "BaseCallbackManager.__init__" from the module `langchain_core`, a no-op, and
    stops unwrapping LangGraph at the first langchain_openai method it cannot import)."""
    methods: list[tuple[type, str]] = [(BaseCallbackManager, "__init__")]
    try:
        from langgraph.pregel import Pregel
        from langgraph.types import Command
    except ImportError:
        return methods
    return [*methods, (Pregel, "stream"), (Pregel, "astream"), (Command, "__init__")]


@contextmanager
def instrumented_in_process(instrumentor, processor: SpanProcessor, service: str = "lc-agent") -> Iterator[TracerProvider]:
    """`instrumentor` on, its spans going to `processor`; flushed and fully off on exit."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(processor)
    originals = [(owner, name, owner.__dict__[name]) for owner, name in _patched_methods()]
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield provider
    finally:
        instrumentor.uninstrument()
        for owner, name, method in originals:  # or the next test's spans go to this provider too
            setattr(owner, name, method)
        assert provider.force_flush(10_000)
        provider.shutdown()


def instrumented(instrumentor, server, key: str, service: str = "lc-agent"):
    """`instrumentor` on, exporting over OTLP/HTTP to `server`."""
    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers=auth(key), compression=Compression.Gzip)
    return instrumented_in_process(instrumentor, BatchSpanProcessor(exporter), service)
