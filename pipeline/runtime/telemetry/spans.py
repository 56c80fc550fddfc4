"""The pipeline's OpenTelemetry spans, to any OTLP endpoint (a ctxlens server's included) and exporters you pass.

    telemetry = Telemetry.from_config()                      # CTXLENS_SAMPLING, CTXLENS_OTLP_* ...
    telemetry = Telemetry.from_config(ObservabilityConfig.from_settings(
        otlp_endpoint="http://ctxlens:8000", otlp_headers={"Authorization": "Bearer ctx_..."}))
    run_agent(model, tools, messages, telemetry=telemetry); telemetry.shutdown()

Every Telemetry owns its TracerProvider (the global one is never set; configuration, sampling
and destinations are in pipeline.runtime.telemetry.config), so several agents with different destinations can
run in one process; `Telemetry(tracer)` uses a tracer you already have. Span shapes follow the OTel GenAI conventions and pipeline.semconv: `invoke_agent` per
turn (a new trace, linked to the caller's span if there is one), `chat` per model call,
`execute_tool` per tool call, `compress_context` and `activate_skill` (recorded after the fact
with their real start and end times). JSON-valued attributes are JSON strings.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage, BaseMessage
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.metrics import NoOpMeter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import Link, NoOpTracer, Span, SpanKind, Status, StatusCode, Tracer

from pipeline import semconv as sc
from pipeline.runtime.genai_messages import MAX_PART_CHARS, clip, finish_reason, output_message, to_genai_messages
from pipeline.runtime.telemetry.config import (
    SCOPE_NAME,
    SCOPE_VERSION,
    ObservabilityConfig,
    build_resource,
    build_tracer_provider,
)
from pipeline.runtime.telemetry.metrics import PipelineMetrics, build_meter_provider

if TYPE_CHECKING:
    from pipeline.runtime.compression import CompressionResult
    from pipeline.runtime.context import ContextUsage
    from pipeline.runtime.protocol import ToolExecutionResult
    from pipeline.runtime.skills import SkillActivation


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


class Telemetry:
    """The spans and metrics one agent emits. `Telemetry.disabled()` records nothing and costs next to nothing."""

    def __init__(
        self, tracer: Tracer | None = None, *, provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None, capture_content: bool = True, max_chars: int = MAX_PART_CHARS,
    ) -> None:
        self.provider = provider
        self.meter_provider = meter_provider
        self.tracer = tracer or (provider.get_tracer(SCOPE_NAME, SCOPE_VERSION) if provider else NoOpTracer())
        meter = meter_provider.get_meter(SCOPE_NAME, SCOPE_VERSION) if meter_provider else NoOpMeter(SCOPE_NAME)
        self.metrics = PipelineMetrics(meter)
        self.capture_content = capture_content
        self.max_chars = max_chars

    @classmethod
    def from_config(
        cls, config: ObservabilityConfig | None = None, *, exporters: Sequence[SpanExporter] = (), batch: bool = True,
        metric_readers: Sequence[MetricReader] = (),
    ) -> Telemetry:
        """Spans to the OTLP endpoint and `exporters`; metrics to the OTLP endpoint (every
        `metrics_export_interval_s`) and `metric_readers`."""
        config = config or ObservabilityConfig.from_settings()
        provider = build_tracer_provider(config, exporters=exporters, batch=batch)
        meter_provider = build_meter_provider(config, build_resource(config), readers=metric_readers)
        return cls(provider=provider, meter_provider=meter_provider, capture_content=config.capture_content)

    @classmethod
    def disabled(cls) -> Telemetry:
        return cls(NoOpTracer())

    def flush(self, timeout_millis: int = 30_000) -> bool:
        spans = self.provider.force_flush(timeout_millis) if self.provider else True
        metrics = self.meter_provider.force_flush(timeout_millis) if self.meter_provider else True
        return spans and metrics

    def shutdown(self) -> None:
        """Flush and stop: the remaining spans, and a last export of the metrics."""
        if self.provider:
            self.provider.shutdown()
        if self.meter_provider:
            self.meter_provider.shutdown()

    def _messages(self, messages: Sequence[BaseMessage]) -> str:
        return _json(to_genai_messages(messages, self.max_chars))

    # ---- spans -------------------------------------------------------------------------------

    @contextmanager
    def turn(self, *, conversation_id: str, agent_name: str, user_message: str, user_id: str = "") -> Iterator[Span]:
        """One round: the root of a new trace, linked to the caller's current span if any."""
        caller = trace.get_current_span().get_span_context()
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent_name,
            sc.CONVERSATION_ID: conversation_id,
        }
        if user_id:
            attributes["user.id"] = user_id
        if self.capture_content:
            attributes[sc.ROUND_USER_MESSAGE] = clip(user_message, self.max_chars)
        with self.tracer.start_as_current_span(
            f"invoke_agent {agent_name}", context=Context(), kind=SpanKind.INTERNAL, attributes=attributes,
            links=[Link(caller)] if caller.is_valid else None,
        ) as span:
            yield span

    def finish_turn(self, span: Span, *, final_answer: str, error: str = "") -> None:
        if self.capture_content and final_answer:
            span.set_attribute(sc.ROUND_FINAL_ANSWER, clip(final_answer, self.max_chars))
        if error:
            span.set_attribute("error.type", "agent_error")
            span.set_status(Status(StatusCode.ERROR, error))

    @contextmanager
    def chat(
        self, *, model: str, provider: str, conversation_id: str, agent_name: str,
        messages: Sequence[BaseMessage], usage: ContextUsage, tools: Sequence[str] = (),
    ) -> Iterator[Span]:
        """One model call; `usage` is what `messages` fill of the window, by category."""
        with self.tracer.start_as_current_span(f"chat {model}", kind=SpanKind.CLIENT) as span:
            if span.is_recording():
                span.set_attributes({
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": model,
                    "gen_ai.provider.name": provider or "unknown",
                    "gen_ai.agent.name": agent_name,
                    sc.CONVERSATION_ID: conversation_id,
                    sc.CONTEXT_WINDOW: usage.window,
                    sc.CONTEXT_TOKENS: usage.tokens,
                    sc.CONTEXT_COMPOSITION: _json(usage.composition()),
                    sc.TOKENS_APPROXIMATE: usage.approximate,
                })
                if tools:
                    span.set_attribute("gen_ai.tool.definitions", _json([{"type": "function", "name": n} for n in tools]))
                if self.capture_content:
                    span.set_attribute("gen_ai.input.messages", self._messages(messages))
            yield span

    def record_response(self, span: Span, response: AIMessage, *, model: str = "", provider: str = "") -> None:
        """The response's attributes on a `chat` span, and its token usage as metrics (`model`,
        `provider`: what the call asked for, as on `chat`)."""
        usage = response.usage_metadata or {}
        if usage:
            self.metrics.record_tokens(model=model, provider=provider, input_tokens=int(usage.get("input_tokens", 0)),
                                       output_tokens=int(usage.get("output_tokens", 0)))
        if not span.is_recording():
            return
        meta = response.response_metadata or {}
        attributes: dict[str, Any] = {"gen_ai.response.finish_reasons": [finish_reason(response)]}
        if meta.get("model_name") or meta.get("model"):
            attributes["gen_ai.response.model"] = str(meta.get("model_name") or meta.get("model"))
        if response.id:
            attributes["gen_ai.response.id"] = response.id
        if usage:
            attributes["gen_ai.usage.input_tokens"] = int(usage.get("input_tokens", 0))
            attributes["gen_ai.usage.output_tokens"] = int(usage.get("output_tokens", 0))
            details = usage.get("input_token_details") or {}
            if details.get("cache_read"):
                attributes["gen_ai.usage.cache_read.input_tokens"] = int(details["cache_read"])
            if details.get("cache_creation"):
                attributes["gen_ai.usage.cache_creation.input_tokens"] = int(details["cache_creation"])
            reasoning = (usage.get("output_token_details") or {}).get("reasoning")
            if reasoning:
                attributes["gen_ai.usage.reasoning.output_tokens"] = int(reasoning)
        if self.capture_content:
            attributes["gen_ai.output.messages"] = _json([output_message(response, self.max_chars)])
        span.set_attributes(attributes)

    @contextmanager
    def tool(self, tool_call: Mapping[str, Any], *, conversation_id: str) -> Iterator[Span]:
        name = str(tool_call.get("name") or "")
        with self.tracer.start_as_current_span(f"execute_tool {name}", kind=SpanKind.INTERNAL) as span:
            if span.is_recording():
                span.set_attributes({
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": name,
                    "gen_ai.tool.type": "function",
                    "gen_ai.tool.call.id": str(tool_call.get("id") or ""),
                    sc.CONVERSATION_ID: conversation_id,
                })
                if self.capture_content:
                    span.set_attribute("gen_ai.tool.call.arguments", _json(tool_call.get("args", {})))
            yield span

    def record_tool_result(self, span: Span, result: ToolExecutionResult) -> None:
        """The result's attributes on an `execute_tool` span (failed attempts become events), and its metrics."""
        self.metrics.record_tool(result)
        if not span.is_recording():
            return
        attributes: dict[str, Any] = {
            sc.TOOL_OUTPUT_LEVEL: result.output_level.value,
            sc.TOOL_RETRY_COUNT: result.retry_count,
            sc.TOOL_OBSERVATION_TOKENS: result.observation_tokens,
            sc.TOKENS_APPROXIMATE: result.observation_tokens_approximate,
            sc.TOOL_CACHE_HIT: result.cache_hit,
        }
        if result.artifact_id:
            attributes[sc.TOOL_ARTIFACT_ID] = result.artifact_id
        if self.capture_content:
            attributes["gen_ai.tool.call.result"] = clip(result.content, self.max_chars)
        for attempt in result.attempts:
            if attempt.get("error_type"):
                span.add_event("ctxlens.tool.attempt_failed", {
                    "error.type": attempt["error_type"], "timeout_ms": attempt.get("timeout_ms") or 0,
                    "duration_ms": float(attempt.get("ms") or 0),
                    "adopted": bool(attempt.get("adopted")),  # waited for an earlier run instead of starting one
                })
        if not result.success:
            error_type = result.error_type.value if result.error_type else "error"
            attributes.update({sc.TOOL_ERROR_TYPE: error_type, "error.type": error_type, sc.TOOL_ERROR_CODE: result.error_code or ""})
            span.set_status(Status(StatusCode.ERROR, result.error_message or error_type))
        span.set_attributes(attributes)

    def record_compression(self, result: CompressionResult, *, conversation_id: str) -> None:
        """A `compress_context` span for one compression, with its real start and end."""
        span = self.tracer.start_span("compress_context", kind=SpanKind.INTERNAL, start_time=result.started_ns or None)
        if span.is_recording():
            span.set_attributes({
                sc.SPAN_KIND: sc.SPAN_KIND_COMPRESSION,
                sc.CONVERSATION_ID: conversation_id,
                sc.COMPRESSION_STRATEGY: result.strategy.value,
                sc.COMPRESSION_TOKENS_BEFORE: result.tokens_before,
                sc.COMPRESSION_TOKENS_AFTER: result.tokens_after,
                sc.COMPRESSION_MESSAGES_BEFORE: len(result.before),
                sc.COMPRESSION_MESSAGES_AFTER: len(result.after),
                sc.COMPRESSION_TOKENS_BEFORE_BY_CATEGORY: _json(result.usage_before.composition()),
                sc.COMPRESSION_TOKENS_AFTER_BY_CATEGORY: _json(result.usage_after.composition()),
                sc.COMPRESSION_DROPPED: _json(result.dropped),
                sc.COMPRESSION_SUMMARISED: _json(result.summarised),
                sc.COMPRESSION_CONTEXT_WINDOW: result.usage_before.window,
                sc.COMPRESSION_SUMMARY_STATUS: result.summary_status,
                sc.COMPRESSION_ESTIMATED_COSTS: _json(result.estimated_costs),
                sc.COMPRESSION_SELECTION: result.selection,
            })
            if self.capture_content:
                span.set_attributes({
                    sc.COMPRESSION_BEFORE_MESSAGES: self._messages(result.before),
                    sc.COMPRESSION_AFTER_MESSAGES: self._messages(result.after),
                    sc.COMPRESSION_SUMMARY: result.summary,
                })
        span.end(end_time=result.ended_ns or None)

    def record_skill(self, activation: SkillActivation, *, conversation_id: str) -> None:
        """An `activate_skill` span for one activation (at its load level) or resource load (level 3):
        the resource files, the context modifier, and the injected messages with their visibility."""
        span = self.tracer.start_span(
            f"activate_skill {activation.skill}", kind=SpanKind.INTERNAL, start_time=activation.started_ns or None
        )
        if span.is_recording():
            span.set_attributes({
                sc.SPAN_KIND: sc.SPAN_KIND_SKILL,
                sc.CONVERSATION_ID: conversation_id,
                sc.SKILL_NAME: activation.skill,
                sc.SKILL_LEVEL: activation.level,
                sc.SKILL_CHAIN: _json(activation.chain),
                sc.SKILL_DEPTH: max(activation.depth, 1),
                sc.SKILL_CONTEXT_MODIFIER: _json(activation.modifier.to_dict()),
                sc.SKILL_TOKENS: activation.tokens,
            })
            if activation.resource:
                span.set_attribute(sc.SKILL_RESOURCE, activation.resource)
            resources = activation.resources or ([activation.resource] if activation.resource else [])
            if resources:
                span.set_attribute(sc.SKILL_RESOURCES, _json(resources))
            if activation.messages:
                described = activation.described_messages()
                for d in described:
                    if self.capture_content:
                        d["content"] = str(d["content"])[: self.max_chars]
                    else:
                        del d["content"]
                span.set_attribute(sc.SKILL_MESSAGES, _json(described))
            if activation.error:
                span.set_attribute("error.type", "skill_activation_failed")
                span.set_status(Status(StatusCode.ERROR, activation.error))
        span.end(end_time=activation.ended_ns or None)
