"""Does a batch cost the same at the end of a long trace as at its start? (issue 13, item 3)

One trace — one conversation, one turn — of SPANS spans (an agent root and alternating LLM and
tool spans: each LLM call asks for the next tool by its call id, the last one answers; OpenInference
attributes as the team's load generator writes them, session.id on every span), sent in order in
BATCHES OTLP/protobuf requests, one at a time, to uvicorn serving a fresh SQLite database as
`make run` does. After each request the bench waits until nothing is pending (deferred token
counts included), so each batch's server CPU (all threads, from /proc) is the whole cost of
storing it. It prints the median over a few batches at each end (the very first request, which
loads code and tokenizers, is left out) and their ratio; the target is last ≤ 1.5 × first.

The machine is shared, so a busier minute at either end moves that ratio. As a control, the
first batches of a second trace of the same shape are sent in between the last batches of the
long one: "last/new trace" compares batches measured in the same minutes, on the same (grown)
database, and isolates what the trace's length costs.

With --base, the same run against another commit first (a temporary git worktree), so the two
are measured back to back on the same machine.

    .venv/bin/python bench/ingest_linear.py [--spans 20000] [--batches 200] [--ends 5] [--base <commit>]
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1 import trace_pb2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from ingest import free_port, load_generator, manage, start_server  # noqa: E402
from trees import checkout, short  # noqa: E402

PROTOBUF = "application/x-protobuf"


def long_trace(spans: int, seed: int = 13) -> list[trace_pb2.Span]:
    """The spans of one ReAct turn, children in time order and the root last (as exported)."""
    load = load_generator()
    rng, ids = random.Random(seed), random.Random(f"{seed}/{time.time_ns()}")
    trace_id, root_id = ids.getrandbits(128).to_bytes(16, "big"), ids.getrandbits(64).to_bytes(8, "big")
    session = f"linear-{os.getpid()}-{seed}"
    start = time.time_ns() - 6 * 3600 * 10**9
    t, out = start + 10**6, []
    question = load._text(rng, 300)
    children = spans - 1
    for i in range(children):
        span_id = ids.getrandbits(64).to_bytes(8, "big")
        call_id = f"call_{i // 2:07d}"
        if i % 2 == 0:
            answer = load._text(rng, rng.randint(200, 600))
            prompt = load._text(rng, 1500)
            attrs = {
                "openinference.span.kind": "LLM", "llm.system": "openai", "llm.model_name": "gpt-4o-mini",
                "llm.input_messages.0.message.role": "system", "llm.input_messages.0.message.content": prompt,
                "llm.input_messages.1.message.role": "user", "llm.input_messages.1.message.content": question,
                "llm.output_messages.0.message.role": "assistant",
                "llm.output_messages.0.message.content": answer,
                "llm.token_count.prompt": len(prompt) // 4, "llm.token_count.completion": len(answer) // 4,
                "session.id": session,
            }
            if i + 1 < children:  # ask for the next tool; the last call answers
                attrs["llm.output_messages.0.message.tool_calls.0.tool_call.id"] = call_id
                attrs["llm.output_messages.0.message.tool_calls.0.tool_call.function.name"] = "web_search"
                attrs["llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments"] = (
                    f'{{"query": "step {i}"}}')
            name, duration = "ChatCompletion gpt-4o-mini", rng.randint(300, 2000) * 10**6
        else:
            attrs = {
                "openinference.span.kind": "TOOL", "tool.name": "web_search", "tool_call.id": call_id,
                "input.value": f'{{"query": "step {i - 1}"}}', "output.value": load._text(rng, rng.randint(300, 900)),
                "session.id": session,
            }
            name, duration = "execute_tool web_search", rng.randint(5, 500) * 10**6
        out.append(load._span(trace_id, span_id, root_id, name, trace_pb2.Span.SPAN_KIND_INTERNAL, t, t + duration,
                              attrs))
        t += duration + 10**6
    out.append(load._span(trace_id, root_id, b"", "invoke_agent linear-agent", trace_pb2.Span.SPAN_KIND_INTERNAL,
                          start, t + 10**6, {"openinference.span.kind": "AGENT", "session.id": session,
                                             "input.value": question, "agent.name": "linear-agent"}))
    return out


def bodies(spans: list[trace_pb2.Span], batches: int) -> list[bytes]:
    size = -(-len(spans) // batches)
    out = []
    for i in range(0, len(spans), size):
        request = ExportTraceServiceRequest()
        scope = request.resource_spans.add()
        scope.resource.attributes.add(key="service.name").value.string_value = "linear-bench"
        scope.scope_spans.add().spans.extend(spans[i:i + size])
        out.append(request.SerializeToString())
    return out


@dataclass
class Batch:
    cpu: float  # server CPU seconds, until nothing was pending
    request: float  # seconds until the reply


def cpu_seconds(pid: int) -> float:
    """CPU time of the process's threads, in nanoseconds from the scheduler (/proc/<pid>/stat
    counts in 10 ms ticks, too coarse for one batch)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):  # the thread ended meanwhile
            continue
    return total / 1e9


