"""Per-key ingest rate limit: the bucket, its refill, Retry-After, and keys kept apart."""

from __future__ import annotations

import datetime as dt
import time
import uuid

import pytest
import time_machine

from pipeline.ingest.ratelimit import MAX_RETRY_AFTER_SECONDS, check_ingest_rate

START = dt.datetime(2026, 6, 1, 12, 0, 0, tzinfo=dt.timezone.utc)


# Fresh key names per test: on the scale path the cache is a shared Redis, which no test may flush.
@pytest.fixture
def key_a() -> str:
    return f"test-{uuid.uuid4().hex}-a"


@pytest.fixture
def key_b() -> str:
    return f"test-{uuid.uuid4().hex}-b"


@pytest.fixture
def limit_10_per_second(settings):
    settings.CTXLENS_INGEST_RATE_LIMIT = 10
    settings.CTXLENS_INGEST_RATE_WINDOW = 10  # 100 spans per 10 s window


def test_no_limit_is_the_default(settings, key_a):
    settings.CTXLENS_INGEST_RATE_LIMIT = 0
    decisions = [check_ingest_rate(key_a, 10_000) for _ in range(10)]
    assert all(d.allowed for d in decisions)
    assert decisions[0].remaining is None


@time_machine.travel(START, tick=False)
def test_it_refuses_a_key_once_its_bucket_is_empty(limit_10_per_second, key_a, key_b):
    assert check_ingest_rate(key_a, 60).allowed
    second = check_ingest_rate(key_a, 30)
    assert second.allowed and second.remaining == 10
    # The request that crosses the budget is let through, so a big batch is never refused forever.
    assert check_ingest_rate(key_a, 50).allowed
    refused = check_ingest_rate(key_a, 1)
    assert not refused.allowed
    # 40 spans over: 4 s to refill at 10/s, but never a wait past what an exporter's deadline allows.
    assert refused.retry_after == MAX_RETRY_AFTER_SECONDS == 3


def test_retry_after_is_the_time_the_deficit_takes_to_refill(limit_10_per_second, key_a, key_b):
    with time_machine.travel(START, tick=False):
        check_ingest_rate(key_a, 100)
        check_ingest_rate(key_a, 1)  # refused: takes nothing
    with time_machine.travel(START + dt.timedelta(seconds=0.05), tick=False):
        assert check_ingest_rate(key_a, 15).allowed  # 0.5 spans refilled: the bucket is not empty
        refused = check_ingest_rate(key_a, 1)
        assert not refused.allowed and refused.retry_after == 2  # 14.5 spans short at 10/s: 1.45 s


def test_the_bucket_refills_at_the_rate(limit_10_per_second, key_a, key_b):
    with time_machine.travel(START, tick=False):
        check_ingest_rate(key_a, 100)
        assert not check_ingest_rate(key_a, 1).allowed
    with time_machine.travel(START + dt.timedelta(seconds=1), tick=False):
        refill = check_ingest_rate(key_a, 5)
        assert refill.allowed and refill.remaining == 5
        assert check_ingest_rate(key_a, 5).allowed
        assert not check_ingest_rate(key_a, 1).allowed


def test_a_quiet_key_gets_a_full_bucket_and_no_more(limit_10_per_second, key_a, key_b):
    with time_machine.travel(START, tick=False):
        check_ingest_rate(key_a, 100)
    with time_machine.travel(START + dt.timedelta(seconds=600), tick=False):
        full = check_ingest_rate(key_a, 100)
        assert full.allowed and full.remaining == 0
        assert not check_ingest_rate(key_a, 1).allowed


def test_a_lost_origin_never_meets_an_old_count(limit_10_per_second, key_a, key_b):
    """The cache may evict one entry and keep the other; a fresh start must not inherit a count."""
    from django.core.cache import cache

    with time_machine.travel(START, tick=False):
        check_ingest_rate(key_a, 100)
        cache.delete(f"ctxlens:ratelimit:{key_a}:origin")
    with time_machine.travel(START + dt.timedelta(seconds=0.5), tick=False):
        fresh = check_ingest_rate(key_a, 10)
        assert fresh.allowed and fresh.remaining == 90


@time_machine.travel(START, tick=False)
def test_keys_have_their_own_budgets(limit_10_per_second, key_a, key_b):
    check_ingest_rate(key_a, 100)
    assert not check_ingest_rate(key_a, 1).allowed
    assert check_ingest_rate(key_b, 1).allowed


@time_machine.travel(START, tick=False)
def test_asking_with_zero_spans_does_not_spend_the_budget(limit_10_per_second, key_a, key_b):
    for _ in range(50):
        assert check_ingest_rate(key_a, 0).allowed
    check_ingest_rate(key_a, 100)
    peek = check_ingest_rate(key_a, 0)
    assert not peek.allowed and peek.retry_after == 1


# ---- through the real servers ---------------------------------------------------------------

def _exporter(server, key: str):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers={"Authorization": f"Bearer {key}"},
                            timeout=20)


@pytest.mark.django_db(transaction=True)
def test_otlp_http_answers_429_with_a_short_retry_after_and_a_status_body(uvicorn_factory):
    import httpx
    from google.rpc import status_pb2
    from opentelemetry.sdk.trace.export import SpanExportResult

    from pipeline.models import ApiKey, Span
    from tests.agent_traces import record_turns, span_count

    server = uvicorn_factory({"CTXLENS_INGEST_RATE_LIMIT": "0.001", "CTXLENS_INGEST_RATE_WINDOW": "3600"})
    key = ApiKey.generate("agent", scope="ingest")[1]
    assert _exporter(server, key).export(record_turns("first")) == SpanExportResult.SUCCESS  # 6 > 3.6: crosses

    reply = httpx.post(f"{server.url}/v1/traces", content=b"", timeout=10, headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/x-protobuf"})

    assert reply.status_code == 429
    assert 1 <= int(reply.headers["Retry-After"]) <= 3
    assert "rate limit" in status_pb2.Status.FromString(reply.content).message
    assert Span.objects.count() == span_count()
    other = ApiKey.generate("another agent", scope="ingest")[1]
    assert _exporter(server, other).export(record_turns("second")) == SpanExportResult.SUCCESS


@pytest.mark.django_db(transaction=True)
def test_the_otel_http_exporter_with_its_defaults_waits_out_the_limit_and_loses_nothing(uvicorn_factory, caplog):
    """The exporter gives up when a Retry-After would pass its 10 s deadline: with a fixed 10 s
    window it waited up to the whole window and dropped batches without one retry."""
    import logging

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    from pipeline.models import ApiKey, Span
    from tests.agent_traces import record_turns, span_count

    server = uvicorn_factory({"CTXLENS_INGEST_RATE_LIMIT": "2"})  # the default 10 s window: a 20-span bucket
    key = ApiKey.generate("agent", scope="ingest")[1]
    client = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers={"Authorization": f"Bearer {key}"})
    caplog.set_level(logging.WARNING)
    batches = [record_turns(f"throttled-{n}") for n in range(6)]  # 6 spans each: 36 spans, sent at once
    # Burst at the start of a 10 s clock window: the worst case of a fixed window, which then
    # answered Retry-After: 10 and lost the batch. A bucket does not care when the burst comes.
    time.sleep(10 - time.time() % 10)

    results = [client.export(batch) for batch in batches]

    assert results == [SpanExportResult.SUCCESS] * 6
    assert Span.objects.count() == 6 * span_count()
    assert "Transient error" in caplog.text and "retrying in" in caplog.text  # throttled, retried after Retry-After
