"""Tool observations counted before the ingest transaction (pipeline.ingest.write.precount) give
exactly what the deferred counting (pipeline.ingest.write.deferred) gives, and only when the
linking confirms the model they were counted for."""

from __future__ import annotations

import json

import pytest
from django.db import transaction

from pipeline.ingest.records import LogRecord, SpanRecord
from pipeline.ingest.write import deferred, tool_levels
from pipeline.ingest.write.precount import (
    MAX_PRECOUNT_CHARS,
    RecentCalls,
    count_observation,
    counting_key,
    recent_calls,
    rounds_of,
)
from pipeline.ingest.write.store import prepare_spans, store_spans
from pipeline.insight.levels import result_data, tokens_at_levels
from pipeline.models import LLMCall, Span, ToolCall, ToolRequest
from pipeline.tokens.counting import MAX_EXACT_CHARS
from tests.genai_spans import MS, ROOT, T0, chat as _chat, tool as _tool
from tests.otlp_support import wait_for_deferred_tokens

pytestmark = pytest.mark.django_db



def _counts(tool: ToolCall) -> tuple[int, bool, bool]:
    return tool.observation_tokens, tool.tokens_estimated, tool.tokens_approximate


ROWS = " ".join(f"row {i}: revenue {i * 37 % 1000} EUR;" for i in range(MAX_EXACT_CHARS // 20))
OBSERVATIONS = {
    "short": "3 hits: ctxlens, 上下文, {\"score\": 0.93}",
    "as long as counted up front": ROWS[:MAX_PRECOUNT_CHARS],
}


@pytest.mark.parametrize("model", ["gpt-4o", "claude-3-5-sonnet-20241022", "some-unknown-model"])
@pytest.mark.parametrize("observation", OBSERVATIONS.values(), ids=OBSERVATIONS.keys())
def test_an_observation_counted_up_front_equals_its_deferred_count(model, observation):
    # the requesting chat in the batch: counted before the transaction, nothing left pending
    store_spans([_chat("a" * 32, "00000000000000c1", 1, model), _tool("a" * 32, "00000000000000d1", 3, observation)])
    up_front = ToolCall.objects.get(trace_id="a" * 32)
    assert not up_front.tokens_pending
    # the same tool span in a batch of its own, after its chat (as an agent exporting spans as
    # they end sends it): counted up front for the chat this process saw
    store_spans([_chat("b" * 32, "00000000000000c2", 1, model)])
    store_spans([_tool("b" * 32, "00000000000000d2", 3, observation)])
    trickled = ToolCall.objects.get(trace_id="b" * 32)
    assert not trickled.tokens_pending
    # and where the chat went to another worker: counted by the deferred run
    store_spans([_chat("e" * 32, "00000000000000c3", 1, model)])
    recent_calls.clear()
    store_spans([_tool("e" * 32, "00000000000000d3", 3, observation)])
    assert ToolCall.objects.get(trace_id="e" * 32).tokens_pending
    deferred.complete_pending()
    later = ToolCall.objects.get(trace_id="e" * 32)
    assert not later.tokens_pending
    assert _counts(up_front) == _counts(trickled) == _counts(later) == count_observation(observation, model)
    assert up_front.observation_tokens > 0 and not up_front.tokens_estimated


def test_a_tool_sent_after_its_chat_is_linked_to_it_and_counted_up_front_for_its_model():
    """Chats of two encodings in earlier batches; the tool alone in a later one, its call id
    requested by the first: counted up front for that chat's model, not the latest one's."""
    trace, observation, claude = "5" * 32, OBSERVATIONS["short"], "claude-3-5-sonnet-20241022"
    store_spans([_chat(trace, "00000000000000c1", 1, claude, requested=["call_r"])])
    store_spans([_chat(trace, "00000000000000c2", 3, "gpt-4o")])
    store_spans([_tool(trace, "00000000000000d1", 5, observation, "call_r")])
    tool = ToolCall.objects.get()
    assert tool.llm_call.span_id == "00000000000000c1"
    assert not tool.tokens_pending
    assert _counts(tool) == count_observation(observation, claude) != count_observation(observation, "gpt-4o")


def test_recent_calls_forget_everything_past_their_size():
    calls = RecentCalls(size=2)
    for i in range(3):
        calls.add(rounds_of(prepare_spans([_chat(f"{i + 1}" * 32, "00000000000000c1", 1, "gpt-4o",
                                                 requested=[f"call_{i}"])]).spans))
    assert [(trace, seen.requested) for (trace, _), seen in calls.rounds.items()] == [("3" * 32, {"call_2": "gpt-4o"})]


@pytest.mark.parametrize("seen_here", [True, False], ids=["claude seen by this process", "by another worker"])
def test_a_tool_the_linking_gives_to_a_stored_call_of_another_model_is_counted_for_that_model(seen_here):
    """The batch's only earlier chat is gpt-4o, but the tool's call id was requested by a claude
    call stored before. Where this process prepared that call, the tool is counted up front for
    claude; elsewhere the guess (gpt-4o) is not used, and the deferred run counts for claude."""
    trace, observation = "c" * 32, OBSERVATIONS["short"]
    store_spans([_chat(trace, "00000000000000c1", 1, "claude-3-5-sonnet-20241022", requested=["call_x"])])
    if not seen_here:
        recent_calls.clear()
    store_spans([_chat(trace, "00000000000000c2", 3, "gpt-4o"), _tool(trace, "00000000000000d1", 5, observation, "call_x")])
    tool = ToolCall.objects.get()
    assert tool.llm_call.span_id == "00000000000000c1"
    assert tool.tokens_pending != seen_here
    deferred.complete_pending()
    tool.refresh_from_db()
    assert _counts(tool) == count_observation(observation, "claude-3-5-sonnet-20241022")
    assert _counts(tool) != count_observation(observation, "gpt-4o")


def test_a_tool_requested_by_its_call_id_is_counted_for_the_requesting_model():
    """Two chats of different models before the tool in the batch: the one that asked for the call
    id decides, not the latest."""
    trace, observation = "d" * 32, OBSERVATIONS["short"]
    store_spans([_chat(trace, "00000000000000c1", 1, "claude-3-5-sonnet-20241022", requested=["call_y"]),
                 _chat(trace, "00000000000000c2", 3, "gpt-4o"),
                 _tool(trace, "00000000000000d1", 5, observation, "call_y")])
    tool = ToolCall.objects.get()
    assert tool.llm_call.span_id == "00000000000000c1"
    assert not tool.tokens_pending
    assert _counts(tool) == count_observation(observation, "claude-3-5-sonnet-20241022")


def _otlp_json(spans: list[SpanRecord]) -> bytes:
    def value(v):
        return {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}

    return json.dumps({"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": [
        {"traceId": s.trace_id, "spanId": s.span_id, "parentSpanId": s.parent_span_id, "name": s.name,
         "startTimeUnixNano": str(s.start_time_unix_nano), "endTimeUnixNano": str(s.end_time_unix_nano),
         "attributes": [{"key": k, "value": value(v)} for k, v in s.attributes.items()]}
        for s in spans]}]}]}).encode()


