"""OTLP ingest throughput: spans/s persisted and queryable, request latency, lag, server RSS.

Starts the app under uvicorn (as `make run` does) on a fresh temporary SQLite database — or on
DATABASE_URL when it is set (e.g. PostgreSQL) — creates an ingest key, and drives the team's
standard load (../shared/bench/otlp_load.py beside the repository, or CTXLENS_OTLP_LOAD): OTLP
protobuf batches of 100 agent spans (~3.5 KB each) from 4 concurrent senders. "Queryable" means every span is committed and no
row is still waiting for its deferred token counts (tokens_pending); the lag is the time from
the last response until then.

    .venv/bin/python bench/ingest.py [--spans 20000] [--batch 100] [--concurrency 4] [--gzip] [--json]
    .venv/bin/python bench/ingest.py --base <commit> [--rounds 3]   # that commit and this checkout, alternating
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/ctxlens_bench .venv/bin/python bench/ingest.py
    DATABASE_URL=postgres://… REDIS_URL=redis://127.0.0.1:6379/0 .venv/bin/python bench/ingest.py --workers 2

With --workers N > 1, uvicorn runs N worker processes (the scale path: PostgreSQL and Redis);
CPU and peak RSS are then summed over the workers. With --base, the same load also runs against
another commit (a temporary git worktree, served the same way, on its own fresh SQLite file),
in alternating rounds (base, this, base, this, …; --rounds, 3 by default), each on a fresh
database: on a shared machine one slow spell then lands on both sides, not on one. Each side's
round of median CPU per span is reported, the ratios this/base of those two rounds, every
round's CPU and throughput, the range of the per-round CPU and throughput ratios, and the ratio
of the two sides' mean throughputs (which no single slow round decides).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import NamedTuple

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from trees import checkout, short  # noqa: E402


def default_load_script(root: Path = ROOT) -> Path:
    """The team's load generator, in the shared directory beside the repository (../shared), so
    the benchmark runs from any checkout without an absolute path."""
    return root.parent / "shared" / "bench" / "otlp_load.py"


LOAD_SCRIPT = Path(os.environ.get("CTXLENS_OTLP_LOAD") or default_load_script())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def load_generator():
    spec = importlib.util.spec_from_file_location("otlp_load", LOAD_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def manage(env: dict[str, str], *args: str, tree: Path = ROOT) -> str:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=tree, env=env, check=True,
                          capture_output=True, text=True).stdout


def start_server(env: dict[str, str], port: int, workers: int = 1, tree: Path = ROOT) -> subprocess.Popen:
    """uvicorn serving the code in `tree`, as `make run` does."""
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port),
         "--lifespan", "off", "--log-level", "warning", *(["--workers", str(workers)] if workers > 1 else [])],
        cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit("the server did not start")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """The server and its worker processes (uvicorn --workers forks them from a supervisor)."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                children.append(int(entry.name))
    return [pid, *children]


def tree_cpu_seconds(pid: int) -> float:
    return sum(cpu_seconds(p) for p in process_tree(pid))


def tree_peak_rss_mb(pid: int) -> float:
    return sum(peak_rss_mb(p) for p in process_tree(pid))


def queryable(database_url: str) -> tuple[int, int]:
    """(spans stored, LLM/tool rows still pending), read from the bench database directly."""
    queries = ("SELECT COUNT(*) FROM pipeline_span", "SELECT COUNT(*) FROM pipeline_llmcall WHERE tokens_pending",
               "SELECT COUNT(*) FROM pipeline_toolcall WHERE tokens_pending")
    if database_url.startswith("sqlite:///"):
        with sqlite3.connect(database_url.removeprefix("sqlite:///"), timeout=30) as db:
            stored, llm, tool = (db.execute(q).fetchone()[0] for q in queries)
    else:
        import psycopg

        with psycopg.connect(database_url) as db:
            stored, llm, tool = (db.execute(q).fetchone()[0] for q in queries)
    return stored, llm + tool


