"""One span → the facts the models need, by the normalisation table (research doc §6).

Pure functions, no database: `normalise(record)` reads OTel GenAI, OpenInference,
OpenLLMetry (current and legacy) and ctxlens.* attributes, first present wins, and returns a
`NormalisedSpan` with ready-to-store field dicts for the LLM call, tool call, compression or
skill activation the span describes. Linking across spans (rounds, tool ↔ LLM call) is
`pipeline.ingest.write.linking`'s job, because spans arrive in any order.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pipeline import semconv as sc
from pipeline.ingest.normalise import messages as msg
from pipeline.ingest.normalise.composition import composition_from_sizes
from pipeline.ingest.normalise.digest import message_digest
from pipeline.ingest.normalise.payloads import (
    tool_arguments,
    tool_call_id_from_payloads,
    tool_output,
    turn_input,
    turn_output,
)
from pipeline.ingest.records import SpanRecord
from pipeline.ingest.normalise.values import (
    MAX_COUNT, first, first_bool, first_count, first_str, json_counts, json_dict, parse_json, to_text,
)
from pipeline.runtime.errors import canonical_error_type
from pipeline.tokens.counting import context_window

STRATEGIES = ("truncate", "extract", "summarize")  # compression strategies a cost may be recorded for
MAX_COST_USD = 1e12  # an estimated cost past this is no estimate (and an int past 1e308 no float)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
STATUS_ERROR = 2

LLM, TOOL, AGENT, CHAIN, OTHER = "llm", "tool", "agent", "chain", "other"
COMPRESSION, SKILL, CONVERSATION = sc.SPAN_KIND_COMPRESSION, sc.SPAN_KIND_SKILL, sc.SPAN_KIND_CONVERSATION

GENAI_OPERATION_KIND = {
    "chat": LLM, "text_completion": LLM, "generate_content": LLM, "embeddings": LLM,
    "execute_tool": TOOL, "invoke_agent": AGENT, "create_agent": AGENT,
    "invoke_workflow": CHAIN, "retrieval": OTHER,
}
OPENINFERENCE_KIND = {"LLM": LLM, "EMBEDDING": LLM, "TOOL": TOOL, "AGENT": AGENT, "CHAIN": CHAIN}
TRACELOOP_KIND = {"tool": TOOL, "agent": AGENT, "workflow": CHAIN, "task": CHAIN}
MODEL_KEYS = ("gen_ai.request.model", "gen_ai.response.model", "llm.model_name", "llm.request.model_name")


MAX_KEY = 255  # Conversation.external_id and Round.round_key
KEY_HASH = 32  # hex characters of sha256 that stand for the cut part
MAX_RESULT_ERROR_CHARS = 2000  # of a failed tool's result taken as its error message


def bounded_key(key: str) -> str:
    """A conversation or round id that fits its column and stays distinct: a long one keeps its
    first characters and ends with a hash of the whole id. (Cut at 255 characters, two long ids
    that differ only at the end were one conversation; REST refuses ids past 255 outright.)"""
    if len(key) <= MAX_KEY:
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:KEY_HASH]
    return f"{key[:MAX_KEY - KEY_HASH - 1]}~{digest}"


def nanos_to_datetime(nanos: int) -> datetime:
    return EPOCH + timedelta(microseconds=nanos // 1000)


@dataclass(slots=True)
class NormalisedSpan:
    record: SpanRecord
    kind: str  # llm | tool | agent | chain | other | compression | skill_activation | conversation
    conversation_key: str  # the explicit conversation/session id, "" when the span names none
    round_key: str  # ctxlens.round.id, else the trace id
    started_at: datetime
    ended_at: datetime | None
    duration_ms: float | None
    status: str  # ok | error
    error_type: str = ""
    error_message: str = ""
    agent_name: str = ""
    user_id: str = ""
    service_name: str = ""
    title: str = ""  # a title the client gave the conversation (ctxlens.conversation.title)
    user_message: str = ""  # the turn's input, from a root span or the ctxlens.round.* attributes
    final_answer: str = ""
    llm: dict[str, Any] | None = None
    tool: dict[str, Any] | None = None
    compression: dict[str, Any] | None = None
    skill: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # The Span row's attributes, events, links and resource as the database takes them, encoded
    # before the transaction (pipeline.ingest.write.rows.encode_span_json); None: encoded in it.
    span_json: tuple[Any, Any, Any, Any] | None = None

    @property
    def is_root(self) -> bool:
        return not self.record.parent_span_id

    @property
    def in_round(self) -> bool:
        """Whether the span belongs to a turn; a conversation-metadata span does not."""
        return self.kind != CONVERSATION

    @property
    def span_kind(self) -> str:
        """The Span.kind column: compressions, skill activations, conversation metadata are `other`."""
        return self.kind if self.kind in (LLM, TOOL, AGENT, CHAIN) else OTHER


def span_kind(record: SpanRecord) -> str:
    attrs = record.attributes
    own = attrs.get(sc.SPAN_KIND)
    if own in (COMPRESSION, SKILL, CONVERSATION):
        return own
    for value, table in (
        (attrs.get("gen_ai.operation.name"), GENAI_OPERATION_KIND),
        (attrs.get("openinference.span.kind"), OPENINFERENCE_KIND),
        (attrs.get("traceloop.span.kind"), TRACELOOP_KIND),
    ):
        if value and isinstance(value, str | int | float):  # a list or map here names no kind (found by fuzzing)
            kind = table.get(value if table is not OPENINFERENCE_KIND else str(value).upper())
            if kind:
                return kind
            if table is not GENAI_OPERATION_KIND:
                return OTHER
    if attrs.get("llm.request.type") in ("chat", "completion"):
        return LLM
    name = record.name
    if name.startswith("execute_tool ") or name.endswith(".tool"):
        return TOOL
    if name.startswith(sc.SEED_TOOL_SPAN_PREFIX) or sc.SEED_TOOL_SUCCESS in attrs:  # the design documents' wrapper
        return TOOL
    if name.endswith((".workflow", ".task")):
        return CHAIN
    if name.endswith((".chat", ".completion")) or first(attrs, *MODEL_KEYS, "gen_ai.system"):
        return LLM
    return OTHER


def conversation_key(attrs: dict[str, Any]) -> str:
    key = first_str(
        attrs, sc.CONVERSATION_ID, "session.id",
        "traceloop.association.properties.session_id",
        "traceloop.association.properties.conversation_id",
        "traceloop.association.properties.thread_id",
    )
    if key:
        return key
    if "metadata" in attrs:
        meta = json_dict(attrs["metadata"])
        return first_str(meta, "session_id", "conversation_id", "thread_id")
    return ""


def _error(record: SpanRecord) -> tuple[str, str, str]:
    """(status, error_type, error_message) from span status, error.type, tool.success/tool.error, exception events."""
    attrs = record.attributes
    error_type = first_str(attrs, sc.TOOL_ERROR_TYPE, sc.SEED_TOOL_ERROR_TYPE, "error.type")
    message = first_str(attrs, sc.SEED_TOOL_ERROR) or record.status_message
    failed = (
        record.status_code == STATUS_ERROR or bool(error_type) or attrs.get("gen_ai.task.status") == "failure"
        or _is_false(attrs.get(sc.SEED_TOOL_SUCCESS))
    )
    for event in record.events:
        if event.name == "exception":
            failed = True
            error_type = error_type or first_str(event.attributes, "exception.type")
            message = message or first_str(event.attributes, "exception.message")
    return ("error" if failed else "ok"), error_type[:255], message


def _is_false(value: Any) -> bool:
    return value is False or (isinstance(value, str) and value.strip().lower() == "false")


def _duration_ms(value: Any) -> float | None:
    """A duration in milliseconds the span states, or None when absent, negative or not a number."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number >= 0 else None


