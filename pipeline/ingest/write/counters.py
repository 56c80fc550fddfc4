"""The denormalised figures on Round and Conversation, re-aggregated from the rows themselves.

Never incremented: a span that arrives twice, late, or in another request cannot make a
counter drift, because each touched round and conversation is recomputed from the database
inside the ingest transaction. Each level is one UPDATE with correlated subqueries (portable
SQL, run on SQLite and PostgreSQL): the database does the aggregation over its indexes on
round_id / conversation_id and no rows travel to Python.
"""

from __future__ import annotations

from pipeline.ingest.write import sql
from pipeline.models import CompressionEvent, Conversation, LLMCall, Round, SkillActivation, Status, ToolCall


def recompute_counters(round_ids: set[int], conversation_ids: set[int]) -> None:
    if round_ids:
        _recompute_rounds(sorted(round_ids))
    if conversation_ids:
        _recompute_conversations(sorted(conversation_ids))


def _recompute_rounds(round_ids: list[int]) -> None:
    r, llm, tool = sql.table(Round), sql.table(LLMCall), sql.table(ToolCall)
    of_llm = f"FROM {llm} x WHERE x.round_id = {r}.id"
    of_tool = f"FROM {tool} x WHERE x.round_id = {r}.id"
    sql.execute(
        f"UPDATE {r} SET "
        f"llm_call_count = (SELECT COUNT(*) {of_llm}), "
        f"input_tokens = (SELECT COALESCE(SUM(x.input_tokens), 0) {of_llm}), "
        f"output_tokens = (SELECT COALESCE(SUM(x.output_tokens), 0) {of_llm}), "
        # SUM skips the unpriced calls, and is NULL when no call has a price
        f"cost_usd = (SELECT SUM(x.cost_usd) {of_llm}), "
        f"unpriced_call_count = (SELECT COUNT(*) {of_llm} AND x.cost_usd IS NULL), "
        f"tool_call_count = (SELECT COUNT(*) {of_tool}), "
        f"error_count = (SELECT COUNT(*) {of_llm} AND x.status = 'error') "
        f"+ (SELECT COUNT(*) {of_tool} AND x.success = %s) "
        f"WHERE id IN ({sql.marks(round_ids)})",
        [False, *round_ids],
    )


def _recompute_conversations(conversation_ids: list[int]) -> None:
    c, r, llm = sql.table(Conversation), sql.table(Round), sql.table(LLMCall)
    of_rounds = f"FROM {r} x WHERE x.conversation_id = {c}.id"
    of_compressions = f"FROM {sql.table(CompressionEvent)} x WHERE x.conversation_id = {c}.id"
    # A level-3 row that injected no messages of its own is a resource read of a skill already
    # active (read_skill_resource), not an activation; activate_skill at level 3 injects messages.
    of_skills = (f"FROM {sql.table(SkillActivation)} x WHERE x.conversation_id = {c}.id "
                 f"AND NOT (x.load_level = 3 AND x.messages = '[]')")
    of_tools = f"FROM {sql.table(ToolCall)} x WHERE x.conversation_id = {c}.id"
    sql.execute(
        f"UPDATE {c} SET "
        f"round_count = (SELECT COUNT(*) {of_rounds}), "
        f"llm_call_count = (SELECT COALESCE(SUM(x.llm_call_count), 0) {of_rounds}), "
        f"tool_call_count = (SELECT COALESCE(SUM(x.tool_call_count), 0) {of_rounds}), "
        f"error_count = (SELECT COALESCE(SUM(x.error_count), 0) {of_rounds}), "
        f"input_tokens = (SELECT COALESCE(SUM(x.input_tokens), 0) {of_rounds}), "
        f"output_tokens = (SELECT COALESCE(SUM(x.output_tokens), 0) {of_rounds}), "
        f"cost_usd = (SELECT SUM(x.cost_usd) {of_rounds}), "
        f"unpriced_call_count = (SELECT COALESCE(SUM(x.unpriced_call_count), 0) {of_rounds}), "
        f"compression_count = (SELECT COUNT(*) {of_compressions}), "
        f"skill_activation_count = (SELECT COUNT(*) {of_skills}), "
        f"unique_skill_count = (SELECT COUNT(DISTINCT x.skill_name) {of_skills}), "
        f"retried_call_count = (SELECT COUNT(*) {of_tools} AND x.retry_count > 0), "
        # the history's messages: each user message, each model reply, each tool result
        f"message_count = (SELECT COUNT(*) {of_rounds} AND x.user_message <> '') "
        f"+ (SELECT COUNT(*) FROM {llm} x WHERE x.conversation_id = {c}.id) + (SELECT COUNT(*) {of_tools}), "
        # the newest turn says whether the conversation is running, fine or failed
        f"status = COALESCE((SELECT x.status {of_rounds} ORDER BY x.started_at DESC, x.id DESC LIMIT 1), %s), "
        f"model = COALESCE((SELECT x.model FROM {llm} x WHERE x.conversation_id = {c}.id AND x.model <> '' "
        f"ORDER BY x.started_at DESC, x.id DESC LIMIT 1), model) "
        f"WHERE id IN ({sql.marks(conversation_ids)})",
        [Status.RUNNING.value, *conversation_ids],
    )
    _retitle(conversation_ids)


def _retitle(conversation_ids: list[int]) -> None:
    """The title is the first line of the earliest turn's user message, unless a client named it."""
    c, r = sql.table(Conversation), sql.table(Round)
    rows = sql.fetch(
        f"SELECT c.id, c.title, (SELECT x.user_message FROM {r} x WHERE x.conversation_id = c.id "
        f"AND x.user_message <> '' ORDER BY x.started_at, x.id LIMIT 1) FROM {c} c "
        f"WHERE c.id IN ({sql.marks(conversation_ids)}) AND c.title_explicit = %s",
        [*conversation_ids, False],
    )
    changed = []
    for conversation_id, title, message in rows:
        new = (message or "").strip().split("\n", 1)[0][:500] or title
        if new != title:
            changed.append(Conversation(id=conversation_id, title=new))
    sql.update_rows(Conversation, changed, ["title"])
