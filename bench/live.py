"""Live dashboard figures: ingest-to-browser latency, and page time with 1,000,000 stored spans.

1. Latency from an OTLP POST to the websocket message in connected clients, p50/p95, with 1
   and with 50 clients on /ws/live/. uvicorn (as `make run` serves) on a fresh temporary database; each
   sample is one agent turn (invoke_agent → chat, execute_tool) encoded by the OpenTelemetry
   SDK's OTLP encoder and POSTed to /v1/traces; the clock runs from just before the POST to the
   arrival, in each client, of the first message naming the new conversation. Posts are spaced
   0.40-0.65 s apart, at random: wider than CTXLENS_LIVE_INTERVAL_MS, and under --load at a
   random phase of the frames the load causes, so any wait for the group's next frame (at most
   one frame per group and interval sustained, a few back to back, dashboard/hub.py) is in the
   figure as a user would see it. --base <commit> measures that commit's figure in the same run.
   With --load N, the team's standard load (../shared/bench/otlp_load.py) is ingested at N
   spans/s meanwhile, and the rate the server actually accepted is printed.
2. Server time of the overview and of a conversation page with 1,000,000 stored spans (plus
   the round, LLM-call, tool-call, compression and conversation rows they stand for),
   bulk-inserted into a temporary database (COPY on PostgreSQL), then ANALYZEd; pages rendered
   in-process through Django's test client; every query they run is checked for full scans of
   the big tables (bench/bench_db.py's full_scans: EXPLAIN QUERY PLAN on SQLite, EXPLAIN (FORMAT
   JSON) on PostgreSQL).

The database is a temporary SQLite file, or, with DATABASE_URL=postgres://…, a database the
bench creates on that server and drops after (bench/bench_db.py):

    .venv/bin/python bench/live.py                     # both parts
    .venv/bin/python bench/live.py --part latency --samples 40 --clients 1,50
    .venv/bin/python bench/live.py --part latency --clients 200 --load 1000   # under ingest load
    .venv/bin/python bench/live.py --part latency --clients 200 --load 1000 --base <commit> [--rounds 2]
    .venv/bin/python bench/live.py --part pages --spans 1000000
    .venv/bin/python bench/live.py --part pages --spans 1000000 --base <commit>   # before and after
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/live.py --part pages --spans 1000000

The rows are bulk-inserted, so their rollups (pipeline.rollups) are built after with
rebuild_rollups, as ingest would have kept them. With --base, that commit's tree (a temporary
git worktree) measures the pages on the same database first, then this checkout does; and the
latency in alternating rounds (base, this, this, base, …; --rounds), each side on a server of its
own, then the ratio this/base of the sides' median p50 and p95 (the pages on SQLite only: the
base commit's bench builds its own SQLite database; the latency on either engine, each side on a
database of its own).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.bench_db import (  # noqa: E402  (bench/long_conversation.py imports these from here)
    analyze, bench_database, bulk_insert, engine_name, fast_writes, full_scans, reproduce_prefix, reset_sequences,
)
from bench.trees import checkout, short  # noqa: E402

# A latency line's client count, p50 and p95 (`latency_line`), as --base reads them from each side.
LATENCY_FIGURES = re.compile(r"(\d+) client\(s\): p50\s+([\d.]+) ms\s+p95\s+([\d.]+) ms")


def setup_django(data_dir: Path, database_url: str) -> dict[str, str]:
    env = {
        "DJANGO_SETTINGS_MODULE": "config.settings", "CTXLENS_DATA_DIR": str(data_dir),
        "DATABASE_URL": database_url, "DEBUG": "0", "LOG_LEVEL": "WARNING",
        "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
    }
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("collectstatic", interactive=False, verbosity=0)  # pages render with DEBUG off
    return {**os.environ, **env}


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    position = p * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# --- 1. latency ---------------------------------------------------------------------------

def turn_body(conversation_id: str) -> bytes:
    """One agent turn recorded by the OTel SDK and encoded as an OTLP protobuf request."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from pipeline import semconv as sc

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("bench.live")
    with tracer.start_as_current_span("invoke_agent bench", attributes={
        "gen_ai.operation.name": "invoke_agent", sc.CONVERSATION_ID: conversation_id,
        sc.ROUND_USER_MESSAGE: "How is the weather?", sc.ROUND_FINAL_ANSWER: "Sunny.",
    }):
        with tracer.start_as_current_span("chat gpt-4o", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
            "gen_ai.usage.input_tokens": 900, "gen_ai.usage.output_tokens": 40,
            sc.CONTEXT_WINDOW: 128_000, sc.CONTEXT_COMPOSITION: json.dumps({"system": 300, "user": 600}),
        }):
            pass
        with tracer.start_as_current_span("execute_tool get_weather", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather",
            "gen_ai.tool.call.id": "call_1", "gen_ai.tool.call.result": "sunny", sc.TOOL_OBSERVATION_TOKENS: 2,
        }):
            pass
    provider.shutdown()
    return encode_spans(memory.get_finished_spans()).SerializeToString()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(env: dict[str, str], port: int) -> subprocess.Popen:
    """uvicorn serving this checkout, as `make run` does."""
    import httpx

    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1",
                               "--port", str(port), "--lifespan", "off", "--ws-per-message-deflate", "false",
                               "--log-level", "warning"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit("uvicorn did not start")