def model_of(attrs: dict[str, Any]) -> tuple[str, str, str]:
    """(model, request_model, response_model): response wins for `model`."""
    request = first_str(attrs, "gen_ai.request.model", "llm.request.model_name", "llm.model_name")
    response = first_str(attrs, "gen_ai.response.model", "llm.response.model_name")
    model = response or request
    if not model:
        meta = json_dict(attrs.get("metadata"))
        params = json_dict(attrs.get("llm.invocation_parameters"))
        model = first_str(meta, "ls_model_name") or first_str(
            attrs, "traceloop.association.properties.ls_model_name"
        ) or first_str(params, "model", "model_name")
    return model[:255], request[:255], response[:255]


def _provider(attrs: dict[str, Any]) -> str:
    provider = first_str(attrs, "gen_ai.provider.name", "gen_ai.system", "llm.provider", "llm.system")
    if provider.lower() == "langchain":  # OpenLLMetry names the framework, not the vendor
        provider = first_str(attrs, "traceloop.association.properties.ls_provider") or first_str(
            json_dict(attrs.get("metadata")), "ls_provider"
        ) or provider
    return provider[:255]


def _finish_reason(attrs: dict[str, Any], output: list[msg.Message]) -> str:
    reasons = parse_json(attrs.get("gen_ai.response.finish_reasons"))
    if isinstance(reasons, list | tuple) and reasons:
        return to_text(reasons[0])[:64]
    if isinstance(reasons, str) and reasons:
        return reasons[:64]
    for message in output:
        if message.get("finish_reason"):
            return to_text(message["finish_reason"])[:64]
    return first_str(attrs, "llm.finish_reason", "gen_ai.response.finish_reason", "llm.response.finish_reason")[:64]