@pytest.mark.parametrize("chunk_spans", [1000, 2])  # one transaction; one per trace
def test_the_ingest_service_keeps_the_up_front_counts_of_every_chunk(settings, chunk_spans):
    """The receivers store a request a chunk of traces per transaction (pipeline.ingest.service):
    each chunk carries the counts made for its tools."""
    from pipeline.ingest import service
    from pipeline.ingest.decode import otlp
    from pipeline.models import ApiKey

    settings.CTXLENS_INGEST_CHUNK_SPANS = chunk_spans
    observation = OBSERVATIONS["short"]
    body = _otlp_json([_chat("e" * 32, "00000000000000c1", 1, "gpt-4o"), _tool("e" * 32, "00000000000000d1", 3, observation),
                       _chat("f" * 32, "00000000000000c2", 1, "gpt-4o"), _tool("f" * 32, "00000000000000d2", 3, observation)])
    key = ApiKey.generate("agent")[0]
    outcome = service.ingest(service.IngestRequest("otlp", body, content_type=otlp.JSON), key=key)
    assert isinstance(outcome, service.Accepted), outcome
    tools = ToolCall.objects.all()
    assert len(tools) == 2
    assert all(not t.tokens_pending and _counts(t) == count_observation(observation, "gpt-4o") for t in tools)