class Run(NamedTuple):
    """What one server did with the load."""

    result: dict
    stored: int
    pending: int
    elapsed: float  # first request until everything queryable
    lag: float  # last response until everything queryable
    rss: float
    cpu: float

    @property
    def throughput(self) -> float:
        return self.stored / self.elapsed

    @property
    def cpu_per_span(self) -> float:
        return self.cpu / max(1, self.stored) * 1e6


def measure(tree: Path, bodies: list[bytes], counts: list[int], args: argparse.Namespace,
            around_load: Callable[[], AbstractContextManager] = nullcontext) -> Run:
    """Serve the code in `tree` on a fresh database (DATABASE_URL, else a temporary SQLite file)
    and send it the load; `around_load` is entered from the first request until all is queryable."""
    tmp = tempfile.TemporaryDirectory(prefix="ctxlens-bench-")
    database_url = os.environ.get("DATABASE_URL", "") or f"sqlite:///{tmp.name}/bench.sqlite3"
    env = {**os.environ, "DATABASE_URL": database_url, "CTXLENS_DATA_DIR": tmp.name, "DEBUG": "0",
           "LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
    manage(env, "migrate", "--no-input", tree=tree)
    if queryable(database_url)[0]:
        raise SystemExit("the database is not empty; point DATABASE_URL at a fresh database")
    key = manage(env, "create_api_key", "bench", tree=tree).strip().splitlines()[-1]
    port = free_port()
    server = start_server(env, port, args.workers, tree=tree)
    try:
        cpu_before = tree_cpu_seconds(server.pid)
        with around_load():
            started = time.perf_counter()
            result = load_generator().run_load(
                f"http://127.0.0.1:{port}/v1/traces", bodies, counts, args.concurrency, 600.0,
                "application/json" if args.json else "application/x-protobuf", args.gzip,
                extra_headers={"Authorization": f"Bearer {key}"})
            last_response = time.perf_counter()
            deadline = last_response + args.lag_timeout
            while True:
                stored, pending = queryable(database_url)
                if (stored >= result["spans_accepted"] and pending == 0) or time.perf_counter() > deadline:
                    break
                time.sleep(0.02)
            done = time.perf_counter()
        rss = tree_peak_rss_mb(server.pid)
        server_cpu = tree_cpu_seconds(server.pid) - cpu_before
    finally:
        server.terminate()
        server.wait(10)
        tmp.cleanup()
    return Run(result, stored, pending, done - started, done - last_response, rss, server_cpu)


def median_run(runs: list[Run]) -> Run:
    """The round whose CPU per span is the median (the lower middle one of an even count)."""
    return sorted(runs, key=lambda run: run.cpu_per_span)[(len(runs) - 1) // 2]


def report(run: Run, name: str = "") -> None:
    if name:
        print(f"-- {name}")
    result = run.result
    print(f"HTTP statuses      {result['http_status']}  exceptions {result['exceptions'] or 'none'}")
    print(f"stored             {run.stored} spans, {run.pending} rows still pending")
    print(f"throughput         {run.throughput:,.0f} spans/s persisted and queryable "
          f"({result['spans_per_s']:,.0f} spans/s acknowledged)")
    print(f"request latency    p50 {result['latency_ms']['p50']:.0f} ms, p95 {result['latency_ms']['p95']:.0f} ms")
    print(f"lag                {run.lag * 1000:.0f} ms from the last response until all queryable")
    print(f"server peak RSS    {run.rss:.0f} MB")
    print(f"server CPU         {run.cpu:.1f} s = {run.cpu_per_span:.0f} µs per span "
          f"(wall {run.elapsed:.1f} s; CPU shared with the load generator and other users)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spans", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--gzip", action="store_true")
    parser.add_argument("--json", action="store_true", help="OTLP/JSON instead of protobuf")
    parser.add_argument("--lag-timeout", type=float, default=120.0)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes (several: the scale path)")
    parser.add_argument("--base", help="a commit to measure in alternating rounds with this checkout (SQLite only)")
    parser.add_argument("--rounds", type=int, default=3, help="with --base: rounds of each (at least 1), alternating")
    args = parser.parse_args()
    given_url = os.environ.get("DATABASE_URL", "")
    if args.base and given_url:
        raise SystemExit("--base measures each commit on a fresh temporary SQLite database; unset DATABASE_URL")
    load = load_generator()
    t = time.perf_counter()
    requests = load.build_requests(args.spans, args.batch, run_id=f"bench-{os.getpid()}")
    bodies = [load.to_otlp_json(r) for r in requests] if args.json else [r.SerializeToString() for r in requests]
    raw_bytes = sum(map(len, bodies))
    if args.gzip:
        import gzip

        bodies = [gzip.compress(b, 6) for b in bodies]
    counts = [sum(len(ss.spans) for rs in r.resource_spans for ss in rs.scope_spans) for r in requests]
    print(f"built {len(bodies)} requests, {sum(counts)} spans, {raw_bytes / sum(counts):.0f} B/span "
          f"in {time.perf_counter() - t:.1f} s", file=sys.stderr)

    rounds: dict[str, list[Run]] = {}
    if args.base:
        base_name = f"base {short(args.base)}"
        with checkout(args.base) as base:
            for _ in range(max(1, args.rounds)):
                for name, tree in ((base_name, base), ("this checkout", ROOT)):
                    rounds.setdefault(name, []).append(measure(tree, bodies, counts, args))
    else:
        rounds["this checkout"] = [measure(ROOT, bodies, counts, args)]
    runs = {name: median_run(measured) for name, measured in rounds.items()}

    backend = "PostgreSQL" if given_url.startswith("postgres") else "SQLite"
    print(f"backend            {backend}{', Redis' if os.environ.get('REDIS_URL') else ''}, "
          f"uvicorn with {args.workers} worker process{'es' if args.workers > 1 else ''}")
    print(f"spans sent         {sum(counts)} in {len(bodies)} requests of {args.batch} "
          f"({'JSON' if args.json else 'protobuf'}{', gzip' if args.gzip else ''}), {args.concurrency} senders")
    for name, run in runs.items():
        report(run, name if args.base else "")
    if args.base:
        base, this = runs[base_name], runs["this checkout"]
        print(f"-- this checkout / base, the median-CPU rounds of {len(rounds[base_name])} alternating rounds each: "
              f"throughput {this.throughput / base.throughput:.2f}x, "
              f"server CPU per span {this.cpu_per_span / base.cpu_per_span:.2f}x, "
              f"peak RSS {this.rss / base.rss:.2f}x")
        for name, measured in rounds.items():
            print(f"   {name:16} CPU per span by round: "
                  + ", ".join(f"{r.cpu_per_span:.0f}" for r in measured) + " µs; throughput: "
                  + ", ".join(f"{r.throughput:,.0f}" for r in measured) + " spans/s")
        pairs = [t.cpu_per_span / b.cpu_per_span for b, t in zip(rounds[base_name], rounds["this checkout"])]
        print(f"   CPU per span this/base by round: {min(pairs):.2f}x to {max(pairs):.2f}x")
        # The median-CPU rounds above can each be a side's slow or fast spell; the means weigh every round.
        speeds = [t.throughput / b.throughput for b, t in zip(rounds[base_name], rounds["this checkout"])]
        means = [sum(r.throughput for r in rounds[name]) / len(rounds[name]) for name in (base_name, "this checkout")]
        print(f"   throughput this/base by round: {min(speeds):.2f}x to {max(speeds):.2f}x; "
              f"of the rounds' means: {means[1] / means[0]:.2f}x")
    redis_url = os.environ.get("REDIS_URL", "")
    print("reproduce          " + (f"DATABASE_URL={shlex.quote(given_url)} " if given_url else "")
          + (f"REDIS_URL={shlex.quote(redis_url)} " if redis_url else "")
          + f".venv/bin/python bench/ingest.py --spans {args.spans} --batch {args.batch} "
          f"--concurrency {args.concurrency}{' --gzip' if args.gzip else ''}{' --json' if args.json else ''}"
          + (f" --workers {args.workers}" if args.workers > 1 else "")
          + (f" --base {args.base} --rounds {max(1, args.rounds)}" if args.base else ""))
    ok = all(r.stored == sum(counts) and r.pending == 0 and r.result["http_errors"] == 0
             for measured in rounds.values() for r in measured)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