def server_usage(pid: int) -> tuple[float, float]:
    """(CPU seconds, peak RSS in MB) of the server process so far (bench/ingest.py reads /proc)."""
    from bench.ingest import cpu_seconds, peak_rss_mb

    return cpu_seconds(pid), peak_rss_mb(pid)


def credentials() -> tuple[str, str]:
    """(session cookie of a dashboard user, ingest key)."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from pipeline.models import ApiKey

    user, _ = get_user_model().objects.get_or_create(username="bench")
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value, ApiKey.generate("bench")[1]


def background_bodies(spans_per_s: int, seconds: float) -> list[tuple[bytes, int]]:
    """The team's standard load (../shared/bench/otlp_load.py), enough of it for `seconds`."""
    from bench.ingest import load_generator

    load = load_generator()
    requests = load.build_requests(int(spans_per_s * seconds), 100, run_id=f"live-{os.getpid()}")
    return [(r.SerializeToString(), sum(len(ss.spans) for rs in r.resource_spans for ss in rs.scope_spans))
            for r in requests]


async def send_background(port: int, key: str, bodies: list[tuple[bytes, int]], spans_per_s: int,
                          stop: asyncio.Event) -> tuple[int, float]:
    """POST `bodies` at `spans_per_s` (several in flight when the server lags) until `stop`;
    (spans accepted, seconds)."""
    import httpx

    accepted, in_flight = [0], set()
    started = next_at = time.perf_counter()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        async def post(body: bytes, spans: int) -> None:
            reply = await http.post("/v1/traces", content=body, headers={
                "Content-Type": "application/x-protobuf", "Authorization": f"Bearer {key}"})
            if reply.is_success:
                accepted[0] += spans

        for body, spans in itertools.cycle(bodies):  # re-sent bodies are stored once: enough warns below
            if stop.is_set():
                break
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            next_at += spans / spans_per_s
            if len(in_flight) >= 16:
                await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            task = asyncio.create_task(post(body, spans))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        if in_flight:
            await asyncio.wait(in_flight)
    return accepted[0], time.perf_counter() - started