def _chat_without_messages(trace: str, span_id: str, start: int, model: str) -> SpanRecord:
    return SpanRecord(trace, span_id, f"chat {model}", T0 + start * MS, T0 + (start + 1) * MS, parent_span_id=ROOT,
                      attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                                  "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 5})


def test_a_tool_whose_requesting_call_only_a_stored_log_names_is_counted_for_that_call():
    """The batch's chats carry no messages, so the guess is the latest (gpt-4o); a log stored before
    says the claude call asked for the tool, which linking follows once the logs are applied."""
    trace, observation, claude = "1" * 32, OBSERVATIONS["short"], "claude-3-5-sonnet-20241022"
    store_spans([], logs=[LogRecord(trace, "00000000000000c1", T0 + 2 * MS, "gen_ai.choice", {
        "index": 0, "message": {"content": ""}, "finish_reason": "tool_calls",
        "tool_calls": [{"id": "call_z", "function": {"name": "search", "arguments": {}}}]})])
    store_spans([_chat_without_messages(trace, "00000000000000c1", 1, claude),
                 _chat_without_messages(trace, "00000000000000c2", 3, "gpt-4o"),
                 _tool(trace, "00000000000000d1", 5, observation, "call_z")])
    deferred.complete_pending()
    tool = ToolCall.objects.get()
    assert tool.llm_call.span_id == "00000000000000c1"
    assert _counts(tool) == count_observation(observation, claude) != count_observation(observation, "gpt-4o")


@pytest.mark.parametrize("together", [True, False], ids=["in the chats' batch", "in a later batch"])
def test_a_tool_linked_to_another_call_than_guessed_is_counted_for_that_call(together):
    """No call id: the guess is the round's latest chat (gpt-4o), but linking gives the tool to
    the claude call that asked for a tool of its name; the guess's count, made for another
    encoding, is not kept, and the deferred run counts for claude."""
    trace, observation, claude = "2" * 32, OBSERVATIONS["short"], "claude-3-5-sonnet-20241022"
    chats = [_chat(trace, "00000000000000c1", 1, claude, requested=["call_q"]), _chat(trace, "00000000000000c2", 3, "gpt-4o")]
    tool = [_tool(trace, "00000000000000d1", 5, observation)]
    if not together:
        store_spans(chats)
    batch = chats + tool if together else tool
    assert prepare_spans(batch).counts[(trace, "00000000000000d1")].key == counting_key("gpt-4o") != counting_key(claude)
    store_spans(batch)
    tool = ToolCall.objects.get()
    assert tool.llm_call.span_id == "00000000000000c1"
    assert tool.tokens_pending
    deferred.complete_pending()
    tool.refresh_from_db()
    assert _counts(tool) == count_observation(observation, claude) != count_observation(observation, "gpt-4o")


@pytest.mark.parametrize("observation", [ROWS[:MAX_PRECOUNT_CHARS + 1], ROWS], ids=["just longer", "past the exact cap"])
def test_a_longer_observation_is_left_to_the_deferred_run(observation):
    trace = "4" * 32
    store_spans([_chat(trace, "00000000000000c1", 1, "gpt-4o"), _tool(trace, "00000000000000d1", 3, observation)])
    assert ToolCall.objects.get().tokens_pending
    deferred.complete_pending()
    tool = ToolCall.objects.get()
    assert _counts(tool) == count_observation(observation, "gpt-4o")
    assert tool.tokens_estimated == (len(observation) > MAX_EXACT_CHARS)


def _chat_asking_by(trace: str, span_id: str, start: int, call_id, system_part: dict | None = None,
                    structured: bool = False) -> SpanRecord:
    """A chat whose GenAI messages give a tool call id that is not text (JSON allows any value),
    after a request of the same tool under another id, which linking by name alone would pick;
    `structured`: the messages as attribute values themselves (as an in-process SDK gives them),
    not as JSON text."""
    parts = [{"type": "tool_call", "id": "call_decoy", "name": "search", "arguments": {"q": "decoy"}},
             {"type": "tool_call", "id": call_id, "name": "search", "arguments": {"q": "asked"}}]
    encode = (lambda value: value) if structured else json.dumps
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
                  "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 5,
                  "gen_ai.input.messages": encode([{"role": "user", "parts": [
                      {"type": "tool_call_response", "id": call_id, "response": "earlier"}]}]),
                  "gen_ai.output.messages": encode([{"role": "assistant", "parts": parts}])}
    if system_part is not None:
        attributes["gen_ai.system_instructions"] = json.dumps([system_part])
    return SpanRecord(trace, span_id, "chat gpt-4o", T0 + start * MS, T0 + (start + 1) * MS, parent_span_id=ROOT,
                      attributes=attributes)


