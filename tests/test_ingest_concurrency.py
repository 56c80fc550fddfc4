"""8 concurrent OTLP senders, 20,000 spans, live daphne on SQLite: every span stored exactly once, no 5xx."""

from __future__ import annotations

import random
import threading
from collections import Counter

import httpx
import pytest
from django.db.models import Sum
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from pipeline.models import Conversation, LLMCall, Round, Span, ToolCall
from tests.otlp_support import PROTOBUF, auth, make_key

pytestmark = pytest.mark.django_db(transaction=True)

TRACES, SPANS_PER_TRACE, BATCH, SENDERS, SESSIONS = 4000, 5, 100, 8, 40


def _attrs(span: trace_pb2.Span, **values: object) -> None:
    for key, value in values.items():
        kv = span.attributes.add(key=key.replace("__", "."))
        if isinstance(value, int):
            kv.value.int_value = value
        else:
            kv.value.string_value = str(value)


def _trace(rng: random.Random, t0: int) -> list[trace_pb2.Span]:
    """root (names the session) > chat, tool, chat, tool; the root ends, and is exported, last."""
    trace_id, root_id = rng.randbytes(16), rng.randbytes(8)
    spans = []
    for i, kind in enumerate(("chat", "tool", "chat", "tool")):
        span = trace_pb2.Span(trace_id=trace_id, span_id=rng.randbytes(8), parent_span_id=root_id,
                              start_time_unix_nano=t0 + i * 10**7, end_time_unix_nano=t0 + i * 10**7 + 5 * 10**6)
        call_id = f"call_{trace_id.hex()[:8]}_{i}"
        if kind == "chat":
            span.name = "chat gpt-4o"
            _attrs(span, gen_ai__operation__name="chat", gen_ai__request__model="gpt-4o",
                   gen_ai__usage__input_tokens=100 + i, gen_ai__usage__output_tokens=10,
                   gen_ai__output__messages=f'[{{"role":"assistant","parts":[{{"type":"tool_call","id":"{call_id}",'
                                            f'"name":"search","arguments":{{"q":"x"}}}}]}}]')
        else:
            span.name = "execute_tool search"
            _attrs(span, gen_ai__operation__name="execute_tool", gen_ai__tool__name="search",
                   gen_ai__tool__call__id=f"call_{trace_id.hex()[:8]}_{i - 1}", gen_ai__tool__call__result="ok " * 50)
        spans.append(span)
    root = trace_pb2.Span(trace_id=trace_id, span_id=root_id, name="invoke_agent", start_time_unix_nano=t0 - 1,
                          end_time_unix_nano=t0 + 10**9)
    _attrs(root, gen_ai__operation__name="invoke_agent", session__id=f"sess-{rng.randrange(SESSIONS)}")
    return [*spans, root]


def _bodies() -> list[bytes]:
    rng = random.Random(20_000)
    spans = [s for n in range(TRACES) for s in _trace(rng, 1_763_800_000_000_000_000 + n * 10**9)]
    bodies = []
    for start in range(0, len(spans), BATCH):  # batches cut traces, so a trace's spans race in two requests
        request = trace_service_pb2.ExportTraceServiceRequest()
        scope = request.resource_spans.add().scope_spans.add()
        scope.spans.extend(spans[start:start + BATCH])
        bodies.append(request.SerializeToString())
    return bodies


def test_concurrent_senders_store_every_span_exactly_once(otlp_server):
    bodies = _bodies()
    resent = bodies[::25]  # some batches are sent twice, by another sender, as an exporter retry would
    queue = list(enumerate([*bodies, *resent]))
    random.Random(8).shuffle(queue)
    statuses: Counter[int] = Counter()
    lock = threading.Lock()
    headers = {**auth(make_key()), "Content-Type": PROTOBUF}

    def sender() -> None:
        with httpx.Client(base_url=otlp_server.url, timeout=120) as client:
            while True:
                with lock:
                    if not queue:
                        return
                    _, body = queue.pop()
                reply = client.post("/v1/traces", content=body, headers=headers)
                partial = trace_service_pb2.ExportTraceServiceResponse.FromString(reply.content).partial_success
                with lock:
                    statuses[reply.status_code] += 1
                    if partial.rejected_spans:
                        statuses["rejected"] += partial.rejected_spans

    threads = [threading.Thread(target=sender) for _ in range(SENDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert statuses == {200: len(bodies) + len(resent)}, statuses  # no 5xx, no rejections
    total = TRACES * SPANS_PER_TRACE
    assert Span.objects.count() == total
    assert Span.objects.values("trace_id", "span_id").distinct().count() == total
    assert (LLMCall.objects.count(), ToolCall.objects.count(), Round.objects.count()) == (2 * TRACES, 2 * TRACES, TRACES)
    assert Conversation.objects.count() == SESSIONS  # every placeholder was folded into its session
    assert not ToolCall.objects.filter(llm_call__isnull=True).exists()
    figures = Conversation.objects.aggregate(llm=Sum("llm_call_count"), tools=Sum("tool_call_count"),
                                             rounds=Sum("round_count"), tokens=Sum("input_tokens"))
    assert figures == {"llm": 2 * TRACES, "tools": 2 * TRACES, "rounds": TRACES, "tokens": TRACES * (100 + 102)}
