"""store_spans on the real database: arrival order, idempotency, recovery of missing facts, signals."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime

import pytest

from pipeline import semconv as sc
from pipeline.ingest.write import deferred
from pipeline.ingest.records import LogRecord, SpanEvent, SpanRecord
from pipeline.ingest.write.store import store_spans
from pipeline.models import (
    Artifact,
    CompressionEvent,
    Conversation,
    LLMCall,
    Rollup,
    Round,
    SkillActivation,
    Span,
    SpanLog,
    ToolCall,
    ToolResultCarry,
)
from pipeline.rollups.compact import rebuild_rollups
from pipeline.signals import ingest_committed
from tests.stored_rollups import rollup_rows

pytestmark = pytest.mark.django_db

T0 = 1_763_800_000_000_000_000
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
ROOT, CHAT1, TOOL1, TOOL2, CHAT2, COMPRESS, SKILL = (f"{i:016x}" for i in range(1, 8))
MS = 1_000_000


def _messages(*items: dict) -> str:
    return json.dumps(list(items))


def agent_trace(trace: str = TRACE) -> list[SpanRecord]:
    """One turn: root, chat asking for two tools, the tools (one without its call id), compression,
    skill activation, final chat. GenAI conventions, with ctxlens.* where GenAI has nothing."""
    def span(span_id, name, start, end, attrs, parent=ROOT, **kw):
        return SpanRecord(trace, span_id, name, T0 + start * MS, T0 + end * MS, parent_span_id=parent,
                          attributes=attrs, resource={"service.name": "store-test"}, **kw)

    calls = [{"type": "tool_call", "id": "call_a", "name": "search", "arguments": {"q": "ctx"}},
             {"type": "tool_call", "id": "call_b", "name": "fetch", "arguments": {"url": "http://x"}}]
    return [
        span(ROOT, "invoke_agent helper", 0, 100, {
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "helper",
            "gen_ai.conversation.id": "conv-store", sc.ROUND_USER_MESSAGE: "Find ctx",
        }, parent=""),
        span(CHAT1, "chat gpt-4o", 1, 10, {
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
            "gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 20,
            "gen_ai.input.messages": _messages({"role": "user", "parts": [{"type": "text", "content": "Find ctx"}]}),
            "gen_ai.output.messages": _messages({"role": "assistant", "parts": calls}),
        }),
        span(TOOL1, "execute_tool search", 11, 20, {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search", "gen_ai.tool.call.id": "call_a",
            "gen_ai.tool.call.arguments": '{"q": "ctx"}', "gen_ai.tool.call.result": "3 hits",
        }),
        span(TOOL2, "execute_tool fetch", 21, 30, {  # no call id, no arguments, no result: recovered
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "fetch",
        }, status_code=2, status_message="timeout"),
        span(COMPRESS, "compress_context", 31, 32, {
            sc.SPAN_KIND: sc.SPAN_KIND_COMPRESSION, sc.COMPRESSION_STRATEGY: "truncate",
            sc.COMPRESSION_TOKENS_BEFORE: 900, sc.COMPRESSION_TOKENS_AFTER: 300,
            sc.COMPRESSION_MESSAGES_BEFORE: 9, sc.COMPRESSION_MESSAGES_AFTER: 3, sc.COMPRESSION_DROPPED: "[1, 2]",
        }),
        span(SKILL, "activate_skill pdf", 33, 34, {
            sc.SPAN_KIND: sc.SPAN_KIND_SKILL, sc.SKILL_NAME: "pdf", sc.SKILL_LEVEL: 2,
            sc.SKILL_CHAIN: '["docs", "pdf"]', sc.SKILL_TOKENS: 450,
        }),
        span(CHAT2, "chat gpt-4o", 35, 50, {
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.usage.input_tokens": 300, "gen_ai.usage.output_tokens": 30,
            "gen_ai.input.messages": _messages(
                {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_b", "response": "page text"}]},
                {"role": "user", "parts": [{"type": "text", "content": "Summarise it"}]},
            ),
            "gen_ai.output.messages": _messages({"role": "assistant", "parts": [{"type": "text", "content": "Done."}]}),
        }),
    ]


def snapshot() -> dict:
    """Everything the dashboard shows about the stored turn, independent of row ids."""
    conversation = Conversation.objects.get()
    round_ = Round.objects.get()
    calls = {c.id: c.span_id for c in LLMCall.objects.all()}
    return {
        "conversation": (conversation.external_id, conversation.title, conversation.status, conversation.model,
                         conversation.agent_name, conversation.service_name, conversation.round_count,
                         conversation.llm_call_count, conversation.tool_call_count, conversation.error_count,
                         conversation.input_tokens, conversation.output_tokens, conversation.started_at,
                         conversation.last_activity_at),
        "round": (round_.key, round_.status, round_.user_message, round_.final_answer, round_.started_at,
                  round_.ended_at, round_.llm_call_count, round_.tool_call_count, round_.error_count,
                  round_.input_tokens, round_.output_tokens),
        "llm": sorted((c.span_id, c.step, c.model, c.input_tokens, c.context_composition["user"] + c.context_composition["tool_observations"])
                      for c in LLMCall.objects.all()),
        "tools": sorted((t.span_id, t.tool_call_id, calls.get(t.llm_call_id), json.dumps(t.arguments), t.observation,
                         t.success) for t in ToolCall.objects.all()),
        "compression": [(e.strategy, calls.get(e.llm_call_id), e.dropped) for e in CompressionEvent.objects.all()],
        "skills": [(s.skill_name, s.load_level, s.chain, s.tokens) for s in SkillActivation.objects.all()],
        "spans": Span.objects.count(),
    }


def _clear() -> None:
    for model in (Span, Conversation):
        model.objects.all().delete()


def test_any_arrival_order_and_any_split_give_the_same_turn():
    store_spans(agent_trace())
    expected = snapshot()
    assert expected["conversation"][:12] == ("conv-store", "Find ctx", "ok", "gpt-4o-mini", "helper", "store-test",
                                             1, 2, 2, 1, 400, 50)
    assert expected["tools"] == [
        (TOOL1, "call_a", CHAT1, '{"q": "ctx"}', "3 hits", True),
        (TOOL2, "call_b", CHAT1, '{"url": "http://x"}', "page text", False),  # id, args, result recovered
    ]
    assert expected["llm"] == [(CHAT1, 0, "gpt-4o", 100, 100), (CHAT2, 1, "gpt-4o-mini", 300, 300)]
    assert expected["compression"] == [("truncate", CHAT2, [1, 2])]
    assert expected["round"][3] == "Done."
    rng = random.Random(7)
    for _ in range(12):
        _clear()
        spans = agent_trace()
        rng.shuffle(spans)
        cuts = sorted(rng.sample(range(1, len(spans)), rng.randint(1, 4)))
        for batch in (spans[a:b] for a, b in zip([0, *cuts], [*cuts, len(spans)], strict=True)):
            store_spans(batch)
        assert snapshot() == expected, [s.span_id for s in spans]


def test_resending_a_batch_changes_nothing():
    first = store_spans(agent_trace())
    before = snapshot()
    again = store_spans(agent_trace())
    assert (first.accepted, first.duplicates) == (7, 0)
    assert (again.accepted, again.duplicates, again.rejected) == (0, 7, 0)
    assert (again.changes["llm_call_ids"], again.changes["span_count"]) == ([], 0)
    assert snapshot() == before


def test_first_write_wins_for_a_changed_resend():
    store_spans(agent_trace())
    changed = agent_trace()
    changed[1].attributes["gen_ai.usage.input_tokens"] = 999_999
    result = store_spans(changed)
    assert result.duplicates == 7
    assert LLMCall.objects.get(span_id=CHAT1).input_tokens == 100


def test_an_unfinished_span_is_replaced_by_its_finished_version():
    root = agent_trace()[0]
    running = SpanRecord(root.trace_id, root.span_id, root.name, root.start_time_unix_nano, 0,
                         attributes=dict(root.attributes))
    store_spans([running])
    assert Round.objects.get().status == "running"
    assert store_spans([root]).accepted == 1
    assert Round.objects.get().status == "ok"
    assert Span.objects.get(span_id=ROOT).end_time_unix_nano == root.end_time_unix_nano


@pytest.mark.parametrize("child", [False, True], ids=["root", "llm call"])
def test_an_unfinished_span_in_a_placeholder_finished_with_a_conversation_id_folds_it_into_that(child):
    """Stored open without a conversation id (so in a placeholder named after the trace), finished
    with one: the placeholder folds into the named conversation, as it does for later children;
    nothing of it stays behind, in the rows or the rollups."""
    root = agent_trace()[1 if child else 0]
    attributes = {k: v for k, v in root.attributes.items() if k != "gen_ai.conversation.id"}
    store_spans([SpanRecord(root.trace_id, root.span_id, root.name, root.start_time_unix_nano, 0,
                            parent_span_id=root.parent_span_id, attributes=attributes)])
    assert Conversation.objects.get().external_id == TRACE

    finished = SpanRecord(root.trace_id, root.span_id, root.name, root.start_time_unix_nano, root.end_time_unix_nano,
                          parent_span_id=root.parent_span_id, attributes={**attributes, "gen_ai.conversation.id": "named"})
    assert store_spans([finished]).accepted == 1

    conversation = Conversation.objects.get()
    assert (conversation.external_id, conversation.round_count) == ("named", 1)
    assert conversation.llm_call_count == (1 if child else 0)
    assert sum(Rollup.objects.filter(kind="conversation", grain="d").values_list("calls", flat=True)) == 1
    incremental = rollup_rows()
    rebuild_rollups(now=datetime.fromtimestamp(T0 / 1e9, tz=UTC))  # keeping the minutes and hours of then
    assert rollup_rows() == incremental


def test_children_before_a_root_that_names_the_conversation_end_up_in_it():
    spans = agent_trace()
    store_spans(spans[1:])
    assert Conversation.objects.get().external_id == TRACE  # a placeholder named after the trace
    store_spans(spans[:1])
    conversation = Conversation.objects.get()
    assert (conversation.external_id, conversation.llm_call_count, conversation.tool_call_count) == ("conv-store", 2, 2)
    assert set(Span.objects.values_list("conversation_id", flat=True)) == {conversation.id}


def test_ingest_committed_is_sent_once_after_commit(django_capture_on_commit_callbacks):
    received = []

    def receiver(sender, changes, **kwargs):
        received.append(changes)

    spans = agent_trace()
    for tool in spans[2:4]:  # counted tools and no recovered result: no background work is queued
        tool.attributes.update({sc.TOOL_OBSERVATION_TOKENS: 3, "gen_ai.tool.call.result": "x"})
    ingest_committed.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            store_spans(spans)
            assert received == []  # nothing before the commit
        for callback in callbacks:
            callback()
    finally:
        ingest_committed.disconnect(receiver)
    assert len(received) == 1
    changes = received[0]
    assert changes["conversation_ids"] == changes["new_conversation_ids"] == [Conversation.objects.get().id]
    assert sorted(changes["llm_call_ids"]) == sorted(LLMCall.objects.values_list("id", flat=True))
    assert sorted(changes["tool_call_ids"]) == sorted(ToolCall.objects.values_list("id", flat=True))
    assert changes["compression_ids"] == [CompressionEvent.objects.get().id]
    assert (changes["input_tokens"], changes["output_tokens"], changes["span_count"]) == (400, 50, 7)
    assert changes["round_ids"] == [Round.objects.get().id]


def test_invalid_ids_are_rejected_one_by_one():
    spans = agent_trace()
    spans[2].span_id = "xyz"
    spans[3].trace_id = "00" * 16
    result = store_spans(spans)
    assert (result.accepted, result.rejected) == (5, 2)
    assert "span_id must be 8 bytes" in result.error_message and "trace_id must be 16 bytes" in result.error_message
    assert not Span.objects.filter(span_id__in=["xyz", TOOL2]).exists()


def test_a_large_observation_becomes_an_artifact(artifact_dir, settings):
    settings.CTXLENS_ARTIFACT_THRESHOLD_BYTES = 1000
    spans = agent_trace()
    spans[2].attributes["gen_ai.tool.call.result"] = "row " * 5000
    store_spans(spans)
    tool = ToolCall.objects.get(span_id=TOOL1)
    artifact = Artifact.objects.get()
    assert tool.artifact == artifact
    assert artifact.size == 20_000 and artifact.conversation == tool.conversation
    assert (artifact_dir / artifact.artifact_id).read_text() == "row " * 5000
    assert artifact.artifact_id in tool.observation and str(artifact_dir) not in tool.observation
    assert len(tool.observation) < 3000


def test_a_tool_span_naming_an_artifact_links_it_and_gives_it_its_conversation(artifact_dir):
    from pipeline.artifacts.store import store_artifact

    unowned = store_artifact("quarterly figures " * 100)
    other = Conversation.objects.create(external_id="elsewhere", started_at=unowned.created_at,
                                        last_activity_at=unowned.created_at)
    owned = store_artifact("someone else's export " * 100, conversation=other)
    spans = agent_trace()
    spans[2].attributes[sc.TOOL_ARTIFACT_ID] = unowned.artifact_id
    spans[3].attributes[sc.TOOL_ARTIFACT_ID] = owned.artifact_id
    store_spans(spans)
    conversation = Conversation.objects.get(external_id="conv-store")
    search, fetch = ToolCall.objects.get(span_id=TOOL1), ToolCall.objects.get(span_id=TOOL2)
    assert (search.artifact, fetch.artifact) == (unowned, owned)
    unowned.refresh_from_db()
    owned.refresh_from_db()
    assert (unowned.conversation, owned.conversation) == (conversation, other)  # an owner is never replaced
    unknown = agent_trace("5" * 32)
    unknown[2].attributes[sc.TOOL_ARTIFACT_ID] = "artifact_" + "0" * 32  # not stored here: linked to nothing
    assert store_spans(unknown).accepted == 7
    assert ToolCall.objects.get(trace_id="5" * 32, span_id=TOOL1).artifact is None


def test_openinference_tool_spans_recover_their_call_id_from_the_output_payload():
    output = json.dumps({"type": "tool", "data": {"content": "Sunny", "tool_call_id": "call_oi", "name": "weather"}})
    tool = SpanRecord(TRACE, TOOL1, "weather", T0, T0 + MS, attributes={
        "openinference.span.kind": "TOOL", "tool.name": "weather", "input.value": "Paris",
        "output.value": output, "output.mime_type": "application/json",
    })
    store_spans([tool])
    stored = ToolCall.objects.get()
    assert (stored.tool_name, stored.tool_call_id, stored.observation, stored.arguments) == (
        "weather", "call_oi", "Sunny", "Paris")


def test_legacy_openllmetry_prompt_attributes_become_messages():
    chat = SpanRecord(TRACE, CHAT1, "FakeChat.chat", T0, T0 + MS, kind=3, attributes={
        "llm.request.type": "chat", "gen_ai.system": "Langchain", "gen_ai.request.model": "unknown",
        "traceloop.association.properties.ls_model_name": "fake-gpt",
        "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "Weather?",
        "gen_ai.prompt.1.role": "assistant", "gen_ai.prompt.1.tool_calls.0.id": "call_1",
        "gen_ai.prompt.1.tool_calls.0.name": "weather", "gen_ai.prompt.1.tool_calls.0.arguments": '{"city": "Paris"}',
        "gen_ai.prompt.2.role": "tool", "gen_ai.prompt.2.content": "Sunny", "gen_ai.prompt.2.tool_call_id": "call_1",
        "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": "It is sunny.",
        "gen_ai.usage.prompt_tokens": 60, "gen_ai.usage.completion_tokens": 12,
        "gen_ai.usage.cache_read_input_tokens": 5,
    })
    store_spans([chat])
    call = LLMCall.objects.get()
    assert (call.model, call.input_tokens, call.output_tokens, call.cache_read_tokens) == ("fake-gpt", 60, 12, 5)
    assert call.input_messages == [
        {"role": "user", "parts": [{"type": "text", "content": "Weather?"}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_1", "name": "weather",
                                         "arguments": {"city": "Paris"}}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1", "response": "Sunny"}]},
    ]
    assert call.output_messages == [{"role": "assistant", "parts": [{"type": "text", "content": "It is sunny."}]}]
    assert sum(v for k, v in call.context_composition.items() if k != "free") == 60


def test_spans_without_token_counts_are_counted_after_the_response():
    spans = agent_trace()
    for span in spans:
        for key in ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"):
            span.attributes.pop(key, None)
    store_spans(spans)
    assert LLMCall.objects.filter(tokens_pending=True).count() == 2
    # The search result is counted before the transaction (its requesting chat is in the batch:
    # pipeline.ingest.write.precount); the fetch result, recovered from a later call's input, after it.
    assert list(ToolCall.objects.filter(tokens_pending=True).values_list("span_id", flat=True)) == [TOOL2]
    deferred.complete_pending()
    assert not LLMCall.objects.filter(tokens_pending=True).exists()
    assert not ToolCall.objects.filter(tokens_pending=True).exists()
    # What the model read and wrote, counted here as the runtime counts the same LangChain
    # messages (one rule: per-message overhead, tool call ids, names and arguments), not from stored rows.
    from langchain_core.messages import AIMessage, HumanMessage

    from pipeline.tokens.counting import count_message_tokens, count_tokens

    asked = count_message_tokens(HumanMessage("Find ctx"), "gpt-4o")
    answered = count_message_tokens(AIMessage("", tool_calls=[
        {"id": "call_a", "name": "search", "args": {"q": "ctx"}},
        {"id": "call_b", "name": "fetch", "args": {"url": "http://x"}}]), "gpt-4o")
    first = LLMCall.objects.get(span_id=CHAT1)
    assert (first.input_tokens, first.output_tokens) == (asked, answered)
    assert asked == count_tokens("Find ctx", "gpt-4o") + 4
    assert first.context_composition["user"] == asked
    assert ToolCall.objects.get(span_id=TOOL1).observation_tokens == count_tokens("3 hits", "gpt-4o") == 2
    assert Conversation.objects.get().input_tokens == sum(LLMCall.objects.values_list("input_tokens", flat=True))


def test_an_exception_event_marks_the_span_failed():
    tool = SpanRecord(TRACE, TOOL1, "execute_tool boom", T0, T0 + MS, attributes={
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "boom"},
        events=[SpanEvent("exception", T0, {"exception.type": "ValueError", "exception.message": "exploded"})])
    store_spans([tool])
    stored = ToolCall.objects.get()
    assert (stored.success, stored.error_type, stored.error_message) == (False, "ValueError", "exploded")
    assert Round.objects.get().error_count == 1


def _event_mode_logs(root: str) -> list[LogRecord]:
    """OpenLLMetry event mode (research §5.3): message events that name the root span, not the chat."""
    def log(i, name, body):
        return LogRecord(TRACE, root, T0 + i, name, body, {"gen_ai.provider.name": "langchain"})

    return [
        log(1, "gen_ai.user.message", {"content": "Weather?"}),
        log(2, "gen_ai.choice", {"index": 0, "message": {"content": ""}, "finish_reason": "tool_calls",
                                 "tool_calls": [{"id": "call_1", "function": {"name": "weather",
                                                                               "arguments": {"city": "Paris"}}}]}),
        log(3, "gen_ai.user.message", {"content": "Weather?"}),
        log(4, "gen_ai.tool.message", {"content": "Sunny", "id": "call_1"}),
        log(5, "gen_ai.choice", {"index": 0, "message": {"content": "It is sunny."}}),
    ]


@pytest.mark.parametrize("logs_first", [False, True])
def test_message_events_from_logs_reach_their_llm_calls_in_either_order(logs_first):
    def chat(span_id, start):
        return SpanRecord(TRACE, span_id, "FakeChat.chat", T0 + start * MS, T0 + (start + 5) * MS, parent_span_id=ROOT,
                          attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "fake",
                                      "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 2})

    tool = SpanRecord(TRACE, TOOL1, "execute_tool weather", T0 + 7 * MS, T0 + 8 * MS, parent_span_id=ROOT,
                      attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "weather"})
    spans = [chat(CHAT1, 1), tool, chat(CHAT2, 10)]
    if logs_first:
        store_spans([], logs=_event_mode_logs(ROOT))
        store_spans(spans)
    else:
        store_spans(spans)
        store_spans([], logs=_event_mode_logs(ROOT))
    store_spans([], logs=_event_mode_logs(ROOT))  # a re-sent log batch adds nothing
    assert SpanLog.objects.count() == 5
    first, second = LLMCall.objects.order_by("step")
    assert first.input_messages == [{"role": "user", "parts": [{"type": "text", "content": "Weather?"}]}]
    assert first.output_messages[0]["parts"] == [{"type": "tool_call", "id": "call_1", "name": "weather",
                                                  "arguments": {"city": "Paris"}}]
    assert second.output_messages[0]["parts"] == [{"type": "text", "content": "It is sunny."}]
    stored_tool = ToolCall.objects.get()
    assert (stored_tool.tool_call_id, stored_tool.llm_call, stored_tool.observation) == ("call_1", first, "Sunny")
    assert Round.objects.get().final_answer == "It is sunny."


def test_logs_of_a_call_that_arrive_in_later_batches_extend_its_messages_in_time_order():
    chat = SpanRecord(TRACE, CHAT1, "chat gpt-4o", T0, T0 + 5 * MS, attributes={
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
        "gen_ai.usage.input_tokens": 40, "gen_ai.usage.output_tokens": 4})
    own = SpanRecord(TRACE, CHAT2, "chat gpt-4o", T0 + 6 * MS, T0 + 9 * MS, attributes={
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o", "gen_ai.usage.input_tokens": 9,
        "gen_ai.input.messages": _messages({"role": "user", "parts": [{"type": "text", "content": "Own words"}]})})

    def log(span_id, i, name, body):
        return LogRecord(TRACE, span_id, T0 + i, name, body)

    system = log(CHAT1, 1, "gen_ai.system.message", {"content": "Be brief."})
    user = log(CHAT1, 2, "gen_ai.user.message", {"content": "Weather in Paris?"})
    choice = log(CHAT1, 3, "gen_ai.choice", {"index": 0, "message": {"content": "Sunny."}, "finish_reason": "stop"})
    store_spans([chat, own], logs=[user])
    store_spans([], logs=[choice, log(CHAT2, 4, "gen_ai.user.message", {"content": "from a log"})])
    call = LLMCall.objects.get(span_id=CHAT1)
    assert call.input_messages == [{"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}]}]
    assert (call.output_messages[0]["parts"], call.finish_reason) == ([{"type": "text", "content": "Sunny."}], "stop")

    store_spans([], logs=[system])  # earlier in time, later to arrive: it goes first
    store_spans([], logs=[system, user, choice])  # a re-send changes nothing
    call = LLMCall.objects.get(span_id=CHAT1)
    assert [m["role"] for m in call.input_messages] == ["system", "user"]
    assert call.input_messages[0]["parts"] == [{"type": "text", "content": "Be brief."}]
    assert len(call.output_messages) == 1
    assert sum(v for k, v in call.context_composition.items() if k != "free") == 40  # split over all of them
    assert call.context_composition["system"] > 0
    # Messages the span carried itself are never replaced by logs.
    assert LLMCall.objects.get(span_id=CHAT2).input_messages == [
        {"role": "user", "parts": [{"type": "text", "content": "Own words"}]}]
    assert Round.objects.get().final_answer == "Sunny."


def opened(span: SpanRecord) -> SpanRecord:
    """`span` as an instrumentation exports it while it is still running."""
    return SpanRecord(span.trace_id, span.span_id, span.name, span.start_time_unix_nano, 0,
                      parent_span_id=span.parent_span_id, attributes=dict(span.attributes), resource=span.resource)


def finished_as_a_plain_span(span: SpanRecord) -> SpanRecord:
    return SpanRecord(span.trace_id, span.span_id, "step", span.start_time_unix_nano, span.end_time_unix_nano,
                      parent_span_id=span.parent_span_id, attributes={"step": "done"}, resource=span.resource)


def chat_answering(call_id: str, span_id: str, start_ms: int) -> SpanRecord:
    return SpanRecord(TRACE, span_id, "chat gpt-4o", T0 + start_ms * MS, T0 + (start_ms + 5) * MS, parent_span_id=ROOT,
                      resource={"service.name": "store-test"}, attributes={
                          "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
                          "gen_ai.usage.input_tokens": 500, "gen_ai.usage.output_tokens": 5,
                          "gen_ai.input.messages": _messages({"role": "tool", "parts": [
                              {"type": "tool_call_response", "id": call_id, "response": "page text " * 20}]}),
                          "gen_ai.output.messages": _messages({"role": "assistant", "parts": [
                              {"type": "text", "content": "ok"}]}),
                      })


def context_cost(tool: ToolCall) -> tuple:
    tool.refresh_from_db()
    return tool.context_tokens, tool.context_carries, tool.context_cost_usd


def carried_by(span_id: str) -> tuple:
    carry = ToolResultCarry.objects.get(span_id=span_id)
    return carry.tokens, 1, carry.cost_usd


@pytest.mark.parametrize("root", ["stored first", "sent with the finished span"])
def test_an_unfinished_llm_span_finished_as_another_kind_takes_its_carries_along(root):
    first, *spans, chat = agent_trace()
    if root == "stored first":  # and a later call carries fetch's result too, and stays
        spans = [first, *spans, chat_answering("call_b", "00000000000000c3", 60)]
    # else the trace is in a placeholder conversation, which the root's batch merges into the one it
    # names, and the running call is the result's only carrier
    store_spans([*spans, opened(chat)])
    deferred.complete_pending()
    fetched = ToolCall.objects.get(tool_call_id="call_b")
    tokens, carries, cost = context_cost(fetched)
    assert tokens > 0 and carries == ToolResultCarry.objects.count() and cost is not None

    finishing = [finished_as_a_plain_span(chat), *([first] if root != "stored first" else [])]
    assert store_spans(finishing).accepted == len(finishing)
    deferred.complete_pending()
    assert Conversation.objects.get().external_id == "conv-store"
    assert not LLMCall.objects.filter(span_id=CHAT2).exists()
    assert not ToolResultCarry.objects.filter(span_id=CHAT2).exists()
    staying = "00000000000000c3" if root == "stored first" else None
    assert context_cost(fetched) == (carried_by(staying) if staying else (0, 0, None))


def test_an_unfinished_tool_span_finished_as_another_kind_hands_its_carries_to_the_call_sharing_its_id():
    spans = agent_trace()
    again = SpanRecord(TRACE, "00000000000000aa", "execute_tool search", T0 + 51 * MS, T0 + 55 * MS,
                       parent_span_id=ROOT, resource={"service.name": "store-test"}, attributes={
                           "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search",
                           "gen_ai.tool.call.id": "call_a", "gen_ai.tool.call.result": "3 more hits"})
    reader = chat_answering("call_a", "00000000000000c3", 60)
    store_spans([*spans, opened(again), reader])
    deferred.complete_pending()
    first, second = ToolCall.objects.filter(tool_call_id="call_a").order_by("started_at")
    assert context_cost(first) == (0, 0, None)  # the carry counts for the later call of the two
    assert context_cost(second) == carried_by(reader.span_id)

    assert store_spans([finished_as_a_plain_span(again)]).accepted == 1
    deferred.complete_pending()
    assert not ToolCall.objects.filter(pk=second.pk).exists()
    assert context_cost(first) == carried_by(reader.span_id)