ODD_IDS = [({"n": 1}, '{"n": 1}'), ([1, 2], "[1, 2]"), (7, "7"), (True, "true")]


@pytest.mark.parametrize(("call_id", "as_text"), ODD_IDS)
@pytest.mark.parametrize("together", [True, False], ids=["in one batch", "tool in a later batch"])
def test_a_tool_call_id_sent_as_an_object_list_or_number_is_linked_and_counted_as_text(call_id, as_text, together):
    trace, observation = "7" * 32, OBSERVATIONS["short"]
    chat, tool = _chat_asking_by(trace, "00000000000000c1", 1, call_id), _tool(trace, "00000000000000d1", 3, observation, as_text)
    for batch in ([chat, tool],) if together else ([chat], [tool]):
        assert store_spans(batch).rejected == 0
    stored = ToolCall.objects.get()
    assert (stored.llm_call.span_id, stored.tool_call_id, stored.arguments, stored.tokens_pending) == (
        "00000000000000c1", as_text, {"q": "asked"}, False)
    assert _counts(stored) == count_observation(observation, "gpt-4o")


@pytest.mark.parametrize(("call_id", "as_text"), ODD_IDS)
def test_the_span_keeps_a_structured_message_id_as_sent_while_the_call_holds_it_as_text(call_id, as_text):
    """Messages given as attribute values (not JSON text): normalising reads copies of them."""
    store_spans([_chat_asking_by("c3" * 16, "00000000000000c1", 1, call_id, structured=True)])
    sent = Span.objects.get().attributes["gen_ai.output.messages"]
    assert sent[0]["parts"][1]["id"] == call_id
    assert LLMCall.objects.get().output_messages[0]["parts"][1]["id"] == as_text


@pytest.mark.parametrize(("call_id", "as_text"), ODD_IDS)
def test_a_call_stored_with_an_id_as_sent_before_ids_were_text_still_links_its_tools(call_id, as_text):
    """Rows an earlier version stored keep the id as the span sent it (the call's messages) and
    as str() gave it (its tool request index); linking compares the call's ids as text."""
    trace, observation = "a1" * 16, OBSERVATIONS["short"]
    store_spans([_chat_asking_by(trace, "00000000000000c1", 1, call_id)])
    LLMCall.objects.update(output_messages=[{"role": "assistant", "parts": [
        {"type": "tool_call", "id": "call_decoy", "name": "search", "arguments": {"q": "decoy"}},
        {"type": "tool_call", "id": call_id, "name": "search", "arguments": {"q": "asked"}}]}])
    ToolRequest.objects.filter(tool_call_id=as_text).update(tool_call_id=str(call_id)[:255])
    assert store_spans([_tool(trace, "00000000000000d1", 3, observation, as_text)]).rejected == 0
    stored = ToolCall.objects.get()
    assert (stored.llm_call.span_id, stored.tool_call_id, stored.arguments) == ("00000000000000c1", as_text, {"q": "asked"})


