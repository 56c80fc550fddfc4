"""GET /api/conversations/<id>/findings/: each finding code on a conversation built to contain it
(through the real REST ingest), and none on clean ones."""

from __future__ import annotations

import pytest

from pipeline.models import ToolCall
from tests.insight.agent_events import (
    Conversation,
    assistant,
    calls,
    finding,
    ingest_client,
    read_client,
    result,
    system,
    tool,
    user,
)

pytestmark = pytest.mark.django_db

SEARCH = ("search", {"q": "oslo weather"})


@pytest.fixture
def api():
    return ingest_client()


@pytest.fixture
def reader():
    return read_client()


def findings(reader, conversation_id: int) -> list[dict]:
    reply = reader.get(f"/api/conversations/{conversation_id}/findings/")
    assert reply.status_code == 200, reply.content
    return reply.json()["results"]


def clean_tool_loop(name: str = "clean") -> Conversation:
    question = user("What is the weather in Oslo?")
    asked = assistant(None, ("call_1", *SEARCH))
    return (Conversation(name).turn("r1", "What is the weather in Oslo?")
            .llm([system(), question], asked)
            .tool("call_1", *SEARCH, "Cloudy, 12 °C")
            .llm([system(), question, asked, result("call_1", "Cloudy, 12 °C")], assistant("Cloudy, 12 °C.")))


# --- no false positives ---------------------------------------------------------------------


def test_a_clean_tool_loop_has_no_findings(api, reader):
    assert findings(reader, clean_tool_loop().send(api)) == []


def test_a_compression_explains_the_cache_break_it_causes(api, reader):
    question = user("Summarise the report.")
    asked = assistant(None, ("call_1", "read_report", {}))
    report = result("call_1", "Q3 revenue rose 12 % on strong exports. " * 40)
    conversation = (Conversation("compressed").turn("r1", "Summarise the report.")
                    .llm([system(), question], asked)
                    .tool("call_1", "read_report", {}, "Q3 revenue rose 12 % on strong exports. " * 40)
                    .llm([system(), question, asked, report], assistant("Revenue rose 12 %."))
                    .compression()
                    .llm([system(), user("Summary so far: revenue rose 12 %."), user("And Q4?")],
                         assistant("Q4 is not in the report.")))

    assert findings(reader, conversation.send(api)) == []


# --- each code ------------------------------------------------------------------------------


def test_a_compression_that_drops_a_tool_call_but_keeps_its_result_leaves_an_orphan(api, reader):
    question = user("Compare Q3 and Q4.")
    asked_1 = assistant(None, ("call_1", "query_sales", {"quarter": "Q3"}))
    asked_2 = assistant(None, ("call_2", "query_sales", {"quarter": "Q4"}))
    conversation_id = (Conversation("dropped-call").turn("r1", "Compare Q3 and Q4.")
                       .llm([system(), question], asked_1)
                       .tool("call_1", "query_sales", {"quarter": "Q3"}, "Q3: 4.2M")
                       .llm([system(), question, asked_1, result("call_1", "Q3: 4.2M")], asked_2)
                       .tool("call_2", "query_sales", {"quarter": "Q4"}, "Q4: 4.9M")
                       .compression()
                       .llm([system(), user("Summary: Q3 sales were 4.2M."), result("call_2", "Q4: 4.9M")],
                            assistant("Q4 beat Q3 by 0.7M."))
                       .send(api))
    third = calls(conversation_id)[2]

    assert findings(reader, conversation_id) == [finding(
        "orphan_tool_result", "error",
        "The input of LLM call #3 has a tool result for call_2 (query_sales), but no earlier assistant message in "
        "it asked for that tool call.", call=third, tool_row=tool(conversation_id, "call_2"), llm_call_id=third.pk)]



def test_a_tool_result_nobody_asked_for_is_an_orphan(api, reader):
    conversation_id = (Conversation("orphan").turn("r1", "Hi")
                       .llm([system(), user("Hi"), result("call_9", "a result left behind")], assistant("Hello!"))
                       .send(api))
    [first] = calls(conversation_id)

    assert findings(reader, conversation_id) == [finding(
        "orphan_tool_result", "error",
        "The input of LLM call #1 has a tool result for call_9, but no earlier assistant message in it asked "
        "for that tool call.", call=first, tool_call_id="call_9")]