def llm_fields(record: SpanRecord) -> dict[str, Any]:
    attrs = record.attributes
    model, request_model, response_model = model_of(attrs)
    groups = msg.flattened_groups(attrs)
    input_messages = msg.input_messages(attrs, groups)
    output_messages = msg.output_messages(attrs, groups)
    input_tokens = first_count(attrs, "gen_ai.usage.input_tokens", "llm.token_count.prompt", "gen_ai.usage.prompt_tokens")
    output_tokens = first_count(
        attrs, "gen_ai.usage.output_tokens", "llm.token_count.completion", "gen_ai.usage.completion_tokens"
    )
    total = first_count(attrs, "gen_ai.usage.total_tokens", "llm.token_count.total", "llm.usage.total_tokens")
    composition = json_counts(attrs.get(sc.CONTEXT_COMPOSITION))
    window = first_count(attrs, sc.CONTEXT_WINDOW)
    input_digest = message_digest(input_messages)
    if not composition and input_tokens is not None and input_messages:
        window = window or context_window(model)
        composition = composition_from_sizes(input_digest, input_tokens, window)
    fields = {
        "model": model,
        "request_model": request_model,
        "response_model": response_model,
        "provider": _provider(attrs),
        "operation": (first_str(attrs, "gen_ai.operation.name") or "chat")[:64],
        "input_tokens": input_tokens or 0,
        "output_tokens": output_tokens or 0,
        "total_tokens": total if total is not None else min((input_tokens or 0) + (output_tokens or 0), MAX_COUNT),
        "cache_read_tokens": first_count(
            attrs, "gen_ai.usage.cache_read.input_tokens", "llm.token_count.prompt_details.cache_read",
            "gen_ai.usage.cache_read_input_tokens",
        ) or 0,
        "cache_write_tokens": first_count(
            attrs, "gen_ai.usage.cache_creation.input_tokens", "llm.token_count.prompt_details.cache_write",
            "gen_ai.usage.cache_creation_input_tokens",
        ) or 0,
        "reasoning_tokens": first_count(
            attrs, "gen_ai.usage.reasoning.output_tokens", "llm.token_count.completion_details.reasoning",
            "gen_ai.usage.reasoning_tokens", "llm.usage.reasoning_tokens",
        ) or 0,
        "context_window": window,
        "context_tokens": first_count(attrs, sc.CONTEXT_TOKENS),
        "context_composition": composition,
        "tokens_approximate": attrs.get(sc.TOKENS_APPROXIMATE) is True,
        "input_messages": input_messages,
        "output_messages": output_messages,
        "input_digest": input_digest,
        "output_digest": message_digest(output_messages),
        "finish_reason": _finish_reason(attrs, output_messages),
        # Tokenising left for after the response (pipeline.ingest.write.deferred): only what the span
        # did not count itself.
        "tokens_pending": bool(
            (input_messages and (not composition or input_tokens is None))
            or (output_messages and output_tokens is None)
        ),
    }
    if fields["context_tokens"] is None and composition:
        fields["context_tokens"] = sum(v for k, v in composition.items() if k != "free" and isinstance(v, int))
    return fields