def test_a_tool_response_with_an_object_id_in_the_system_instructions_is_stored():
    trace = "b2" * 16
    part = {"type": "tool_call_response", "id": {"n": 2}, "response": "from the system prompt"}
    assert store_spans([_chat_asking_by(trace, "00000000000000c1", 1, "call_1", system_part=part)]).accepted == 1
    system = LLMCall.objects.get().input_messages[0]
    assert (system["role"], system["parts"][0]["id"]) == ("system", '{"n": 2}')


def test_the_stored_calls_linking_reads_carry_their_model():
    """`apply` compares a stored linked call's model: it is read with the round's rows (whole or
    from a point in time), never loaded call by call."""
    from pipeline.ingest.write import linking

    store_spans([_chat("8" * 32, "00000000000000c1", 1, "gpt-4o", requested=["call_m"]),
                 _chat("8" * 32, "00000000000000c2", 3, "claude-3-5-sonnet-20241022")])
    round_id = LLMCall.objects.values_list("round_id", flat=True).distinct().get()
    read = [*linking.RoundRows.load([round_id]).calls(), *linking._calls_in_round(round_id)]
    assert len(read) == 4
    assert all("model" not in call.get_deferred_fields() for call in read)
    assert sorted(call.model for call in read) == ["claude-3-5-sonnet-20241022"] * 2 + ["gpt-4o"] * 2


@pytest.mark.parametrize("first_owner", ["gpt-4o", None], ids=["linked to a gpt-4o call", "linked to no call"])
def test_a_counted_tool_relinked_to_a_call_of_another_encoding_is_counted_again_for_it(first_owner):
    """The tool arrives, and is counted, before the claude call that asked for its call id: for
    the round's gpt-4o call it was linked to, or for no model at all. When the asker arrives,
    linking gives the tool to it, and its count follows: the deferred run counts for claude."""
    trace, observation, claude = "7" * 32, OBSERVATIONS["short"], "claude-3-5-sonnet-20241022"
    first = [_chat(trace, "00000000000000c2", 3, first_owner)] if first_owner else []
    store_spans([*first, _tool(trace, "00000000000000d1", 5, observation, "call_z")])
    deferred.complete_pending()
    tool = ToolCall.objects.get()
    assert not tool.tokens_pending
    first_count = count_observation(observation, first_owner)
    assert _counts(tool) == first_count != count_observation(observation, claude)
    store_spans([_chat(trace, "00000000000000c1", 1, claude, requested=["call_z"])])
    tool.refresh_from_db()
    assert tool.llm_call.span_id == "00000000000000c1"
    deferred.complete_pending()
    tool.refresh_from_db()
    assert not tool.tokens_pending
    assert _counts(tool) == count_observation(observation, claude)


def test_a_tool_relinked_to_a_call_of_the_same_encoding_keeps_its_count():
    """gpt-4o and gpt-4o-mini count alike: relinking the tool from one to the other leaves its
    count as it is, with nothing left for the deferred run."""
    trace, observation = "8" * 32, OBSERVATIONS["short"]
    store_spans([_chat(trace, "00000000000000c2", 3, "gpt-4o"),
                 _tool(trace, "00000000000000d1", 5, observation, "call_m")])
    before = ToolCall.objects.get()
    assert not before.tokens_pending
    assert counting_key("gpt-4o-mini") == counting_key("gpt-4o")
    store_spans([_chat(trace, "00000000000000c1", 1, "gpt-4o-mini", requested=["call_m"])])
    after = ToolCall.objects.get()
    assert after.llm_call.span_id == "00000000000000c1"
    assert not after.tokens_pending
    assert _counts(after) == _counts(before)