async def _latency(port: int, clients: int, posts: int, session: str, key: str,
                   background: list[tuple[bytes, int]] | None = None, spans_per_s: int = 0) -> list[float]:
    import httpx
    import websockets
    from asgiref.sync import sync_to_async

    from pipeline.models import Conversation

    # Per client, when each conversation id was first named: kept as messages arrive, so that
    # waiting for a sample costs O(clients), not a scan of every message received so far.
    first_named: list[dict[int, float]] = [{} for _ in range(clients)]
    headers = {"Cookie": f"sessionid={session}", "Origin": f"http://127.0.0.1:{port}"}
    sockets = [await websockets.connect(f"ws://127.0.0.1:{port}/ws/live/", additional_headers=headers)
               for _ in range(clients)]
    for ws in sockets:
        assert json.loads(await ws.recv())["type"] == "hello"

    messages = [0]

    async def listen(i: int, ws) -> None:
        async for raw in ws:
            arrived = time.perf_counter()
            messages[0] += 1
            for pk in json.loads(raw).get("new_conversation_ids", ()):
                first_named[i].setdefault(pk, arrived)

    listening = time.perf_counter()
    listeners = [asyncio.create_task(listen(i, ws)) for i, ws in enumerate(sockets)]
    bodies = [(f"bench-live-{uuid.uuid4().hex}", None) for _ in range(posts)]
    bodies = [(cid, turn_body(cid)) for cid, _ in bodies]
    samples: list[float] = []
    pk_of = sync_to_async(lambda cid: Conversation.objects.get(external_id=cid).pk)
    stop = asyncio.Event()
    loading = asyncio.create_task(send_background(port, key, background, spans_per_s, stop)) if background else None
    if loading:
        await asyncio.sleep(2)  # the load running before the first sample
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        for conversation_id, body in bodies:
            started = time.perf_counter()
            reply = await http.post("/v1/traces", content=body, headers={
                "Content-Type": "application/x-protobuf", "Authorization": f"Bearer {key}"})
            reply.raise_for_status()
            pk = await pk_of(conversation_id)
            deadline = time.perf_counter() + 5
            while time.perf_counter() < deadline:
                firsts = [seen.get(pk) for seen in first_named]
                if all(firsts):
                    samples.extend(t - started for t in firsts)
                    break
                await asyncio.sleep(0.002)
            else:
                print(f"  a client missed conversation {pk}", file=sys.stderr)
            # Wider than the live interval, and at a random phase of the background load's frames.
            await asyncio.sleep(0.4 + random.random() * 0.25)
    if loading:
        stop.set()
        accepted, seconds = await loading
        if accepted > sum(spans for _, spans in background):
            print("  (the load ran out of new spans and re-sent some, which cost the server less)")
        print(f"  background ingest: {accepted:,} spans accepted in {seconds:.1f} s = {accepted / seconds:,.0f} "
              f"spans/s (asked {spans_per_s:,})")
    print(f"  {messages[0] / clients / (time.perf_counter() - listening):.1f} messages per client per second")
    for task in listeners:
        task.cancel()
    for ws in sockets:
        await ws.close()
    return samples


def measure_latency(env: dict[str, str], clients: int, posts: int, spans_per_s: int = 0) -> list[float]:
    session, key = credentials()
    # As long as the samples take (each 0.40-0.65 s apart plus its latency), and the warm-up,
    # with room to spare.
    background = background_bodies(spans_per_s, posts * 0.9 + 10) if spans_per_s else None
    port = free_port()
    server = start_server(env, port)
    try:
        cpu, started = server_usage(server.pid)[0], time.perf_counter()
        samples = asyncio.run(_latency(port, clients, posts, session, key, background, spans_per_s))
        # Less noisy than the latencies on a shared machine: what the server itself spent.
        cpu_after, rss = server_usage(server.pid)
        print(f"  server CPU {(cpu_after - cpu) / (time.perf_counter() - started):.0%} of a core, peak RSS {rss:.0f} MB")
        return samples
    finally:
        server.terminate()
        server.wait()


# --- 2. page time with many spans ---------------------------------------------------------

