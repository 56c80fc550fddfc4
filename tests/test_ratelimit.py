"""Per-key ingest rate limit: the budget, the window, Retry-After, and keys kept apart."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
import time_machine

from pipeline.ratelimit import check_ingest_rate

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
def test_it_refuses_a_key_over_its_budget_until_the_window_ends(limit_10_per_second, key_a, key_b):
    assert check_ingest_rate(key_a, 60).allowed
    second = check_ingest_rate(key_a, 30)
    assert second.allowed and second.remaining == 10
    # The request that crosses the budget is let through, so a big batch is never refused forever.
    assert check_ingest_rate(key_a, 50).allowed
    refused = check_ingest_rate(key_a, 1)
    assert not refused.allowed
    assert refused.retry_after == 10  # the window started at START


@time_machine.travel(START + dt.timedelta(seconds=7.2), tick=False)
def test_retry_after_counts_the_seconds_left_in_the_window(limit_10_per_second, key_a, key_b):
    check_ingest_rate(key_a, 100)
    refused = check_ingest_rate(key_a, 1)
    assert not refused.allowed and refused.retry_after == 3


def test_a_new_window_gives_a_new_budget(limit_10_per_second, key_a, key_b):
    with time_machine.travel(START, tick=False):
        check_ingest_rate(key_a, 100)
        assert not check_ingest_rate(key_a, 1).allowed
    with time_machine.travel(START + dt.timedelta(seconds=10), tick=False):
        assert check_ingest_rate(key_a, 1).allowed


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
    assert not peek.allowed and peek.retry_after == 10


# ---- through the real servers ---------------------------------------------------------------

def _exporter(server, key: str):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers={"Authorization": f"Bearer {key}"},
                            timeout=20)


@pytest.mark.django_db(transaction=True)
def test_otlp_http_answers_503_with_retry_after_and_a_status_body(daphne_factory):
    import httpx
    from google.rpc import status_pb2
    from opentelemetry.sdk.trace.export import SpanExportResult

    from pipeline.models import ApiKey, Span
    from tests.agent_traces import record_turns, span_count

    server = daphne_factory({"CTXLENS_INGEST_RATE_LIMIT": "0.001", "CTXLENS_INGEST_RATE_WINDOW": "3600"})
    key = ApiKey.generate("agent", scope="ingest")[1]
    assert _exporter(server, key).export(record_turns("first")) == SpanExportResult.SUCCESS  # 6 > 3.6: crosses

    reply = httpx.post(f"{server.url}/v1/traces", content=b"", timeout=10, headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/x-protobuf"})

    assert reply.status_code == 503
    assert 1 <= int(reply.headers["Retry-After"]) <= 3600
    assert "rate limit" in status_pb2.Status.FromString(reply.content).message
    assert Span.objects.count() == span_count()
    other = ApiKey.generate("another agent", scope="ingest")[1]
    assert _exporter(server, other).export(record_turns("second")) == SpanExportResult.SUCCESS


@pytest.mark.django_db(transaction=True)
def test_the_otel_http_exporter_waits_out_the_limit_and_loses_nothing(daphne_factory, caplog):
    import logging

    from opentelemetry.sdk.trace.export import SpanExportResult

    from pipeline.models import ApiKey, Span
    from tests.agent_traces import record_turns, span_count

    server = daphne_factory({"CTXLENS_INGEST_RATE_LIMIT": "6", "CTXLENS_INGEST_RATE_WINDOW": "1"})
    key = ApiKey.generate("agent", scope="ingest")[1]
    client = _exporter(server, key)
    caplog.set_level(logging.WARNING)
    batches = [record_turns(f"throttled-{n}") for n in range(5)]  # 6 spans each: a batch spends a window

    assert [client.export(batch) for batch in batches] == [SpanExportResult.SUCCESS] * 5

    assert Span.objects.count() == 5 * span_count()
    assert "Transient error Service Unavailable" in caplog.text  # throttled, retried after Retry-After