def test_a_tool_call_without_a_result_in_the_next_input_is_missing(api, reader):
    question = user("Weather in Oslo and Bergen?")
    asked = assistant(None, ("call_1", "search", {"q": "oslo"}), ("call_2", "search", {"q": "bergen"}))
    conversation_id = (Conversation("missing").turn("r1", "Weather in Oslo and Bergen?")
                       .llm([system(), question], asked)
                       .tool("call_1", "search", {"q": "oslo"}, "Cloudy")
                       .tool("call_2", "search", {"q": "bergen"}, "Rain")
                       .llm([system(), question, asked, result("call_1", "Cloudy")], assistant("Cloudy in Oslo."))
                       .send(api))
    second = calls(conversation_id)[1]

    assert findings(reader, conversation_id) == [finding(
        "missing_tool_result", "error",
        "LLM call #1 asked for tool call call_2 (search); the input of the next LLM call, #2, carries that tool "
        "call but no tool result answering it.", call=second, tool_row=tool(conversation_id, "call_2"),
        llm_call_id=second.pk)]


def test_a_tool_call_id_the_model_uses_twice_is_a_duplicate(api, reader):
    first_q, second_q = user("Weather in Oslo?"), user("And in Bergen?")
    asked_1 = assistant(None, ("call_0", "search", {"q": "oslo"}))
    asked_2 = assistant(None, ("call_0", "search", {"q": "bergen"}))
    answer_1 = assistant("Cloudy.")
    history = [system(), first_q, asked_1, result("call_0", "Cloudy")]
    conversation_id = (Conversation("duplicate").turn("r1", "Weather in Oslo?")
                       .llm([system(), first_q], asked_1)
                       .tool("call_0", "search", {"q": "oslo"}, "Cloudy")
                       .llm(history, answer_1)
                       .turn("r2", "And in Bergen?")
                       .llm([*history, answer_1, second_q], asked_2)
                       .tool("call_0", "search", {"q": "bergen"}, "Rain")
                       .llm([*history, answer_1, second_q, asked_2, result("call_0", "Rain")], assistant("Rain."))
                       .send(api))
    third = calls(conversation_id)[2]

    assert findings(reader, conversation_id) == [finding(
        "duplicate_tool_call_id", "error",
        "The tool call id call_0 is used by 2 tool calls of the model (LLM calls #1, #3): a tool result cannot "
        "say which one it answers.", call=third, tool_call_id="call_0")]


def test_one_id_on_two_tool_calls_of_one_message_is_a_duplicate(api, reader):
    question = user("Oslo and Bergen?")
    asked = assistant(None, ("call_0", "search", {"q": "oslo"}), ("call_0", "search", {"q": "bergen"}))
    conversation_id = (Conversation("duplicate-in-one-message").turn("r1", "Oslo and Bergen?")
                       .llm([system(), question], asked)
                       .tool("call_0", "search", {"q": "oslo"}, "Cloudy")
                       .tool("call_0", "search", {"q": "bergen"}, "Rain")
                       .llm([system(), question, asked, result("call_0", "Cloudy"), result("call_0", "Rain")],
                            assistant("Cloudy and rain."))
                       .send(api))
    first = calls(conversation_id)[0]

    assert findings(reader, conversation_id) == [finding(
        "duplicate_tool_call_id", "error",
        "The tool call id call_0 is used by 2 tool calls of the model (LLM call #1): a tool result cannot say "
        "which one it answers.", call=first, tool_call_id="call_0")]


def test_one_id_on_two_executed_tool_calls_is_a_duplicate_when_the_outputs_were_not_recorded(api, reader):
    conversation = Conversation("duplicate-executed")
    for round_id, city in (("r1", "oslo"), ("r2", "bergen")):
        conversation.turn(round_id, city).tool("call_0", "search", {"q": city}, "Cloudy")
    conversation_id = conversation.send(api)
    second = ToolCall.objects.filter(conversation_id=conversation_id).order_by("started_at")[1]

    assert findings(reader, conversation_id) == [finding(
        "duplicate_tool_call_id", "error",
        "The tool call id call_0 is used by 2 executed tool calls (search): a tool result cannot say which one it "
        "answers.", tool_row=second)]