def tool_fields(record: SpanRecord) -> tuple[dict[str, Any], bool]:
    """The tool call's fields, and whether its result says the tool failed (`tool_output`)."""
    attrs = record.attributes
    name = first_str(attrs, "gen_ai.tool.name", sc.SEED_TOOL_NAME)
    if not name and attrs.get("traceloop.span.kind") == "tool":
        name = first_str(attrs, "traceloop.entity.name")
    if not name:  # `execute_tool x` (GenAI), `x.tool` (OpenLLMetry), `tool.x` (the design documents)
        name = record.name.removeprefix("execute_tool ").removesuffix(".tool").removeprefix(sc.SEED_TOOL_SPAN_PREFIX)
    observation, failed = tool_output(attrs)
    observation_tokens = first_count(attrs, sc.TOOL_OBSERVATION_TOKENS, sc.SEED_TOOL_OUTPUT_TOKENS)
    return {
        "tool_name": name[:255],
        "tool_call_id": tool_call_id_from_payloads(attrs)[:255],
        "arguments": tool_arguments(attrs),
        "observation": observation,
        "observation_tokens": observation_tokens or 0,
        "input_tokens": first_count(attrs, sc.SEED_TOOL_INPUT_TOKENS) or 0,
        "output_level": first_str(attrs, sc.TOOL_OUTPUT_LEVEL, sc.SEED_TOOL_OUTPUT_LEVEL).lower()[:16],
        "error_code": first_str(attrs, sc.TOOL_ERROR_CODE, sc.SEED_TOOL_ERROR_CODE)[:64],
        "retry_count": max(0, first_count(attrs, sc.TOOL_RETRY_COUNT, sc.SEED_TOOL_RETRY_COUNT) or 0),
        "cache_hit": first_bool(attrs, sc.TOOL_CACHE_HIT),
        "artifact_ref": first_str(attrs, sc.TOOL_ARTIFACT_ID),
        "tokens_approximate": observation_tokens is not None and attrs.get(sc.TOKENS_APPROXIMATE) is True,
        "tokens_reported": observation_tokens is not None,
        "tokens_pending": observation_tokens is None and bool(observation),
    }, failed


def compression_fields(record: SpanRecord) -> dict[str, Any]:
    attrs = record.attributes

    def json_list(key: str) -> list:
        value = parse_json(attrs.get(key))
        return list(value) if isinstance(value, list | tuple) else []

    strategy = first_str(attrs, sc.COMPRESSION_STRATEGY).lower() or "truncate"
    return {
        "strategy": strategy[:16],
        "messages_before": max(0, first_count(attrs, sc.COMPRESSION_MESSAGES_BEFORE) or 0),
        "messages_after": max(0, first_count(attrs, sc.COMPRESSION_MESSAGES_AFTER) or 0),
        "tokens_before": first_count(attrs, sc.COMPRESSION_TOKENS_BEFORE) or 0,
        "tokens_after": first_count(attrs, sc.COMPRESSION_TOKENS_AFTER) or 0,
        "context_window": first_count(attrs, sc.COMPRESSION_CONTEXT_WINDOW),
        "tokens_before_by_category": json_counts(attrs.get(sc.COMPRESSION_TOKENS_BEFORE_BY_CATEGORY)),
        "tokens_after_by_category": json_counts(attrs.get(sc.COMPRESSION_TOKENS_AFTER_BY_CATEGORY)),
        "before_messages": json_list(sc.COMPRESSION_BEFORE_MESSAGES),
        "after_messages": json_list(sc.COMPRESSION_AFTER_MESSAGES),
        "dropped": json_list(sc.COMPRESSION_DROPPED),
        "summarised": json_list(sc.COMPRESSION_SUMMARISED),
        "summary": first_str(attrs, sc.COMPRESSION_SUMMARY),
        "estimated_costs": estimated_costs(attrs.get(sc.COMPRESSION_ESTIMATED_COSTS)),
        "selection": first_str(attrs, sc.COMPRESSION_SELECTION)[:255],
    }


def estimated_costs(value: Any) -> dict[str, float]:
    """{strategy: estimated USD}: the known strategies with a number in 0..MAX_COST_USD; the rest is dropped."""
    costs: dict[str, float] = {}
    for strategy, cost in json_dict(value).items():
        if strategy in STRATEGIES and isinstance(cost, int | float) and not isinstance(cost, bool) \
                and 0 <= cost <= MAX_COST_USD:  # also refuses NaN, infinities and ints no float holds
            costs[strategy] = float(cost)
    return costs


def skill_fields(record: SpanRecord) -> dict[str, Any]:
    attrs = record.attributes
    chain = parse_json(attrs.get(sc.SKILL_CHAIN))
    chain = list(chain) if isinstance(chain, list | tuple) else []
    name = first_str(attrs, sc.SKILL_NAME) or record.name.removeprefix("activate_skill ")
    return {
        "skill_name": name[:255],
        "load_level": min(3, max(1, first_count(attrs, sc.SKILL_LEVEL) or 2)),
        "chain": chain,
        "depth": max(1, first_count(attrs, sc.SKILL_DEPTH) or len(chain) or 1),
        "context_modifier": json_dict(attrs.get(sc.SKILL_CONTEXT_MODIFIER)),
        "tokens": first_count(attrs, sc.SKILL_TOKENS) or 0,
        "resources": skill_resources(attrs),
        "messages": skill_messages(attrs.get(sc.SKILL_MESSAGES)),
    }


