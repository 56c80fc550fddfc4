"""Attribute names ctxlens adds where the OTel GenAI conventions have none.

The pipeline's telemetry writes these and the ingest normaliser reads them; both import
the names from here. Everything the GenAI conventions do name (gen_ai.operation.name,
gen_ai.request.model, gen_ai.usage.*, gen_ai.tool.name, gen_ai.tool.call.id,
gen_ai.tool.call.arguments, gen_ai.tool.call.result, gen_ai.input.messages,
gen_ai.output.messages, gen_ai.conversation.id, gen_ai.agent.name) is used as they define it.

Span shapes the pipeline emits (one trace per turn):
- `invoke_agent <agent>`: the turn (a Round). gen_ai.operation.name=invoke_agent,
  gen_ai.conversation.id, gen_ai.agent.name, ROUND_USER_MESSAGE, ROUND_FINAL_ANSWER.
- `chat <model>`: one LLM call, child of the turn. GenAI usage and messages, plus
  CONTEXT_WINDOW, CONTEXT_TOKENS and CONTEXT_COMPOSITION.
- `execute_tool <name>`: one tool call, child of the turn. gen_ai.tool.*, plus TOOL_*.
- `compress_context`: one compression, child of the turn; SPAN_KIND=compression and COMPRESSION_*.
- `activate_skill <name>`: one skill activation, child of the turn; SPAN_KIND=skill_activation
  and SKILL_*.
JSON-valued attributes are JSON strings (OTLP attributes cannot nest dicts portably).
"""

from __future__ import annotations

SPAN_KIND = "ctxlens.span.kind"  # "compression" | "skill_activation" where gen_ai has no operation
SPAN_KIND_COMPRESSION = "compression"
SPAN_KIND_SKILL = "skill_activation"
# A span that only describes its conversation (agent, user, service, title): it belongs to no turn.
SPAN_KIND_CONVERSATION = "conversation"

CONVERSATION_ID = "gen_ai.conversation.id"
CONVERSATION_TITLE = "ctxlens.conversation.title"  # wins over the first user message as the title
ROUND_ID = "ctxlens.round.id"  # optional explicit turn id; else the trace is the turn
ROUND_USER_MESSAGE = "ctxlens.round.user_message"
ROUND_FINAL_ANSWER = "ctxlens.round.final_answer"

# On chat spans: the model's maximum window, the tokens in it, and the tokens by category (JSON).
CONTEXT_WINDOW = "ctxlens.context.window"
CONTEXT_TOKENS = "ctxlens.context.tokens"
CONTEXT_COMPOSITION = "ctxlens.context.composition"
CONTEXT_CATEGORIES = (
    "system",
    "skills",
    "user",
    "assistant",
    "tool_observations",
    "compressed_summaries",
    "free",
)

# On chat and execute_tool spans from ctxlens's runtime: its context composition / observation
# tokens were counted with a tokenizer that only approximates the model's (no public one).
TOKENS_APPROXIMATE = "ctxlens.tokens.approximate"

# On execute_tool spans.
TOOL_OUTPUT_LEVEL = "ctxlens.tool.output_level"  # brief | standard | full
TOOL_ARTIFACT_ID = "ctxlens.tool.artifact_id"
TOOL_RETRY_COUNT = "ctxlens.tool.retry_count"
TOOL_ERROR_TYPE = "ctxlens.tool.error_type"  # ToolErrorType value; also sets error.type
TOOL_ERROR_CODE = "ctxlens.tool.error_code"
TOOL_OBSERVATION_TOKENS = "ctxlens.tool.observation_tokens"
TOOL_CACHE_HIT = "ctxlens.tool.cache_hit"  # bool: answered from the tool-result cache, the tool did not run

# The design documents' own tool spans (their observability wrapper): named `tool.<name>`; on
# success tool.name, tool.success=true and tool.duration_ms; on failure only tool.success=false,
# tool.error and a recorded exception, so the name comes from the span name. Their ToolMetrics
# fields, when an agent puts them on the span, are tool.* too. ctxlens reads them all; the
# ctxlens.tool.* names above win where both are present.
SEED_TOOL_SPAN_PREFIX = "tool."
SEED_TOOL_NAME = "tool.name"  # also OpenInference's
SEED_TOOL_SUCCESS = "tool.success"
SEED_TOOL_ERROR = "tool.error"  # the error message
SEED_TOOL_DURATION_MS = "tool.duration_ms"
SEED_TOOL_ERROR_TYPE = "tool.error_type"
SEED_TOOL_ERROR_CODE = "tool.error_code"
SEED_TOOL_RETRY_COUNT = "tool.retry_count"
SEED_TOOL_OUTPUT_LEVEL = "tool.output_level"  # BRIEF | STANDARD | FULL, any case
SEED_TOOL_INPUT_TOKENS = "tool.input_tokens"  # the arguments' tokens
SEED_TOOL_OUTPUT_TOKENS = "tool.output_tokens"  # the result's tokens: the observation the model reads

# On compress_context spans.
COMPRESSION_STRATEGY = "ctxlens.compression.strategy"  # truncate | extract | summarize
COMPRESSION_TOKENS_BEFORE = "ctxlens.compression.tokens_before"
COMPRESSION_TOKENS_AFTER = "ctxlens.compression.tokens_after"
COMPRESSION_MESSAGES_BEFORE = "ctxlens.compression.messages_before"
COMPRESSION_MESSAGES_AFTER = "ctxlens.compression.messages_after"
COMPRESSION_TOKENS_BEFORE_BY_CATEGORY = "ctxlens.compression.tokens_before_by_category"  # JSON
COMPRESSION_TOKENS_AFTER_BY_CATEGORY = "ctxlens.compression.tokens_after_by_category"  # JSON
COMPRESSION_BEFORE_MESSAGES = "ctxlens.compression.before_messages"  # JSON, GenAI message shape
COMPRESSION_AFTER_MESSAGES = "ctxlens.compression.after_messages"  # JSON
COMPRESSION_DROPPED = "ctxlens.compression.dropped"  # JSON list of indexes into before_messages
COMPRESSION_SUMMARISED = "ctxlens.compression.summarised"  # JSON list of indexes
COMPRESSION_SUMMARY = "ctxlens.compression.summary"
COMPRESSION_CONTEXT_WINDOW = "ctxlens.compression.context_window"
COMPRESSION_SUMMARY_STATUS = "ctxlens.compression.summary_status"  # scheduled | applied | cost_cap | ...
COMPRESSION_ESTIMATED_COSTS = "ctxlens.compression.estimated_costs"  # JSON {strategy: estimated USD}
COMPRESSION_SELECTION = "ctxlens.compression.selection"  # "configured" or why the automatic choice chose it

# On activate_skill spans.
SKILL_NAME = "ctxlens.skill.name"
SKILL_LEVEL = "ctxlens.skill.level"  # 1, 2 or 3
SKILL_CHAIN = "ctxlens.skill.chain"  # JSON list, outermost first
SKILL_DEPTH = "ctxlens.skill.depth"
SKILL_CONTEXT_MODIFIER = "ctxlens.skill.context_modifier"  # JSON
SKILL_TOKENS = "ctxlens.skill.tokens"
SKILL_RESOURCE = "ctxlens.skill.resource"  # level 3: the resource path inside the skill
SKILL_RESOURCES = "ctxlens.skill.resources"  # JSON list: every resource file loaded (level 3)
# JSON list of the messages the activation injected: {"kind": metadata|instruction|permissions,
# "visibility": visible|hidden, "resource", "tokens", "content" (only when content is captured)}.
SKILL_MESSAGES = "ctxlens.skill.messages"
