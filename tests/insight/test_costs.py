"""What each LLM call cost (LLMCall.cost_usd) and its sums, from spans sent the way agents send
them, compared with genai-prices' own calculation and read back through the API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from pipeline import semconv as sc
from pipeline.ingest.inprocess import StoreSpanExporter
from pipeline.ingest.records import LogRecord, SpanRecord
from pipeline.ingest.write import deferred
from pipeline.ingest.write.store import store_spans
from pipeline.models import Conversation, LLMCall, Round
from tests.insight.cost_support import (
    genai_price,
    ingest_client,
    llm_call,
    read_client,
    round_start,
    send,
    stat_texts,
)

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
NS = 1_000_000_000


def nanos(at: datetime) -> int:
    return int(at.timestamp()) * NS


def sdk_chat(conversation: str, attributes: dict, at: datetime = T0) -> None:
    """One agent turn with one chat span, made by the real OpenTelemetry SDK and stored by the
    in-process exporter (the same store as OTLP)."""
    provider = TracerProvider(resource=Resource.create({"service.name": "cost-test-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(StoreSpanExporter(own_thread=False)))
    tracer = provider.get_tracer("tests.costs")
    with tracer.start_as_current_span("invoke_agent billing", start_time=nanos(at), attributes={
        "gen_ai.operation.name": "invoke_agent", sc.CONVERSATION_ID: conversation,
        sc.ROUND_USER_MESSAGE: "What did this cost?",
    }):
        with tracer.start_as_current_span("chat", start_time=nanos(at) + 1000, attributes={
            "gen_ai.operation.name": "chat", **attributes,
        }):
            pass
    provider.shutdown()


def test_a_gpt_4o_call_costs_exactly_what_genai_prices_gives(db):
    sdk_chat("priced", {
        "gen_ai.request.model": "gpt-4o", "gen_ai.provider.name": "openai",
        "gen_ai.usage.input_tokens": 12_345, "gen_ai.usage.output_tokens": 678,
        "gen_ai.usage.cache_read.input_tokens": 2_000, "gen_ai.usage.reasoning.output_tokens": 0,
    })
    expected = genai_price("gpt-4o", T0, input=12_345, output=678, cache_read=2_000)
    assert expected == Decimal("0.0351425")  # 10,345 × $2.50 + 2,000 × $1.25 + 678 × $10 per million

    call = LLMCall.objects.get()
    assert call.cost_usd == expected
    conversation = Conversation.objects.get(external_id="priced")
    assert Round.objects.get().cost_usd == conversation.cost_usd == expected
    assert conversation.unpriced_call_count == 0

    body = read_client().get(f"/api/conversations/{conversation.pk}/").json()
    assert body["cost_usd"] == 0.0351425 and isinstance(body["cost_usd"], float)  # a JSON number, not a string
    assert body["totals"]["cost_usd"] == 0.0351425 and body["totals"]["unpriced_llm_calls"] == 0
    assert body["rounds"][0]["cost_usd"] == 0.0351425
    assert body["rounds"][0]["llm_calls"][0]["cost_usd"] == 0.0351425
    listed = read_client().get("/api/conversations/").json()["results"]
    assert [(c["external_id"], c["cost_usd"], c["unpriced_call_count"]) for c in listed] == [("priced", 0.0351425, 0)]


def test_cache_reads_are_priced_at_the_cache_rate(db):
    api = ingest_client()
    send(api, round_start("cache", "r1", T0),
         llm_call("cache", "r1", "cold", T0, "gpt-4o", provider="openai", input_tokens=10_000),
         llm_call("cache", "r1", "warm", T0 + timedelta(seconds=2), "gpt-4o", provider="openai",
                  input_tokens=10_000, cache_read_tokens=8_000))

    cold, warm = LLMCall.objects.order_by("started_at").values_list("cost_usd", flat=True)
    assert cold == Decimal("0.025")  # 10,000 × $2.50 per million
    assert warm == Decimal("0.015")  # 2,000 × $2.50 + 8,000 × $1.25 (the cache rate) per million
    assert warm == genai_price("gpt-4o", T0, input=10_000, cache_read=8_000)
    assert Round.objects.get().cost_usd == Decimal("0.04")


def test_cache_tokens_reported_beside_the_input_are_added_to_it(db):
    """Anthropic's usage counts cache reads and writes apart from input_tokens."""
    sdk_chat("anthropic", {
        "gen_ai.request.model": "claude-3-5-sonnet-20241022", "gen_ai.provider.name": "anthropic",
        "gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 50,
        "gen_ai.usage.cache_read.input_tokens": 5_000, "gen_ai.usage.cache_creation.input_tokens": 1_000,
    })
    expected = genai_price("claude-3-5-sonnet-20241022", T0, provider="anthropic", input=6_100, output=50,
                           cache_read=5_000, cache_write=1_000)
    assert expected == Decimal("0.0063")  # 100 × $3 + 5,000 × $0.30 + 1,000 × $3.75 + 50 × $15 per million
    assert LLMCall.objects.get().cost_usd == expected