def skill_resources(attrs: dict[str, Any]) -> list[str]:
    """The resource files an activation loaded: SKILL_RESOURCES, else the one SKILL_RESOURCE."""
    listed = parse_json(attrs.get(sc.SKILL_RESOURCES))
    names = listed if isinstance(listed, list | tuple) else [first_str(attrs, sc.SKILL_RESOURCE)]
    return [str(n)[:1000] for n in names if isinstance(n, str) and n][:200]


SKILL_MESSAGE_KINDS = ("metadata", "instruction", "permissions")


def skill_messages(value: Any) -> list[dict[str, Any]]:
    """The messages an activation injected, each {kind, visibility, resource, tokens, content}; other shapes are dropped."""
    parsed = parse_json(value)
    out: list[dict[str, Any]] = []
    for item in parsed if isinstance(parsed, list | tuple) else ():
        if not isinstance(item, dict) or item.get("kind") not in SKILL_MESSAGE_KINDS:
            continue
        tokens = item.get("tokens")
        resource = item.get("resource")
        out.append({
            "kind": item["kind"],
            "visibility": "hidden" if item.get("visibility") == "hidden" else "visible",
            "resource": resource[:1000] if isinstance(resource, str) and resource else None,
            "tokens": tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and 0 <= tokens <= MAX_COUNT else None,
            "content": to_text(item.get("content", "")),
        })
    return out


def normalise(record: SpanRecord) -> NormalisedSpan:
    attrs = record.attributes
    kind = span_kind(record)
    status, error_type, error_message = _error(record)
    start, end = record.start_time_unix_nano, record.end_time_unix_nano
    started_at = nanos_to_datetime(start)
    finished = end > 0
    span = NormalisedSpan(
        record=record,
        kind=kind,
        conversation_key=bounded_key(conversation_key(attrs)),
        round_key=bounded_key(first_str(attrs, sc.ROUND_ID)) or record.trace_id,
        started_at=started_at,
        ended_at=nanos_to_datetime(end) if finished else None,
        duration_ms=max(0.0, (end - start) / 1e6) if finished else None,
        status=status,
        error_type=error_type,
        error_message=error_message,
        agent_name=first_str(attrs, "gen_ai.agent.name", "agent.name")[:255],
        user_id=first_str(attrs, "user.id", "traceloop.association.properties.user_id", "gen_ai.user",
                          "llm.user", "enduser.id")[:255],
        service_name=to_text(record.resource.get("service.name", ""))[:255],
    )
    if sc.CONVERSATION_TITLE in attrs:
        span.title = first_str(attrs, sc.CONVERSATION_TITLE).strip()[:500]
    if kind in (AGENT, CHAIN) and not span.agent_name and attrs.get("traceloop.span.kind") in ("agent", "workflow"):
        span.agent_name = first_str(attrs, "traceloop.entity.name", "traceloop.workflow.name")[:255]
    if span.is_root or sc.ROUND_USER_MESSAGE in attrs or sc.ROUND_FINAL_ANSWER in attrs:
        span.user_message = first_str(attrs, sc.ROUND_USER_MESSAGE) or (turn_input(attrs) if span.is_root else "")
        span.final_answer = first_str(attrs, sc.ROUND_FINAL_ANSWER) or (turn_output(attrs) if span.is_root else "")
    if kind == LLM:
        span.llm = llm_fields(record)
    elif kind == TOOL:
        span.tool, failed = tool_fields(record)
        if failed:  # the result reports the error: it is the message, when the span gives none
            span.status = "error"
            span.error_message = span.error_message or span.tool["observation"][:MAX_RESULT_ERROR_CHARS]
        span.error_type = canonical_error_type(span.error_type)  # ctxlens's earlier names → the documents'
        measured = _duration_ms(attrs.get(sc.SEED_TOOL_DURATION_MS))
        if measured is not None:  # the tool's own measure (the design documents' ToolMetrics.duration_ms)
            span.duration_ms = measured
    elif kind == COMPRESSION:
        span.compression = compression_fields(record)
    elif kind == SKILL:
        span.skill = skill_fields(record)
    return span