def test_the_same_call_three_times_in_a_turn_is_repeated(api, reader):
    question = user("Weather in Oslo?")
    history = [system(), question]
    conversation = Conversation("repeated").turn("r1", "Weather in Oslo?")
    for n in (1, 2, 3):
        asked = assistant(None, (f"call_{n}", *SEARCH))
        conversation.llm(list(history), asked).tool(f"call_{n}", *SEARCH, "Cloudy")
        history += [asked, result(f"call_{n}", "Cloudy")]
    conversation_id = conversation.llm(history, assistant("Cloudy.")).send(api)
    third = tool(conversation_id, "call_3")

    assert third.llm_call_id == calls(conversation_id)[2].pk
    assert findings(reader, conversation_id) == [finding(
        "repeated_tool_call", "warning",
        'search was called 3 times in one turn with the same arguments {"q": "oslo weather"}.', tool_row=third)]


def test_an_observation_over_a_quarter_of_the_window_is_oversized(api, reader, settings):
    question = user("Read the page.")
    asked = assistant(None, ("call_1", "fetch_page", {"url": "https://example.com"}))
    conversation_id = (Conversation("oversized").turn("r1", "Read the page.")
                       .llm([system(), question], asked, window=10_000)
                       .tool("call_1", "fetch_page", {"url": "https://example.com"}, "<html>…</html>", tokens=3000)
                       .llm([system(), question, asked, result("call_1", "<html>…</html>")], assistant("Done."),
                            window=10_000, input_tokens=3400)
                       .send(api))

    assert findings(reader, conversation_id) == [finding(
        "oversized_observation", "warning",
        "The observation of fetch_page is 3,000 tokens: 30% of the 10,000-token context window (the limit is 25%).",
        tool_row=tool(conversation_id, "call_1"))]

    settings.CTXLENS_OVERSIZED_OBSERVATION_RATIO = 0.5
    assert findings(reader, conversation_id) == []


def test_an_edit_in_the_middle_of_the_input_breaks_the_cache(api, reader):
    # Sizes chosen so that each message's share of the input tokens is its size in bytes.
    before = [system("S" * 40), user("U" * 100), assistant("draft " * 10), user("M" * 60)]
    after = [system("S" * 40), user("U" * 100), assistant("edited " * 10), user("M" * 60), user("N" * 20)]
    conversation_id = (Conversation("cache-break").turn("r1", "Write it.")
                       .llm(before, assistant("ok"), input_tokens=40 + 100 + 60 + 60)
                       .llm(after, assistant("ok"), input_tokens=40 + 100 + 70 + 60 + 20)
                       .send(api))
    second = calls(conversation_id)[1]

    assert findings(reader, conversation_id) == [finding(
        "cache_break", "warning",
        "The input of LLM call #2 does not extend the input of call #1: it keeps the first 2 of its 4 messages and "
        "no compression explains the change; 60 tokens of messages both inputs share sit past that point and can "
        "no longer come from a prompt cache.", call=second)]


def test_a_new_system_prompt_is_reported_with_the_cache_break_it_causes(api, reader):
    question = user("Q" * 100)
    conversation_id = (Conversation("system-prompt").turn("r1", "Q")
                       .llm([system("S" * 20), question], assistant("A" * 10), input_tokens=120)
                       .llm([system("S" * 24), question, assistant("A" * 10), user("More")], assistant("ok"),
                            input_tokens=24 + 100 + 10 + 4)
                       .send(api))
    second = calls(conversation_id)[1]

    assert findings(reader, conversation_id) == [
        finding("cache_break", "warning",
                "The input of LLM call #2 does not extend the input of call #1: it keeps the first 0 of its 2 "
                "messages and no compression explains the change; 100 tokens of messages both inputs share sit "
                "past that point and can no longer come from a prompt cache.", call=second),
        finding("system_prompt_changed", "info",
                "The system message of LLM call #2 differs from call #1's (20 → 24 bytes).", call=second),
    ]