def populate(total_spans: int) -> int:
    """Conversations of 5 rounds; a round is 10 spans: the turn, 2 LLM calls, 3 tool calls, 4 others.

    Spread over the last 30 days, so the 24-hour window of the overview holds about 1/30 of it.
    Returns the id of a conversation active in the last hour.
    """
    from django.db import transaction

    from django.db.models import Max

    from pipeline.models import CompressionEvent, Conversation, LLMCall, Round, Span, ToolCall

    composition = {"system": 1500, "skills": 800, "user": 900, "assistant": 1200, "tool_observations": 9000}
    conversations = max(1, total_spans // 50)
    now = datetime.now(timezone.utc)
    fast_writes()
    # Ids continue after what is stored already (the latency part's conversations).
    base = Conversation.objects.aggregate(m=Max("id"))["m"] or 0
    n_round = Round.objects.aggregate(m=Max("id"))["m"] or 0
    n_llm = LLMCall.objects.aggregate(m=Max("id"))["m"] or 0
    for first in range(0, conversations, 1000):
        batch = range(base + first, base + min(first + 1000, conversations))
        conv_rows, round_rows, llm_rows, tool_rows, span_rows, comp_rows = [], [], [], [], [], []
        for c in batch:
            start = now - timedelta(days=30) * (1 - (c - base + 1) / conversations)
            conv_rows.append(dict(id=c + 1, external_id=f"conv-{c}", title=f"Conversation {c}", model="gpt-4o",
                                  status="ok", started_at=start, last_activity_at=start + timedelta(minutes=5),
                                  round_count=5, llm_call_count=10, tool_call_count=15, input_tokens=134_000,
                                  output_tokens=2000, created_at=start))
            for r in range(5):
                n_round += 1
                trace = f"{c:024x}{r:08x}"
                at = start + timedelta(minutes=r)
                round_rows.append(dict(id=n_round, conversation_id=c + 1, key=f"{trace}:root", trace_id=trace,
                                       user_message="question", final_answer="answer", status="ok", started_at=at,
                                       ended_at=at + timedelta(seconds=30), duration_ms=30_000.0,
                                       llm_call_count=2, tool_call_count=3, input_tokens=26_800, output_tokens=400))
                span_rows.append(dict(trace_id=trace, span_id=f"{0:016x}", name="invoke_agent", kind="agent",
                                      start_time=at, conversation_id=c + 1, received_at=at))
                for i in range(2):
                    n_llm += 1
                    t = at + timedelta(seconds=10 * i)
                    llm_rows.append(dict(id=n_llm, conversation_id=c + 1, round_id=n_round, trace_id=trace,
                                         span_id=f"{1 + i:016x}", started_at=t, duration_ms=900.0, model="gpt-4o",
                                         input_tokens=13_400, output_tokens=200, context_window=128_000,
                                         context_tokens=13_400, context_composition=composition))
                    span_rows.append(dict(trace_id=trace, span_id=f"{1 + i:016x}", name="chat gpt-4o", kind="llm",
                                          start_time=t, conversation_id=c + 1, received_at=t))
                for i in range(3):
                    t = at + timedelta(seconds=3 + 10 * i)
                    ok = (c + r + i) % 17 != 0
                    tool_rows.append(dict(conversation_id=c + 1, round_id=n_round, trace_id=trace,
                                          span_id=f"{3 + i:016x}", started_at=t, duration_ms=float(20 + (c * 7 + i * 13) % 900),
                                          tool_name=("get_weather", "web_search", "query_sales")[i],
                                          arguments={"q": "x"}, observation="result " * 20, observation_tokens=40,
                                          success=ok, status="ok" if ok else "error",
                                          error_type="" if ok else "timeout", retry_count=0 if ok else 1))
                    span_rows.append(dict(trace_id=trace, span_id=f"{3 + i:016x}", name="execute_tool", kind="tool",
                                          start_time=t, conversation_id=c + 1, received_at=t))
                for i in range(4):
                    t = at + timedelta(seconds=1 + i)
                    span_rows.append(dict(trace_id=trace, span_id=f"{6 + i:016x}", name="chain", kind="chain",
                                          start_time=t, conversation_id=c + 1, received_at=t))
            comp_rows.append(dict(conversation_id=c + 1, round_id=n_round, trace_id=f"{c:024x}{4:08x}",
                                  span_id=f"{99:016x}", strategy="extract", occurred_at=start + timedelta(minutes=4),
                                  messages_before=40, messages_after=12, tokens_before=110_000, tokens_after=60_000))
        with transaction.atomic():
            for model, rows in ((Conversation, conv_rows), (Round, round_rows), (LLMCall, llm_rows),
                                (ToolCall, tool_rows), (Span, span_rows), (CompressionEvent, comp_rows)):
                bulk_insert(model, rows)
    reset_sequences(Conversation, Round, LLMCall)
    analyze()  # the planner sees the real sizes
    return base + conversations  # the newest conversation: active in the last hour


def ensure_populated(total_spans: int) -> tuple[int, str]:
    """(the newest conversation's id, what was done): the rows, and their rollups when this
    checkout keeps rollups and they are not built yet."""
    from pipeline.models import Conversation, Span

    started = time.perf_counter()
    if Span.objects.count() >= total_spans:  # a kept database (--keep) already holds them
        newest = Conversation.objects.order_by("-started_at").values_list("pk", flat=True)[0]
        done = f"reused {Span.objects.count():,} stored spans"
    else:
        newest = populate(total_spans)
        done = f"stored {Span.objects.count():,} spans in {time.perf_counter() - started:.0f} s (bulk insert)"
    try:
        from pipeline.models import Rollup
        from pipeline.rollups.compact import rebuild_rollups
    except ImportError:  # a tree before rollups
        return newest, done
    if not Rollup.objects.exists():
        started = time.perf_counter()
        rows = rebuild_rollups()
        analyze(Rollup._meta.db_table)
        done += f"; built {rows:,} rollup rows in {time.perf_counter() - started:.0f} s"
    return newest, done


def measure_pages(total_spans: int, repeat: int, verbose: bool = False) -> list[str]:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    newest, done = ensure_populated(total_spans)
    lines = [done]
    client = Client()
    client.force_login(get_user_model().objects.get_or_create(username="bench-pages")[0])
    pages = {
        "overview (24 h window)": "/",
        "overview (all time)": "/?window=all",
        "conversation (5 turns, 50 spans)": f"/conversations/{newest}/",
        "conversation live fragments": f"/fragments/conversations/{newest}/?rounds=1",
        "conversations list": "/conversations/",
        "tools (24 h window)": "/tools/",
    }
    for name, url in pages.items():
        assert client.get(url).status_code == 200, url  # warm caches
        timings = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            response = client.get(url)
            timings.append(time.perf_counter() - t0)
            assert response.status_code == 200
        with CaptureQueriesContext(connection) as captured:
            client.get(url)
        scans = full_scans(captured.captured_queries)
        slowest = max(captured.captured_queries, key=lambda q: float(q["time"]))
        lines.append(f"{name:<36} p50 {percentile(timings, .5) * 1000:7.1f} ms  p95 "
                     f"{percentile(timings, .95) * 1000:7.1f} ms  {len(captured.captured_queries):>2} queries"
                     f"{'' if not scans else f'  FULL SCANS: {len(scans)}'}")
        if verbose:
            lines.append(f"    slowest query {float(slowest['time']) * 1000:.1f} ms: {slowest['sql'][:300]}")
        lines.extend(f"    {scan}" for scan in scans)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("latency", "pages", "all"), default="all")
    parser.add_argument("--samples", type=int, default=40, help="OTLP posts per client count")
    parser.add_argument("--clients", default="1,50", help="comma-separated websocket client counts")
    parser.add_argument("--load", type=int, default=0, metavar="SPANS_PER_S",
                        help="ingest the standard load at this rate while sampling (e.g. 1000)")
    parser.add_argument("--spans", type=int, default=1_000_000, help="stored spans for the page timings")
    parser.add_argument("--repeat", type=int, default=20, help="renders of each page")
    parser.add_argument("--keep", metavar="DIR", help="keep (and reuse) the database in DIR instead of a temp dir")
    parser.add_argument("--verbose", action="store_true", help="print each page's slowest query")
    parser.add_argument("--base", metavar="COMMIT", help="also measure COMMIT's tree: the pages first, on the same "
                                                         "database; the latency in alternating rounds")
    parser.add_argument("--rounds", type=int, default=2, help="with --base: latency rounds of each side")
    args = parser.parse_args()
    if args.base and args.part != "latency" and engine_name() != "SQLite":
        parser.error("--base measures the pages on SQLite only: the base commit's bench/live.py builds its own "
                     "SQLite database (the latency part compares on PostgreSQL too)")
    print(f"# {reproduce_prefix()}.venv/bin/python bench/live.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}".rstrip())
    print(f"# {os.cpu_count()} CPUs shared with other engineers' work while measuring: treat as noisy upper bounds")
    print(f"# {engine_name()}")
    with tempfile.TemporaryDirectory(prefix="ctxlens-bench-live-") as tmp:
        if args.keep:
            Path(args.keep).mkdir(parents=True, exist_ok=True)
        with bench_database(Path(args.keep or tmp), keep=args.keep) as database_url:
            run(args, Path(args.keep or tmp), database_url)


