"""Concurrent OTLP senders against live uvicorn: 20,000 spans, traces split across requests that
are in flight at the same time; every span stored exactly once, one conversation per trace, no 5xx.

As an exporter sends them, a trace's children go out before its root (the root ends last), often
in an earlier batch, and neighbouring batches are sent at once by different senders, so the
root and the children of a trace race in two requests (the test checks that they did). On SQLite
a server writes on one thread and the database has one writer; on PostgreSQL a server writes on
several threads (pipeline.ingest.write.writer_threads), and two server processes share the database.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import httpx
import pytest
from django.db.models import Count, Sum
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from pipeline.models import Conversation, LLMCall, Round, Span, ToolCall
from tests.otlp_support import PROTOBUF, auth, make_key, wait_for_deferred_tokens

pytestmark = pytest.mark.django_db(transaction=True)
postgresql_only = pytest.mark.skipif(
    not os.environ.get("DATABASE_URL", "").startswith("postgres"),
    reason="needs a PostgreSQL DATABASE_URL (CI's second pass): SQLite has one writer, so requests do not race",
)

TRACES, SPANS_PER_TRACE, BATCH, SENDERS, SESSIONS = 4000, 5, 100, 8, 40
ROOT_LAG = 40  # a trace's root goes out up to this many traces after its children


def _attrs(span: trace_pb2.Span, **values: object) -> None:
    for key, value in values.items():
        kv = span.attributes.add(key=key.replace("__", "."))
        if isinstance(value, int):
            kv.value.int_value = value
        else:
            kv.value.string_value = str(value)


def _trace(rng: random.Random, t0: int, session: str) -> list[trace_pb2.Span]:
    """chat, tool, chat, tool, then the root (names the session), which ends last."""
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
    _attrs(root, gen_ai__operation__name="invoke_agent", session__id=session)
    return [*spans, root]


@dataclass
class Workload:
    bodies: list[bytes]
    sessions: dict[str, str]  # trace id (hex) -> the session its root names
    requests_of: dict[str, set[int]] = field(default_factory=dict)  # trace id -> the bodies carrying its spans


def _workload(traces: int = TRACES) -> Workload:
    rng = random.Random(20_000)
    stream: list[trace_pb2.Span] = []
    due: dict[int, list[trace_pb2.Span]] = defaultdict(list)
    sessions: dict[str, str] = {}
    for n in range(traces):
        session = f"sess-{rng.randrange(SESSIONS)}"
        *children, root = _trace(rng, 1_763_800_000_000_000_000 + n * 10**9, session)
        sessions[root.trace_id.hex()] = session
        stream += children
        due[n + rng.randrange(ROOT_LAG)].append(root)
        stream += due.pop(n, [])
    for step in sorted(due):
        stream += due[step]
    workload = Workload([], sessions)
    requests_of: dict[str, set[int]] = defaultdict(set)
    for start in range(0, len(stream), BATCH):
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.resource_spans.add().scope_spans.add().spans.extend(stream[start:start + BATCH])
        for span in stream[start:start + BATCH]:
            requests_of[span.trace_id.hex()].add(len(workload.bodies))
        workload.bodies.append(request.SerializeToString())
    workload.requests_of = dict(requests_of)
    return workload


def _send_concurrently(urls: list[str], workload: Workload) -> tuple[Counter, dict[int, list[tuple[float, float]]]]:
    """SENDERS threads send the batches about in order (shuffled within each window of SENDERS, so
    neighbours are in flight together), some twice as an exporter's retry would; sender i posts to
    urls[i % len(urls)]. Returns the reply statuses and when each batch was in flight."""
    rng = random.Random(8)
    order = list(range(len(workload.bodies)))
    for resent in order[::25]:  # a retry goes out a little later, from another sender
        order.insert(min(len(order), order.index(resent) + rng.randrange(2, 12)), resent)
    queue = []
    for start in range(0, len(order), SENDERS):
        window = order[start:start + SENDERS]
        rng.shuffle(window)
        queue += window
    queue.reverse()  # popped from the end
    statuses: Counter = Counter()
    in_flight: dict[int, list[tuple[float, float]]] = defaultdict(list)
    lock = threading.Lock()
    headers = {**auth(make_key()), "Content-Type": PROTOBUF}

    def sender(url: str) -> None:
        with httpx.Client(base_url=url, timeout=120) as client:
            while True:
                with lock:
                    if not queue:
                        return
                    index = queue.pop()
                began = time.monotonic()
                reply = client.post("/v1/traces", content=workload.bodies[index], headers=headers)
                ended = time.monotonic()
                partial = trace_service_pb2.ExportTraceServiceResponse.FromString(reply.content).partial_success
                with lock:
                    in_flight[index].append((began, ended))
                    statuses[reply.status_code] += 1
                    if partial.rejected_spans:
                        statuses["rejected"] += partial.rejected_spans

    threads = [threading.Thread(target=sender, args=(urls[i % len(urls)],)) for i in range(SENDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses, in_flight


def _raced(workload: Workload, in_flight: dict[int, list[tuple[float, float]]]) -> int:
    """Traces of which two requests carrying different parts were in flight at the same time."""
    raced = 0
    for requests in workload.requests_of.values():
        times = sorted((t, r) for r in requests for t in in_flight[r])
        if any(a[0][1] > b[0][0] and a[1] != b[1] for a, b in zip(times, times[1:])):
            raced += 1
    return raced


def _assert_stored_exactly_once(workload: Workload, statuses: Counter) -> None:
    traces = len(workload.sessions)
    assert statuses == {200: len(workload.bodies) + len(workload.bodies[::25])}, statuses  # no 5xx, no rejections
    total = traces * SPANS_PER_TRACE
    assert Span.objects.count() == total
    assert Span.objects.values("trace_id", "span_id").distinct().count() == total
    assert (LLMCall.objects.count(), ToolCall.objects.count(), Round.objects.count()) == (2 * traces, 2 * traces, traces)
    # One conversation per trace, the session its root names: no trace split, no placeholder left.
    assert not Span.objects.values("trace_id").annotate(n=Count("conversation_id", distinct=True)).filter(n__gt=1)
    assert not Span.objects.filter(conversation__isnull=True).exists()
    stored = dict(Span.objects.values_list("trace_id", "conversation__external_id").distinct())
    assert stored == workload.sessions
    assert Conversation.objects.count() == len(set(workload.sessions.values()))
    for model in (LLMCall, ToolCall):
        assert not model.objects.exclude(conversation__external_id__startswith="sess-").exists()
    assert not ToolCall.objects.filter(llm_call__isnull=True).exists()
    figures = Conversation.objects.aggregate(llm=Sum("llm_call_count"), tools=Sum("tool_call_count"),
                                             rounds=Sum("round_count"), tokens=Sum("input_tokens"))
    assert figures == {"llm": 2 * traces, "tools": 2 * traces, "rounds": traces, "tokens": traces * (100 + 102)}


def _run(urls: list[str], traces: int = TRACES) -> None:
    workload = _workload(traces)
    split = sum(len(requests) > 1 for requests in workload.requests_of.values())
    assert split > traces // 2, f"only {split} of {traces} traces went out in more than one request"

    statuses, in_flight = _send_concurrently(urls, workload)
    wait_for_deferred_tokens()  # before the servers stop and the tables are emptied

    raced = _raced(workload, in_flight)
    assert raced > traces // 10, f"only {raced} of {split} split traces had two requests in flight at once"
    _assert_stored_exactly_once(workload, statuses)


def test_concurrent_senders_store_every_span_exactly_once(uvicorn_factory, artifact_dir):
    """One server process (on PostgreSQL, several writer threads)."""
    _run([uvicorn_factory({"CTXLENS_ARTIFACT_DIR": str(artifact_dir)}).url])


@postgresql_only
def test_two_server_processes_on_postgresql_store_every_span_exactly_once(uvicorn_factory, artifact_dir):
    env = {"CTXLENS_ARTIFACT_DIR": str(artifact_dir)}
    _run([uvicorn_factory(env).url, uvicorn_factory(env).url])