def test_a_context_near_its_window_with_no_compression_after_it(api, reader):
    conversation_id = (Conversation("full").turn("r1", "Go on.")
                       .llm([system(), user("Go on.")], assistant("1"), window=10_000, context_tokens=5000)
                       .llm([system(), user("Go on.")], assistant("2"), window=10_000, context_tokens=9200)
                       .llm([system(), user("Go on.")], assistant("3"), window=10_000, context_tokens=9500)
                       .send(api))
    third = calls(conversation_id)[2]

    assert findings(reader, conversation_id) == [finding(
        "near_window_limit", "warning",
        "LLM call #3 filled 9,500 of its 10,000-token context window (95%) and no compression followed; "
        "2 calls reached 90% or more since the last compression.", call=third)]


def test_a_full_context_that_was_compressed_afterwards_is_fine(api, reader):
    conversation_id = (Conversation("full-then-compressed").turn("r1", "Go on.")
                       .llm([system(), user("Go on.")], assistant("1"), window=10_000, context_tokens=9500)
                       .compression(tokens_before=9500, tokens_after=2000)
                       .llm([system(), user("Go on.")], assistant("2"), window=10_000, context_tokens=2100)
                       .send(api))

    assert findings(reader, conversation_id) == []


def test_a_tool_failing_three_times_with_the_same_error_is_a_retry_storm(api, reader):
    question = user("Fetch the prices.")
    history = [system(), question]
    conversation = Conversation("storm").turn("r1", "Fetch the prices.")
    for n in (1, 2, 3):
        arguments = {"url": f"https://prices.example.com/{n}"}
        asked = assistant(None, (f"call_{n}", "fetch", arguments))
        conversation.llm(list(history), asked).tool(
            f"call_{n}", "fetch", arguments, "Error: upstream timed out", error=("timeout", "upstream timed out"),
            retries=2 if n == 1 else 0)
        history += [asked, result(f"call_{n}", "Error: upstream timed out")]
    conversation_id = conversation.llm(history, assistant("The price service is down.")).send(api)

    assert findings(reader, conversation_id) == [finding(
        "retry_storm", "warning",
        "fetch failed 3 times in one turn with the same error (timeout: upstream timed out); 5 attempts counting "
        "the executor's retries.", tool_row=tool(conversation_id, "call_3"))]


# --- the endpoint ---------------------------------------------------------------------------


def test_findings_take_three_queries_whatever_the_size_of_the_conversation(api, django_assert_num_queries):
    from pipeline.insight.findings import conversation_findings
    from pipeline.models import Conversation as ConversationRow

    question = user("Weather?")
    history = [system(), question]
    conversation = Conversation("long").turn("r1", "Weather?")
    for n in range(30):
        asked = assistant(None, (f"call_{n}", "search", {"q": f"city {n}"}))
        conversation.llm(list(history), asked).tool(f"call_{n}", "search", {"q": f"city {n}"}, "Cloudy")
        history += [asked, result(f"call_{n}", "Cloudy")]
    row = ConversationRow.objects.get(pk=conversation.compression().llm(history, assistant("Done.")).send(api))

    with django_assert_num_queries(3):  # LLM calls, tool calls, compression times
        assert conversation_findings(row) == []


def test_findings_of_an_unknown_conversation_are_a_json_404(reader):
    for bad in ("999999", "abc", str(2**70)):
        reply = reader.get(f"/api/conversations/{bad}/findings/")
        assert reply.status_code == 404, bad
        assert reply.json() == {"detail": "No such conversation."}


def test_findings_need_the_read_scope(api, db):
    conversation_id = clean_tool_loop("scoped").send(api)

    assert api.get(f"/api/conversations/{conversation_id}/findings/").status_code == 403


def test_bidi_controls_in_quoted_trace_text_are_dropped_from_messages(api, reader):
    name = "report\u202efdp.exe"
    asked = assistant(None, ("call_\u2067x", name, {}))
    conversation_id = (Conversation("bidi").turn("r1", "Read it.")
                       .llm([system(), user("Read it.")], asked, window=10_000)
                       .tool("call_\u2067x", name, {}, "…", tokens=3000)
                       .llm([system(), user("Read it."), result("call_\u2067x", "…")], assistant("Done."),
                            window=10_000, input_tokens=3400)
                       .send(api))

    assert [f["message"] for f in findings(reader, conversation_id)] == [
        "The observation of reportfdp.exe is 3,000 tokens: 30% of the 10,000-token context window (the limit is 25%).",
        "The input of LLM call #2 has a tool result for call_x (reportfdp.exe), but no earlier assistant message "
        "in it asked for that tool call.",
    ]