def latency_line(samples: list[float], clients: int, load: int) -> str:
    under = f" under {load:,} spans/s" if load else ""
    return (f"OTLP POST -> websocket message{under}, {clients:>2} client(s): p50 {percentile(samples, .5) * 1000:6.1f} ms"
            f"  p95 {percentile(samples, .95) * 1000:6.1f} ms  (mean {statistics.mean(samples) * 1000:.1f} ms,"
            f" {len(samples)} deliveries)")


def compare_latency(args: argparse.Namespace) -> None:
    """The latency of the base commit's tree and of this checkout, each run as this bench's latency
    part in a process of its own (its own server and database), in alternating rounds and order
    (base, this, this, base, …: one slow spell of a shared machine lands on both sides), then the
    ratios of the sides' median figures."""
    from bench.ingest import LOAD_SCRIPT

    command = [sys.executable, "bench/live.py", "--part", "latency", "--clients", args.clients,
               "--samples", str(args.samples), "--load", str(args.load)]
    figures: dict[tuple[str, int], list[tuple[float, float]]] = {}
    with checkout(args.base) as base:
        trees = {f"base {short(args.base)}": base, "this checkout": ROOT}
        for round_ in range(args.rounds):
            for side in (list(trees) if round_ % 2 == 0 else list(trees)[::-1]):
                print(f"## round {round_ + 1}: {side}", flush=True)
                done = subprocess.run(command, cwd=trees[side], env={**os.environ, "CTXLENS_OTLP_LOAD": str(LOAD_SCRIPT)},
                                      check=True, stdout=subprocess.PIPE, text=True)
                for line in done.stdout.splitlines():
                    if not line.startswith("#"):  # its command and machine are this run's
                        print(line, flush=True)
                    if found := LATENCY_FIGURES.search(line):
                        figures.setdefault((side, int(found[1])), []).append((float(found[2]), float(found[3])))
    (before, after) = trees
    for clients in (int(c) for c in args.clients.split(",")):
        if not figures.get((before, clients)) or not figures.get((after, clients)):
            print(f"{clients} client(s): no figure from one of the sides", file=sys.stderr)
            continue
        (base_p50, base_p95), (p50, p95) = (
            [statistics.median(figure) for figure in zip(*figures[side, clients])] for side in (before, after))
        print(f"{clients} client(s), medians of {args.rounds} rounds each: {before} p50 {base_p50:.1f} ms p95 "
              f"{base_p95:.1f} ms; {after} p50 {p50:.1f} ms p95 {p95:.1f} ms; this/base p50 {p50 / base_p50:.2f}x "
              f"p95 {p95 / base_p95:.2f}x")


