"""Many conversations read at once (pipeline.insight.conversation_rows.read_conversations), as the
finding counts refresh reads them: the same findings as each conversation read on its own
(conversation_findings), on random conversations sent together through the REST ingest, in a
number of queries that does not grow with the conversations."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import TextField
from django.db.models.functions import Cast
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pipeline.insight import conversation_rows, finding_counts
from pipeline.insight.conversation_rows import read_conversations
from pipeline.insight.findings import conversation_findings, finding_counts as counts_of, findings_of
from pipeline.models import Conversation as ConversationRow
from pipeline.models import ToolCall
from tests.insight.agent_events import Conversation, assistant, ingest_client, result, system, user

pytestmark = pytest.mark.django_db

# What an agent does next; each step but "turn" ends with an LLM call or a tool call.
STEPS = (
    "ask",  # a tool call, its result in the next input
    "fail",  # a tool call that fails with the same error each time (retry_storm after three)
    "forget",  # a tool call whose result the next input lacks (missing_tool_result)
    "reuse_id",  # a tool call with an id used before (duplicate_tool_call_id)
    "answer",  # a reply, and the user's next question
    "edit",  # a message in the middle of the input changed (cache_break)
    "new_prompt",  # another system prompt (system_prompt_changed)
    "compress",  # a compression, then a short input that it explains
    "side",  # a tool's own model call: a stream of its own
    "twice",  # the last LLM call recorded again by a second span
    "orphan",  # a tool result nothing asked for
    "full",  # a context at 95 % of its window (near_window_limit)
    "big",  # an observation of half the window (oversized_observation)
    "turn",  # a new turn
)


def build(name: str, steps: list[str]) -> Conversation:
    conversation = Conversation(name).turn("r1", "Hi")
    messages = [system(), user("Hi")]
    last: tuple[list, dict] | None = None

    def llm(output: dict, **kwargs: object) -> None:
        nonlocal last
        conversation.llm(list(messages), output, **kwargs)
        last = (list(messages), output)

    def tool_step(tool_call_id: str, *, error: tuple[str, str] | None = None, answered: bool = True) -> None:
        asked = assistant(None, (tool_call_id, "search", {"q": "oslo"}))
        llm(asked)
        conversation.tool(tool_call_id, "search", {"q": "oslo"}, "Cloudy", error=error)
        messages.append(asked)
        if answered:
            messages.append(result(tool_call_id, "Cloudy"))

    for n, step in enumerate(steps):
        if step == "ask":
            tool_step(f"call_{n}")
        elif step == "fail":
            tool_step(f"call_{n}", error=("timeout", "took too long"))
        elif step == "forget":
            tool_step(f"call_{n}", answered=False)
        elif step == "reuse_id":
            tool_step("call_0")
        elif step == "answer":
            reply = assistant(f"Answer {n}.")
            llm(reply)
            messages.extend([reply, user(f"Question {n}?")])
        elif step == "edit":
            messages[1] = user(f"Edited {n}")
            llm(assistant("Edited."))
        elif step == "new_prompt":
            messages[0] = system(f"Prompt {n}.")
            llm(assistant("New prompt."))
        elif step == "compress":
            conversation.compression()
            messages[1:] = [user(f"Summary {n}.")]
            llm(assistant("Compressed."))
        elif step == "side":
            conversation.llm([system("Summarise the page."), user(f"<html>page {n}</html>")], assistant("A page."))
        elif step == "twice" and last is not None:
            conversation.llm(*last)
        elif step == "orphan":
            messages.append(result(f"ghost_{n}", "left behind"))
            llm(assistant("Orphan."))
        elif step == "full":
            llm(assistant("Full."), window=1000, context_tokens=950)
        elif step == "big":
            conversation.tool(f"big_{n}", "fetch", {"url": "x"}, "page", tokens=64_000)
        elif step == "turn":
            conversation.turn(f"r{n}", f"Turn {n}")
    return conversation


def whole(found: list) -> list[tuple]:
    return [(f, f.at) for f in found]  # `at` takes no part in a Finding's equality


# fetched 1 row at a time, every conversation's calls cross a fetch boundary
@pytest.mark.parametrize("fetched", [conversation_rows.CALL_ROWS_FETCHED, 1])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shapes=st.lists(st.lists(st.sampled_from(STEPS), max_size=10), min_size=1, max_size=6))
@example(shapes=[list(STEPS), ["ask", "side", "ask", "twice", "compress", "ask", "answer"], [],
          ["side", "side", "fail", "fail", "fail", "full", "big", "new_prompt", "edit"]])
def test_conversations_read_together_have_the_findings_each_has_alone(fetched, shapes, monkeypatch):
    monkeypatch.setattr(conversation_rows, "CALL_ROWS_FETCHED", fetched)
    ConversationRow.objects.all().delete()
    api = ingest_client()
    ids = [build(f"c{i}", steps).send(api) for i, steps in enumerate(shapes)]
    conversations = ConversationRow.objects.in_bulk(ids)

    together = {pk: whole(findings_of(conversations[pk], rows)) for pk, rows in read_conversations(ids)}

    assert together == {pk: whole(conversation_findings(conversations[pk])) for pk in sorted(conversations)}
    assert list(together) == sorted(conversations)
    counted = {c.conversation_id: c.counts for c in finding_counts.count_some()}
    assert counted == {pk: counts_of(conversation_findings(conversations[pk])) for pk in conversations}


def test_a_conversation_without_calls_reads_as_empty_between_others():
    api = ingest_client()
    before, idle, after = (build(name, steps).send(api) for name, steps in
                           (("before", ["ask", "compress", "orphan"]), ("idle", []), ("after", ["side", "big"])))
    read = dict(read_conversations([after, idle, before, idle]))

    assert list(read) == [before, idle, after]
    assert [(len(r.calls), len(r.tools), len(r.compressions.times)) for r in read.values()] == [
        (3, 1, 1), (0, 0, 0), (1, 1, 0)]


def queries_to_count(conversations: int) -> int:
    api = ingest_client()
    for i in range(conversations):
        build(f"q{conversations}-{i}", ["ask", "side", "compress", "fail", "answer"]).send(api)
    with CaptureQueriesContext(connection) as queries:
        assert len(finding_counts.count_some()) == conversations
    finding_counts.refresh_stale()
    return len(queries)


def test_a_chunk_of_conversations_is_counted_in_the_same_queries_whatever_its_size():
    assert queries_to_count(2) == queries_to_count(12) == 4  # the stale ones, LLM calls, tool calls, compressions


def test_repeated_calls_are_counted_by_their_arguments_decoded_not_by_their_text():
    api = ingest_client()
    asked = [{"q": "oslo", "days": 3}, {"days": 3, "q": "oslo"}, {"q": "oslo", "days": 3}, {"q": "bergen", "days": 3}]
    conversation = build("reordered", ["orphan", "fail", "fail", "fail", "new_prompt"])
    for n, arguments in enumerate(asked):  # one turn: the same arguments thrice, in two key orders
        conversation.tool(f"forecast_{n}", "forecast", arguments, "Rain")
    conversation.tool("other_0", "other", {"x": 1}, "ok").tool("other_1", "other", {"x": 2}, "ok")
    conversation_id = conversation.send(api)
    texts = ToolCall.objects.filter(tool_name="forecast").annotate(text=Cast("arguments", TextField()))
    # SQLite stores the text as sent, so one repeat differs as text; PostgreSQL's jsonb orders the keys itself
    assert len(set(texts.values_list("text", flat=True))) == (3 if connection.vendor == "sqlite" else 2)

    [counted] = finding_counts.count_some()

    expected = {"orphan_tool_result": 1, "repeated_tool_call": 2, "cache_break": 1, "system_prompt_changed": 1,
                "retry_storm": 1}
    assert counted.counts == counts_of(conversation_findings(ConversationRow.objects.get(pk=conversation_id)))
    assert counted.counts == expected