def test_an_unpriced_model_costs_null_and_the_pages_say_no_price(client, alice):
    send(ingest_client(), round_start("unknown", "r1", T0),
         llm_call("unknown", "r1", "c1", T0, "acme-large-1", provider="acme", input_tokens=900, output_tokens=40))
    conversation = Conversation.objects.get()
    assert LLMCall.objects.get().cost_usd is None
    assert (conversation.cost_usd, conversation.unpriced_call_count) == (None, 1)
    assert (Round.objects.get().cost_usd, Round.objects.get().unpriced_call_count) == (None, 1)

    body = read_client().get(f"/api/conversations/{conversation.pk}/").json()
    assert body["cost_usd"] is None and body["unpriced_call_count"] == 1
    assert body["rounds"][0]["llm_calls"][0]["cost_usd"] is None
    assert body["totals"]["cost_usd"] is None and body["totals"]["unpriced_llm_calls"] == 1

    client.force_login(alice)
    listing = client.get("/conversations/").content.decode()
    assert stat_texts(listing, "cost") == ["no price"]
    page = client.get(f"/conversations/{conversation.pk}/").content.decode()
    assert stat_texts(page, "cost") == ["no price"]
    assert stat_texts(page, "round-cost") == ["no price"] and stat_texts(page, "call-cost") == ["no price"]
    call_page = client.get(f"/llm-calls/{LLMCall.objects.get().pk}/").content.decode()
    assert stat_texts(call_page, "cost") == ["no price"]
    assert all("$0" not in html for html in (listing, page, call_page))



