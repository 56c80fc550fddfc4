"""The denormalised figures on Round and Conversation, aggregated from the rows themselves.

A span that arrives twice, late, or in another request cannot make a counter drift: each
touched conversation is recomputed from the database inside the ingest transaction, and so is
each touched round whose stored rows changed (a replaced open span, messages rebuilt from logs,
rows merged in, token counts filled later). A round that a span batch only added rows to gets
the sums of exactly those rows added (`add_new_rows`), read back from the database by id, so a
batch at the end of a long turn does not re-aggregate the whole turn; a re-sent span adds no row
and so adds nothing. Each level is one statement (portable SQL, run on SQLite and PostgreSQL):
the database does the aggregation over its indexes and no rows travel to Python.
"""

from __future__ import annotations

from pipeline.ingest.write import sql
from pipeline.models import CompressionEvent, Conversation, LLMCall, Round, SkillActivation, Status, ToolCall


def recompute_counters(round_ids: set[int], conversation_ids: set[int]) -> None:
    """Aggregate the rounds `round_ids` and the conversations `conversation_ids` again from their rows."""
    if round_ids:
        _recompute_rounds(sorted(round_ids))
    if conversation_ids:
        _recompute_conversations(sorted(conversation_ids))


def add_new_rows(llm_ids: list[int], tool_ids: list[int]) -> None:
    """Add the figures of LLM and tool calls just inserted to their rounds' counters (rows stored
    before are unchanged: their figures are in the counters already)."""
    llm, tool = sql.table(LLMCall), sql.table(ToolCall)
    added: dict[int, list] = {}
    for chunk in sql.chunked(sorted(llm_ids), 500):
        for round_id, *figures in sql.fetch(
            f"SELECT round_id, COUNT(*), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0), "
            f"SUM(cost_usd), SUM(CASE WHEN cost_usd IS NULL THEN 1 ELSE 0 END), "
            f"SUM(CASE WHEN status = 'error' THEN 1 ELSE 0 END) FROM {llm} "
            f"WHERE id IN ({sql.marks(chunk)}) AND round_id IS NOT NULL GROUP BY round_id", chunk,
        ):
            _add_figures(added, round_id, figures + [0, 0])
    for chunk in sql.chunked(sorted(tool_ids), 500):
        for round_id, count, failed in sql.fetch(
            f"SELECT round_id, COUNT(*), SUM(CASE WHEN success = %s THEN 1 ELSE 0 END) FROM {tool} "
            f"WHERE id IN ({sql.marks(chunk)}) AND round_id IS NOT NULL GROUP BY round_id", [False, *chunk],
        ):
            _add_figures(added, round_id, [0, 0, 0, None, 0, 0, count, failed])
    if not added:
        return
    counts = (
        "llm_call_count = llm_call_count + %s, input_tokens = input_tokens + %s, "
        "output_tokens = output_tokens + %s, unpriced_call_count = unpriced_call_count + %s, "
        "tool_call_count = tool_call_count + %s, error_count = error_count + %s"
    )
    unpriced, priced = [], []
    for round_id, (calls, tokens_in, tokens_out, cost, no_price, errors, tools, failed) in sorted(added.items()):
        row = [calls, tokens_in, tokens_out, no_price, tools, errors + failed]
        # the cost stays NULL while no call has a price, as SUM over the rows gives
        (unpriced if cost is None else priced).append([*row, round_id] if cost is None else [*row, cost, round_id])
    r = sql.table(Round)
    with sql.cursor() as cursor:
        if unpriced:
            cursor.executemany(f"UPDATE {r} SET {counts} WHERE id = %s", unpriced)
        if priced:
            cursor.executemany(f"UPDATE {r} SET {counts}, cost_usd = COALESCE(cost_usd, 0) + %s WHERE id = %s", priced)


def _add_figures(added: dict[int, list], round_id: int, figures: list) -> None:
    total = added.setdefault(round_id, [0, 0, 0, None, 0, 0, 0, 0])
    for i, value in enumerate(figures):
        if value is not None:
            total[i] = value if total[i] is None else total[i] + value


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