def run(args: argparse.Namespace, tmp: Path, database_url: str) -> None:
    env = setup_django(tmp, database_url)
    if args.part in ("latency", "all"):
        if args.base:
            compare_latency(args)
        else:
            for clients in (int(c) for c in args.clients.split(",")):
                print(latency_line(measure_latency(env, clients, args.samples, args.load), clients, args.load))
    if args.part in ("pages", "all"):
        if args.base:
            print(ensure_populated(args.spans)[1])
            print(f"## base {short(args.base)}", flush=True)
            with checkout(args.base) as base:
                # each tree renders with its own static files' manifest (DEBUG off)
                subprocess.run([sys.executable, "manage.py", "collectstatic", "--no-input", "--verbosity", "0"],
                               cwd=base, env=env, check=True)
                subprocess.run([sys.executable, "bench/live.py", "--part", "pages", "--spans", str(args.spans),
                                "--repeat", str(args.repeat), "--keep", str(tmp)]
                               + (["--verbose"] if args.verbose else []), cwd=base, check=True)
            print("## this checkout", flush=True)
            subprocess.run([sys.executable, "manage.py", "collectstatic", "--no-input", "--verbosity", "0"],
                           cwd=ROOT, env=env, check=True)
        for line in measure_pages(args.spans, args.repeat, args.verbose):
            print(line)


if __name__ == "__main__":
    main()
