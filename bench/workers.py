"""When do more uvicorn workers ingest faster? The standard load on PostgreSQL + Redis, 1 and 2 workers.

Runs bench/ingest.py's load (../shared/bench/otlp_load.py: 20,000 agent spans in OTLP protobuf
batches of 100 from 4 senders) against uvicorn with each worker count, each on a fresh
PostgreSQL database, and measures the CPU every part spends per span: the ctxlens workers,
PostgreSQL, Redis and the load generator. A simple model then says where more workers pay:

    one worker tops out at     1 core / (worker CPU per span)       a worker is one Python process
    the machine tops out at    C cores / (total CPU per span)       workers + PostgreSQL + Redis + load
    W workers reach about      min(W / worker CPU, C / total CPU)

So a second worker helps only once C / total > 1 / worker, i.e. on more than total / worker
cores, and W workers keep scaling while C >= W x total / worker. The model holds as long as
CPU per span stays flat as workers are added, which the run also shows.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/workers.py [--workers 1,2] [--spans 20000]

DATABASE_URL names a server and a database to connect to; each run creates (and drops) a
database of its own beside it.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from ingest import Run, cpu_seconds, load_generator, measure  # noqa: E402

SERVICES = {"postgres": "PostgreSQL", "redis-server": "Redis"}


class ServiceCpu:
    """CPU seconds spent by the PostgreSQL and Redis processes while it runs: /proc sampled every
    0.1 s, so a backend that exits between two samples loses at most 0.1 s of its CPU."""

    def __init__(self) -> None:
        self.start: dict[int, float] = {}
        self.last: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()

    @staticmethod
    def sample() -> dict[int, tuple[str, float]]:
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                name = (entry / "comm").read_text().strip()
                if name in SERVICES:
                    found[int(entry.name)] = (name, cpu_seconds(int(entry.name)))
            except OSError:  # exited meanwhile
                continue
        return found

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.last.update(self.sample())

    @contextmanager
    def running(self) -> Iterator[ServiceCpu]:
        self.start = {pid: cpu for pid, (_, cpu) in self.sample().items()}
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.last.update(self.sample())
            self._stop.set()
            thread.join()

    def seconds(self, name: str) -> float:
        return sum(cpu - self.start.get(pid, 0.0) for pid, (comm, cpu) in self.last.items() if comm == name)


class Measured:
    def __init__(self) -> None:
        self.services = ServiceCpu()
        self.load_cpu = 0.0

    @contextmanager
    def around_load(self) -> Iterator[None]:
        before = resource.getrusage(resource.RUSAGE_SELF)
        with self.services.running():
            yield
        after = resource.getrusage(resource.RUSAGE_SELF)
        self.load_cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


@contextmanager
def fresh_database(url: str, name: str) -> Iterator[str]:
    """A new database on the server `url` names; its URL while the block runs."""
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield urlsplit(url)._replace(path=f"/{name}").geturl()
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def per_span(seconds: float, run: Run) -> float:
    return seconds / max(1, run.stored) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--spans", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--lag-timeout", type=float, default=120.0)
    args = parser.parse_args()
    database_url, redis_url = os.environ.get("DATABASE_URL", ""), os.environ.get("REDIS_URL", "")
    if not database_url.startswith("postgres") or not redis_url:
        raise SystemExit("set DATABASE_URL to a PostgreSQL server and REDIS_URL: several workers need both")

    load = load_generator()
    requests = load.build_requests(args.spans, args.batch, run_id=f"workers-{os.getpid()}")
    bodies = [r.SerializeToString() for r in requests]
    counts = [sum(len(ss.spans) for rs in r.resource_spans for ss in rs.scope_spans) for r in requests]
    cores = os.cpu_count() or 1

    rows: dict[int, tuple[Run, Measured]] = {}
    for workers in (int(w) for w in args.workers.split(",")):
        run_args = argparse.Namespace(json=False, gzip=False, concurrency=args.concurrency, workers=workers,
                                      lag_timeout=args.lag_timeout)
        measured = Measured()
        with fresh_database(database_url, f"ctxlens_workers_{os.getpid()}_{workers}") as url:
            os.environ["DATABASE_URL"] = url
            try:
                rows[workers] = (measure(ROOT, bodies, counts, run_args, measured.around_load), measured)
            finally:
                os.environ["DATABASE_URL"] = database_url
        time.sleep(1)

    print(f"PostgreSQL + Redis, {cores} cores, {sum(counts)} spans in {len(bodies)} protobuf requests of "
          f"{args.batch}, {args.concurrency} senders")
    print("workers  spans/s   CPU µs per span: workers  PostgreSQL  Redis  load gen  total   peak RSS")
    model: dict[int, tuple[float, float]] = {}
    for workers, (run, measured) in rows.items():
        server = per_span(run.cpu, run)
        pg = per_span(measured.services.seconds("postgres"), run)
        rds = per_span(measured.services.seconds("redis-server"), run)
        gen = per_span(measured.load_cpu, run)
        total = server + pg + rds + gen
        model[workers] = (server, total)
        ok = "" if run.stored == sum(counts) and run.pending == 0 else f"  (stored {run.stored}, pending {run.pending})"
        print(f"{workers:>7}  {run.throughput:>7,.0f}  {server:>22,.0f}  {pg:>10,.0f}  {rds:>5,.0f}  {gen:>8,.0f}  "
              f"{total:>5,.0f}  {run.rss:>6,.0f} MB{ok}")
    first, *others = list(rows)
    for workers in others:
        (r1, _), (rw, _) = rows[first], rows[workers]
        print(f"{workers} workers / {first}: throughput {rw.throughput / r1.throughput:.2f}x, "
              f"worker CPU per span {rw.cpu_per_span / r1.cpu_per_span:.2f}x")
    server, total = model[first]
    one_worker, machine = 1e6 / server, cores * 1e6 / total
    gain = min(2 * one_worker, machine) / min(one_worker, machine)
    print(f"model (CPU per span of the {first}-worker run): one worker tops out near {one_worker:,.0f} spans/s, "
          f"this machine's {cores} cores near {machine:,.0f} spans/s, so a second worker adds at most "
          f"{gain - 1:.0%} here; it pays on more than {total / server:.1f} cores, and W workers keep scaling "
          f"up to about {total / server:.1f} x W cores")
    print("reproduce: " + f"DATABASE_URL={shlex.quote(database_url)} REDIS_URL={shlex.quote(redis_url)} "
          f".venv/bin/python bench/workers.py --workers {args.workers} --spans {args.spans}")
    return 0 if all(r.stored == sum(counts) and r.pending == 0 for r, _ in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