def test_a_count_the_span_reported_is_kept_when_the_tool_is_relinked():
    """The span said how many tokens its observation has (ctxlens's runtime counts the whole
    observation, before the span clips it): given to a call of another encoding later, the tool
    keeps that figure, and nothing is left for the deferred run."""
    trace, claude = "3" * 32, "claude-3-5-sonnet-20241022"
    tool = _tool(trace, "00000000000000d1", 5, OBSERVATIONS["short"], "call_r")
    tool.attributes["ctxlens.tool.observation_tokens"] = 999
    store_spans([_chat(trace, "00000000000000c2", 3, "gpt-4o"), tool])
    store_spans([_chat(trace, "00000000000000c1", 1, claude, requested=["call_r"])])
    stored = ToolCall.objects.get()
    assert stored.llm_call.span_id == "00000000000000c1"
    assert stored.tokens_reported and not stored.tokens_pending
    deferred.complete_pending()
    stored.refresh_from_db()
    assert stored.observation_tokens == 999


def test_a_tools_tokens_at_each_level_are_counted_again_for_the_call_it_is_relinked_to():
    """A tool whose full result the trace holds has its tokens at each output level counted for
    its call's model; relinked to a call of another encoding, they are counted again for that one."""
    trace, observation, claude = "1" * 32, OBSERVATIONS["short"], "claude-3-5-sonnet-20241022"
    tool = _tool(trace, "00000000000000d1", 5, observation, "call_l")
    tool.attributes["ctxlens.tool.output_level"] = "full"
    store_spans([_chat(trace, "00000000000000c2", 3, "gpt-4o"), tool])
    deferred.complete_pending()
    for_gpt = tokens_at_levels(result_data(observation), "gpt-4o")
    for_claude = tokens_at_levels(result_data(observation), claude)
    assert ToolCall.objects.get().tokens_at_level == for_gpt != for_claude
    store_spans([_chat(trace, "00000000000000c1", 1, claude, requested=["call_l"])])
    assert ToolCall.objects.get().levels_pending
    deferred.complete_pending()
    stored = ToolCall.objects.get()
    assert (stored.llm_call.span_id, stored.levels_pending) == ("00000000000000c1", False)
    assert stored.tokens_at_level == for_claude


def test_a_count_the_span_reported_is_kept_when_its_observation_is_found_later():
    """The span reported the count but sent no result (the runtime without content capture); the
    result is found later in the input of the call that read it: stored, with the count kept."""
    trace = "5" * 32
    tool = _tool(trace, "00000000000000d1", 5, "", "call_s")
    tool.attributes["ctxlens.tool.observation_tokens"] = 999
    asks = _chat(trace, "00000000000000c1", 1, "gpt-4o", requested=["call_s"])
    store_spans([asks, tool])
    reads = _chat(trace, "00000000000000c2", 7, "gpt-4o")
    reads.attributes["gen_ai.input.messages"] = json.dumps(
        [{"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_s", "response": "3 hits"}]}])
    store_spans([reads])
    stored = ToolCall.objects.get()
    assert (stored.observation, stored.tokens_pending) == ("3 hits", False)
    deferred.complete_pending()
    stored.refresh_from_db()
    assert stored.observation_tokens == 999


def test_a_full_result_found_later_gets_its_tokens_at_each_level_counted():
    """A tool at the full output level sent without its result: once the result is found in the
    input of the call that read it, its tokens at each level are counted like a result sent with it."""
    trace = "d" * 32
    tool = _tool(trace, "00000000000000d1", 5, "", "call_t")
    tool.attributes["ctxlens.tool.output_level"] = "full"
    store_spans([_chat(trace, "00000000000000c1", 1, "gpt-4o", requested=["call_t"]), tool])
    deferred.complete_pending()
    assert ToolCall.objects.get().tokens_at_level is None
    reads = _chat(trace, "00000000000000c2", 7, "gpt-4o")
    result = {"type": "tool_call_response", "id": "call_t", "response": OBSERVATIONS["short"]}
    reads.attributes["gen_ai.input.messages"] = json.dumps([{"role": "tool", "parts": [result]}])
    store_spans([reads])
    deferred.complete_pending()
    stored = ToolCall.objects.get()
    assert (stored.observation, stored.levels_pending) == (OBSERVATIONS["short"], False)
    assert stored.tokens_at_level == tokens_at_levels(result_data(OBSERVATIONS["short"]), "gpt-4o")