def pending(database: Path) -> int:
    with sqlite3.connect(database, timeout=30) as db:
        return sum(db.execute(f"SELECT COUNT(*) FROM {table} WHERE tokens_pending").fetchone()[0]
                   for table in ("pipeline_llmcall", "pipeline_toolcall"))


def measure(tree: Path, payloads: list[bytes], control: list[bytes]) -> tuple[list[Batch], list[Batch]]:
    """Each batch's cost against a fresh database and a uvicorn serving `tree`; the `control`
    batches go in between the last ones of `payloads`."""
    with tempfile.TemporaryDirectory(prefix="ctxlens-linear-") as data:
        database = Path(data) / "bench.sqlite3"
        env = {**os.environ, "DATABASE_URL": f"sqlite:///{database}", "CTXLENS_DATA_DIR": data, "DEBUG": "0",
               "LOG_LEVEL": "WARNING"}
        env.pop("REDIS_URL", None)
        manage(env, "migrate", "--no-input", tree=tree)
        key = manage(env, "create_api_key", "bench", tree=tree).strip().splitlines()[-1].split()[-1]
        port = free_port()
        server = start_server(env, port, tree=tree)
        out: list[Batch] = []
        between: list[Batch] = []
        try:
            with httpx.Client(timeout=600, headers={"Authorization": f"Bearer {key}", "Content-Type": PROTOBUF}) as client:
                def send(body: bytes) -> Batch:
                    cpu = cpu_seconds(server.pid)
                    began = time.perf_counter()
                    reply = client.post(f"http://127.0.0.1:{port}/v1/traces", content=body)
                    replied = time.perf_counter() - began
                    if reply.status_code != 200:
                        raise SystemExit(f"the server answered {reply.status_code}: {reply.text[:200]}")
                    while pending(database):
                        time.sleep(0.002)
                    return Batch(cpu_seconds(server.pid) - cpu, replied)

                interleave = len(payloads) - len(control)
                for number, body in enumerate(payloads):
                    out.append(send(body))
                    if number >= interleave:
                        between.append(send(control[number - interleave]))
        finally:
            server.terminate()
            server.wait(10)
        return out, between


def median(part: list[Batch]) -> Batch:
    """The median batch, CPU and request time apart."""
    return Batch(statistics.median(b.cpu for b in part), statistics.median(b.request for b in part))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--ends", type=int, default=5, help="batches at each end whose median is compared")
    parser.add_argument("--base", help="a commit to measure first, back to back with this checkout")
    args = parser.parse_args()
    payloads = bodies(long_trace(args.spans), args.batches)
    control = bodies(long_trace(args.spans, seed=31), args.batches)[:args.ends]
    results: dict[str, tuple[list[Batch], list[Batch]]] = {}
    if args.base:
        with checkout(args.base) as base:
            results[f"base {short(args.base)}"] = measure(base, payloads, control)
    results["this checkout"] = measure(ROOT, payloads, control)

    print(f"one trace of {args.spans} spans in {len(payloads)} requests, one at a time; server CPU per batch "
          f"(median of {args.ends} batches at each end, the first request left out; 'new trace': the first "
          f"{args.ends} batches of another trace, sent in between the last ones)")
    lasts = {}
    for name, (batches, between) in results.items():
        first, last, fresh = median(batches[1:1 + args.ends]), median(batches[-args.ends:]), median(between)
        lasts[name] = last
        print(f"  {name:>16}: first {first.cpu * 1000:7.1f} ms CPU ({first.request * 1000:6.1f} ms request), "
              f"last {last.cpu * 1000:7.1f} ms CPU ({last.request * 1000:6.1f} ms request), "
              f"new trace {fresh.cpu * 1000:6.1f} ms CPU")
        print(f"  {'':>16}  last/first {last.cpu / first.cpu:.2f}x CPU ({last.request / first.request:.2f}x request), "
              f"last/new trace {last.cpu / fresh.cpu:.2f}x CPU")
    if args.base:
        base, this = lasts[f"base {short(args.base)}"], lasts["this checkout"]
        print(f"  last batch, base/this: {base.cpu / this.cpu:.1f}x CPU, {base.request / this.request:.1f}x request")
    print(f"reproduce: .venv/bin/python bench/ingest_linear.py --spans {args.spans} --batches {args.batches} "
          f"--ends {args.ends}" + (f" --base {args.base}" if args.base else ""))


if __name__ == "__main__":
    main()