def test_a_prices_file_prices_an_unknown_model_and_overrides_a_known_one(settings, tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text(
        "models:\n"
        "  - match: 'acme-large*'\n    input_mtok: 3\n    output_mtok: 15\n    cache_read_mtok: 0.3\n"
        "  - match: gpt-4o\n    provider: openai\n    input_mtok: 1\n    output_mtok: 2\n"
    )
    settings.CTXLENS_PRICES_FILE = str(prices)
    send(ingest_client(), round_start("file", "r1", T0),
         llm_call("file", "r1", "acme", T0, "acme-large-2", provider="acme", input_tokens=1_000_000,
                  cache_read_tokens=500_000, output_tokens=2_000),
         llm_call("file", "r1", "ours", T0 + timedelta(seconds=2), "gpt-4o", provider="openai",
                  input_tokens=1_000_000, output_tokens=1_000_000),
         llm_call("file", "r1", "azure", T0 + timedelta(seconds=4), "gpt-4o", provider="azure",
                  input_tokens=1_000_000))

    acme, ours, azure = LLMCall.objects.order_by("started_at").values_list("cost_usd", flat=True)
    assert acme == Decimal("1.68")  # 500,000 × $3 + 500,000 × $0.30 + 2,000 × $15 per million
    assert ours == Decimal("3")  # the file's $1 + $2, not genai-prices' $2.50 + $10
    # the override names a provider: gpt-4o on Azure keeps genai-prices' price
    assert azure == genai_price("gpt-4o", T0, provider="azure", input=1_000_000) == Decimal("2.5")
    assert Conversation.objects.get().cost_usd == Decimal("7.18")


def test_tokens_counted_after_the_response_get_a_cost(db):
    """An LLM call that carries messages but no usage is counted after the ingest response
    (pipeline.ingest.write.deferred); its cost and the sums follow the counts."""
    send(ingest_client(), round_start("deferred", "r1", T0), llm_call(
        "deferred", "r1", "c1", T0, "gpt-4o", provider="openai",
        input_messages=[{"role": "system", "content": "You answer questions about invoices."},
                        {"role": "user", "content": "Which invoices from March are still unpaid, and by whom?"}],
        output_messages=[{"role": "assistant", "content": "Three: ACME (4,200 EUR), Globex and Initech."}],
    ))
    call = LLMCall.objects.get()
    assert call.tokens_pending and (call.input_tokens, call.output_tokens) == (0, 0)

    deferred.complete_pending()

    call.refresh_from_db()
    assert not call.tokens_pending and call.input_tokens > 0 and call.output_tokens > 0
    expected = genai_price("gpt-4o", T0, input=call.input_tokens, output=call.output_tokens)
    assert call.cost_usd == expected > 0
    assert Round.objects.get().cost_usd == Conversation.objects.get().cost_usd == expected


def test_a_call_whose_messages_arrive_as_logs_is_priced_on_the_counts_they_give(db):
    """Messages sent as OTLP log events rebuild the call (pipeline.ingest.write.logs) whenever more
    of them arrive; the counts are computed again after each rebuild, and at every step the cost
    and the sums are those of the counts the call has."""
    trace, span = "5bf92f3577b34da6a3ce929d0e0e4736", "00000000000000c1"
    start = nanos(T0)

    def consistent() -> LLMCall:
        call = LLMCall.objects.get()
        # Before any count exists the cost is unknown (null), not $0.
        assert call.cost_usd == (genai_price("gpt-4o", T0, input=call.input_tokens, output=call.output_tokens)
                                 if call.input_tokens or call.output_tokens else None)
        assert Round.objects.get().cost_usd == Conversation.objects.get().cost_usd == call.cost_usd
        return call

    store_spans([SpanRecord(trace, span, "chat gpt-4o", start, start + 5_000_000, attributes={
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o", "gen_ai.provider.name": "openai",
        sc.CONVERSATION_ID: "logged"})], logs=[
        LogRecord(trace, span, start + 1, "gen_ai.user.message", {"content": "Summarise the March invoices."})])
    deferred.complete_pending()
    asked = consistent()
    assert asked.input_tokens > 0 and asked.output_tokens == 0 and asked.cost_usd > 0

    store_spans([], logs=[LogRecord(trace, span, start + 2, "gen_ai.choice", {
        "index": 0, "message": {"content": "Three are unpaid: ACME, Globex and Initech, 9,100 EUR in all."}})])
    rebuilt = consistent()  # rebuilt from both logs: counts to compute again, the old cost gone with them
    assert rebuilt.tokens_pending and (rebuilt.input_tokens, rebuilt.cost_usd) == (0, None)

    deferred.complete_pending()
    answered = consistent()
    assert answered.input_tokens == asked.input_tokens and answered.output_tokens > 0
    assert answered.cost_usd > asked.cost_usd


def test_re_sends_and_late_calls_do_not_change_the_sums_by_more_than_their_cost(db):
    api = ingest_client()
    first = llm_call("resend", "r1", "c1", T0, "gpt-4o", provider="openai", input_tokens=4_000, output_tokens=100)
    second = llm_call("resend", "r1", "c2", T0 + timedelta(seconds=5), "gpt-4o", provider="openai",
                      input_tokens=4_300, output_tokens=60)
    earlier = llm_call("resend", "r0", "c0", T0 - timedelta(minutes=1), "gpt-4o", provider="openai",
                       input_tokens=1_000, output_tokens=10)
    send(api, second)  # the turn's second call first, before its round_start
    send(api, round_start("resend", "r1", T0), first)
    assert send(api, first, second)["duplicates"] == 2  # the same calls again
    send(api, earlier)  # a turn that started earlier, sent last

    costs = {c: genai_price("gpt-4o", T0, input=i, output=o)
             for c, i, o in (("c1", 4_000, 100), ("c2", 4_300, 60), ("c0", 1_000, 10))}
    assert costs == {"c1": Decimal("0.011"), "c2": Decimal("0.01135"), "c0": Decimal("0.0026")}
    r1, r0 = Round.objects.get(key="r1"), Round.objects.get(key="r0")
    assert r1.cost_usd == Decimal("0.02235") and r0.cost_usd == Decimal("0.0026")
    conversation = Conversation.objects.get()
    assert conversation.cost_usd == Decimal("0.02495") and conversation.llm_call_count == 3
    assert read_client().get(f"/api/conversations/{conversation.pk}/").json()["cost_usd"] == 0.02495


def test_a_conversation_with_priced_and_unpriced_calls_is_partly_priced(client, alice):
    send(ingest_client(), round_start("mixed", "r1", T0),
         llm_call("mixed", "r1", "c1", T0, "gpt-4o", provider="openai", input_tokens=2_000, output_tokens=100),
         llm_call("mixed", "r1", "c2", T0 + timedelta(seconds=2), "in-house-7b", input_tokens=2_000))
    conversation = Conversation.objects.get()
    assert (conversation.cost_usd, conversation.unpriced_call_count) == (Decimal("0.006"), 1)

    client.force_login(alice)
    assert stat_texts(client.get("/conversations/").content.decode(), "cost") == ["$0.006 partly priced"]
    page = client.get(f"/conversations/{conversation.pk}/").content.decode()
    assert stat_texts(page, "cost") == ["$0.006 partly priced"]
    assert stat_texts(page, "round-cost") == ["$0.006 partly priced"]
    assert stat_texts(page, "call-cost") == ["$0.006", "no price"]


def test_the_llm_call_page_splits_the_cost_by_kind_of_token(client, alice):
    send(ingest_client(), round_start("split", "r1", T0),
         llm_call("split", "r1", "c1", T0, "gpt-4o", provider="openai", input_tokens=10_000,
                  cache_read_tokens=8_000, output_tokens=500))
    client.force_login(alice)
    page = client.get(f"/llm-calls/{LLMCall.objects.get().pk}/").content.decode()

    # 2,000 × $2.50 + 8,000 × $1.25 + 500 × $10 per million
    assert stat_texts(page, "cost") == ["$0.02 input $0.005 · cache read $0.01 · output $0.005"]


def test_a_conversation_that_comes_back_to_life_while_pruned_keeps_exact_sums(db, settings):
    """Prune deletes an old conversation's rows batch by batch; an ingest that makes it current
    again in between stops the deletion, and its sums must be those of the rows left."""
    from django.db.models.signals import pre_delete

    from pipeline.retention import prune

    api = ingest_client()
    old = T0 - timedelta(days=60)
    send(api, round_start("revived", "r1", old),
         llm_call("revived", "r1", "c1", old, "gpt-4o", provider="openai", input_tokens=4_000))
    assert Conversation.objects.get().cost_usd == Decimal("0.01")
    now = datetime.now(UTC)

    def revive(sender: type, instance: LLMCall, **kwargs: object) -> None:
        # the batch of calls to delete is chosen; before it goes, the agent sends another turn
        pre_delete.disconnect(revive, sender=LLMCall)
        send(api, round_start("revived", "r2", now),
             llm_call("revived", "r2", "c2", now, "gpt-4o", provider="openai", input_tokens=2_000))

    pre_delete.connect(revive, sender=LLMCall)
    try:
        result = prune(days=30)
    finally:
        pre_delete.disconnect(revive, sender=LLMCall)

    assert result.conversations == 0
    conversation = Conversation.objects.get()
    assert LLMCall.objects.get().cost_usd == Decimal("0.005")  # the new call; the old one went
    assert conversation.cost_usd == Decimal("0.005") and conversation.llm_call_count == 1
    assert sorted(Round.objects.values_list("key", "cost_usd", "unpriced_call_count")) == [
        ("r1", None, 0), ("r2", Decimal("0.005"), 0)]


def test_an_absurd_price_is_refused_and_prices_nothing_instead_of_failing_ingest(settings, tmp_path):
    # Over $1 a token: sums of such calls could outgrow the cost columns, so the file is refused.
    prices = tmp_path / "prices.yaml"
    prices.write_text("models:\n  - match: 'acme-*'\n    input_mtok: 1e20\n    output_mtok: 1\n")
    settings.CTXLENS_PRICES_FILE = str(prices)
    with pytest.raises(SystemCheckError, match="input_mtok must be at most 1000000 USD per million tokens"):
        call_command("check")
    send(ingest_client(), round_start("absurd", "r1", T0),
         llm_call("absurd", "r1", "c1", T0, "acme-huge", input_tokens=1_000),
         llm_call("absurd", "r1", "c2", T0 + timedelta(seconds=2), "acme-huge", output_tokens=1_000_000))

    assert list(LLMCall.objects.order_by("started_at").values_list("cost_usd", flat=True)) == [None, None]
    assert (Conversation.objects.get().cost_usd, Conversation.objects.get().unpriced_call_count) == (None, 2)