def test_a_tool_whose_call_was_replaced_is_counted_again_for_its_new_owner():
    """An unfinished gpt-4o span owned the tool, which was counted for gpt-4o; its finished version
    replaces the row (the tool loses its owner), and a call of an unknown model, which counts as
    no model does, asks for the tool's id in the same batch: counted again for that call."""
    trace, observation, unknown = "e" * 32, OBSERVATIONS["short"], "some-unknown-model"
    assert counting_key(unknown) == counting_key(None) != counting_key("gpt-4o")
    unfinished = _chat(trace, "00000000000000c1", 1, "gpt-4o")
    unfinished.end_time_unix_nano = 0
    store_spans([unfinished, _tool(trace, "00000000000000d1", 5, observation, "call_u")])
    deferred.complete_pending()
    assert _counts(ToolCall.objects.get()) == count_observation(observation, "gpt-4o")
    store_spans([_chat(trace, "00000000000000c1", 1, "gpt-4o"),
                 _chat(trace, "00000000000000c2", 3, unknown, requested=["call_u"])])
    deferred.complete_pending()
    tool = ToolCall.objects.get()
    assert tool.llm_call.span_id == "00000000000000c2"
    assert _counts(tool) == count_observation(observation, unknown) != count_observation(observation, "gpt-4o")


def test_levels_counted_before_a_relink_are_not_written_for_the_old_call():
    """The deferred run counted the tool's levels for gpt-4o; before it wrote them, linking gave the
    tool to a claude call: the write leaves the tool pending, and the next run counts for claude."""
    trace, observation, claude = "f" * 32, OBSERVATIONS["short"], "claude-3-5-sonnet-20241022"
    tool = _tool(trace, "00000000000000d1", 5, observation, "call_v")
    tool.attributes["ctxlens.tool.output_level"] = "full"
    store_spans([_chat(trace, "00000000000000c2", 3, "gpt-4o"), tool])
    counted = tool_levels.count_some(10)
    assert [t.tokens_at_level for t in counted] == [tokens_at_levels(result_data(observation), "gpt-4o")]
    store_spans([_chat(trace, "00000000000000c1", 1, claude, requested=["call_v"])])
    with transaction.atomic():
        assert tool_levels.write(counted) == []
    assert ToolCall.objects.get().levels_pending
    deferred.complete_pending()
    assert ToolCall.objects.get().tokens_at_level == tokens_at_levels(result_data(observation), claude)


def _in_turn(record: SpanRecord, turn: str, conversation: str = "") -> SpanRecord:
    record.attributes["ctxlens.round.id"] = turn
    if conversation:
        record.attributes["gen_ai.conversation.id"] = conversation
    return record


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("reported", [False, True], ids=["count made here", "count reported, levels made here"])
def test_a_counted_tool_a_placeholders_fold_relinks_to_another_encoding_is_counted_again(settled, reported):
    """Trace 2's claude call, which asked for the tool's call id, arrives in a placeholder (it names
    no conversation); a later span of trace 2, in another turn, names the conversation, so that
    batch folds the call into turn 1 without a span of its own there. The tool, counted for turn
    1's gpt-4o call, goes to the claude call, and the background run counts it again: committed
    for real here, so the test sees whether that run was scheduled at all. A count the span
    reported stays; its tokens at each output level, counted here, are counted again."""
    trace_1, trace_2, observation = "9" * 32, "6" * 32, OBSERVATIONS["short"]
    claude = "claude-3-5-sonnet-20241022"
    gpt = _in_turn(_chat(trace_1, "00000000000000c2", 3, "gpt-4o"), "turn-1", "conv-fold")
    tool = _in_turn(_tool(trace_1, "00000000000000d1", 5, observation, "call_f"), "turn-1", "conv-fold")
    if reported:
        tool.attributes.update({"ctxlens.tool.observation_tokens": 999, "ctxlens.tool.output_level": "full"})
    store_spans([gpt, tool])
    store_spans([_in_turn(_chat(trace_2, "00000000000000c1", 1, claude, requested=["call_f"]), "turn-1")])
    wait_for_deferred_tokens()
    counted_for = _counted_for(observation, reported)
    assert counted_for(ToolCall.objects.get()) == counted_for("gpt-4o") != counted_for(claude)
    store_spans([_in_turn(_chat(trace_2, "00000000000000c3", 10, "gpt-4o"), "turn-2", "conv-fold")])
    stored = ToolCall.objects.get()
    assert stored.llm_call.span_id == "00000000000000c1"
    assert stored.round.key == "turn-1" and stored.conversation.external_id == "conv-fold"
    wait_for_deferred_tokens(seconds=30)
    stored.refresh_from_db()
    assert counted_for(stored) == counted_for(claude)


