"""Token counts and costs that follow an admin edit of an LLM call or a tool call.

A tool call's observation tokens and its tokens at each output level are counted for the model
of the LLM call it is linked to (pipeline.ingest.write.precount, pipeline.ingest.write.tool_levels).
An operator who links a tool to another call, edits its result or its output level, or gives a
call another model, leaves those counts made for the old text or model: they go back to the
deferred run (pipeline.ingest.write.deferred), as after a relink at ingest
(pipeline.ingest.write.linking). A count the operator types in, or one the tool's span reported
for the result still stored, is kept. An LLM call's cost follows its model, counts and start,
unless the operator set the cost too.
"""

from __future__ import annotations

from collections.abc import Collection

from pipeline.ingest.write.precount import counting_key
from pipeline.ingest.write.tool_levels import NEEDS_LEVELS, needs_levels
from pipeline.insight.costs import PRICED_FROM, price_llm_call
from pipeline.models import LLMCall, ToolCall

LEVELS_FROM = frozenset({"observation", "output_level", "artifact"})


def price_edited_call(call: LLMCall, changed: Collection[str]) -> None:
    """Before the save: the cost at the call's edited model, counts or start (the form's own cost wins)."""
    if "cost_usd" not in changed and not PRICED_FROM.isdisjoint(changed):
        price_llm_call(call)


def recount_for_call(before: LLMCall, call: LLMCall) -> bool:
    """After the save: the call's tools counted again when its new model counts otherwise; whether
    any count was left to the deferred run."""
    if counting_key(before.model) == counting_key(call.model):
        return False
    tools = ToolCall.objects.filter(llm_call_id=call.pk)
    tokens = tools.filter(tokens_reported=False).exclude(observation="").update(tokens_pending=True)
    levels = tools.filter(NEEDS_LEVELS).update(levels_pending=True)
    return bool(tokens or levels)


def recount_for_tool(before: ToolCall, tool: ToolCall, changed: Collection[str]) -> bool:
    """Before the save (so that it writes them, and the rollups follow): the tool's counts the edit
    made stale left to the deferred run, a count the form typed kept as reported; whether the
    deferred run has counting to do."""
    relinked = before.llm_call_id != tool.llm_call_id and _count_otherwise(before.llm_call_id, tool.llm_call_id)
    if "observation_tokens" in changed:  # the operator's count stays, through relinks too, as a span's would
        tool.tokens_pending, tool.tokens_reported = False, True
        tool.tokens_estimated = tool.tokens_estimated and "tokens_estimated" in changed  # exact unless said
        tool.tokens_approximate = tool.tokens_approximate and "tokens_approximate" in changed
    elif "observation" in changed:  # a count its span reported was of the result replaced
        tool.tokens_pending, tool.tokens_reported = bool(tool.observation), False
        if not tool.observation:
            tool.observation_tokens, tool.tokens_estimated, tool.tokens_approximate = 0, False, False
    elif relinked and tool.observation and not tool.tokens_reported:
        tool.tokens_pending = True
    if "tokens_at_level" not in changed and (relinked or not LEVELS_FROM.isdisjoint(changed)):
        tool.levels_pending = needs_levels(tool)
        if not tool.levels_pending:  # no full result any more: no tokens at each level
            tool.tokens_at_level = None
    return tool.tokens_pending or tool.levels_pending


def _count_otherwise(old_call: int | None, new_call: int | None) -> bool:
    """Whether a tool counts otherwise linked to `new_call` than to `old_call` (None: no call, a
    call deleted meanwhile: counted for no model)."""
    models = dict(LLMCall.objects.filter(pk__in={old_call, new_call} - {None}).values_list("pk", "model"))
    return counting_key(models.get(old_call)) != counting_key(models.get(new_call))
