"""The server's adapters for the agent runtime, for agents run inside ctxlens's own process.

The runtime (pipeline.runtime) is plain Python with injected adapters; here are the
database-backed ones: the server's cache, its artifact store (a row per artifact), the
closing of a worker thread's database connections, and the in-process span exporter.

    telemetry = in_process_telemetry()                       # spans into this server's store
    agent = Agent(model, tools, telemetry=telemetry, **tool_adapters())
    summariser = Summariser(chat_model, cache=server_cache())
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypedDict

from django.core.cache import caches
from django.db import connections
from opentelemetry.sdk.trace.export import SpanExporter

from pipeline.artifacts.store import ServerArtifactStore
from pipeline.ingest.inprocess import StoreSpanExporter
from pipeline.runtime.artifacts import ArtifactStore
from pipeline.runtime.cache import Cache
from pipeline.runtime.telemetry.config import ObservabilityConfig
from pipeline.runtime.telemetry.spans import Telemetry


class ToolAdapters(TypedDict):
    """Keyword arguments of ToolExecutor, Agent, run_agent and run_demo."""

    cache: Cache
    artifact_store: ArtifactStore
    on_worker_exit: Callable[[], None]


def server_cache(alias: str = "default") -> Cache:
    """The server's cache (local memory, or Redis when REDIS_URL is set); it has the runtime's Cache API."""
    return caches[alias]


def close_thread_connections() -> None:
    """Close the calling thread's database connections: the executor's worker-exit hook."""
    connections.close_all()


def tool_adapters(cache_alias: str = "default") -> ToolAdapters:
    return ToolAdapters(
        cache=server_cache(cache_alias), artifact_store=ServerArtifactStore(), on_worker_exit=close_thread_connections
    )


def in_process_telemetry(
    config: ObservabilityConfig | None = None, *, exporters: Sequence[SpanExporter] = (), batch: bool = True
) -> Telemetry:
    """A Telemetry whose spans go into this server's store, and to the configured OTLP endpoint
    and `exporters` as well. `batch=False` stores each span on the agent's thread as it ends."""
    return Telemetry.from_config(config, exporters=[StoreSpanExporter(own_thread=batch), *exporters], batch=batch)