def _counted_for(observation: str, reported: bool):
    """What a test compares of a tool: its observation's counts, or (`reported`: the span said the
    count) that count with its tokens at each level; of a stored tool, or as counted for a model."""
    def counted(tool_or_model: ToolCall | str) -> tuple:
        if isinstance(tool_or_model, ToolCall):
            tool = tool_or_model
            return (tool.observation_tokens, tool.tokens_at_level) if reported else _counts(tool)
        model = tool_or_model
        if reported:
            return 999, tokens_at_levels(result_data(observation), model)
        return count_observation(observation, model)
    return counted


@pytest.mark.django_db(transaction=True)
def test_a_relinked_tool_with_only_its_levels_to_count_again_gets_them_counted(settled):
    """The span reported the count, and the tool's full result is stored: relinked to a claude call,
    only its tokens at each level are left to count, and the background run is scheduled for them."""
    trace, observation, claude = "a" * 32, OBSERVATIONS["short"], "claude-3-5-sonnet-20241022"
    tool = _tool(trace, "00000000000000d1", 5, observation, "call_w")
    tool.attributes.update({"ctxlens.tool.observation_tokens": 999, "ctxlens.tool.output_level": "full"})
    store_spans([_chat(trace, "00000000000000c2", 3, "gpt-4o"), tool])
    wait_for_deferred_tokens()
    counted_for = _counted_for(observation, reported=True)
    assert counted_for(ToolCall.objects.get()) == counted_for("gpt-4o") != counted_for(claude)
    store_spans([_chat(trace, "00000000000000c1", 1, claude, requested=["call_w"])])
    stored = ToolCall.objects.get()
    assert (stored.llm_call.span_id, stored.tokens_pending, stored.levels_pending) == ("00000000000000c1", False, True)
    wait_for_deferred_tokens(seconds=30)
    stored.refresh_from_db()
    assert counted_for(stored) == counted_for(claude)


@pytest.mark.django_db(transaction=True)
def test_a_counted_tool_a_stored_log_relinks_to_another_encoding_is_counted_again(settled):
    """A stored event log says the claude call asked for the tool's call id; the tool, counted for
    the gpt-4o call it was linked to, goes to the claude call when its span arrives (its messages
    are rebuilt from the log), and the background run counts it again: committed for real here."""
    trace, observation, claude = "b" * 32, OBSERVATIONS["short"], "claude-3-5-sonnet-20241022"
    store_spans([], logs=[LogRecord(trace, "00000000000000c1", T0 + 2 * MS, "gen_ai.choice", {
        "index": 0, "message": {"content": ""}, "finish_reason": "tool_calls",
        "tool_calls": [{"id": "call_g", "function": {"name": "search", "arguments": {}}}]})])
    store_spans([_chat_without_messages(trace, "00000000000000c2", 3, "gpt-4o"),
                 _tool(trace, "00000000000000d1", 5, observation, "call_g")])
    wait_for_deferred_tokens()
    tool = ToolCall.objects.get()
    assert tool.llm_call.span_id == "00000000000000c2"
    assert _counts(tool) == count_observation(observation, "gpt-4o")
    store_spans([_chat_without_messages(trace, "00000000000000c1", 1, claude)])
    tool.refresh_from_db()
    assert tool.llm_call.span_id == "00000000000000c1"
    wait_for_deferred_tokens(seconds=30)
    tool.refresh_from_db()
    assert _counts(tool) == count_observation(observation, claude) != count_observation(observation, "gpt-4o")
