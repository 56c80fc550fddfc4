"""The native floor of ingest: the CPU per span that storing the standard load costs in C alone.

ctxlens stores the team's standard load (../shared/bench/otlp_load.py, or CTXLENS_OTLP_LOAD) in
this process on a throw-away SQLite database, phase by phase as bench/ingest_phases.py does. Then,
on this machine and in the same run, the work that any implementation storing the same rows must
do is timed alone, each part in C behind one Python call per request, statement or text:

- protobuf: parsing the request bodies (upb), before any attribute is read;
- tokens: counting each stored tool observation whole with the encoding of the model its call was
  linked to (tiktoken), as ctxlens counts the standard load's (its observations are far below
  the length past which ctxlens estimates instead; its LLM spans carry their usage);
- SQLite: the rows ctxlens stored (spans, calls, rounds, conversations, rollups, …), read out
  first, then inserted into an empty copy of the same schema (every index, partial ones too) with
  one executemany per table and request, in the transactions ctxlens stored them in (the rows each
  request's transaction left), in WAL mode with `synchronous=NORMAL` as the server runs; split
  into the inserts, the commits (writing the WAL) and a passive checkpoint every
  `--checkpoint-every` transactions and at the end (the server checkpoints once a second, about
  every 20 requests at the standard load's rate).

It is a lower bound for ctxlens's rows and schema, not for any design: every row goes in once in
its final form (ingest inserts rounds and conversations, then updates them), nothing is looked up,
foreign keys are not checked (Django's connections check them: rows a later request moved to a
conversation it created would fail the replay; a review measured the check at about 1.5 µs per
span), and no HTTP, decoding into Python objects, normalising or linking is counted. bench/ingest.py
prints what the server spends.

    .venv/bin/python bench/ingest_floor.py [--spans 10000] [--batch 100] [--checkpoint-every 20]
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from ingest_phases import PHASES, run_here  # noqa: E402

sys.path.insert(0, str(ROOT))  # before bench/: bench/pipeline.py is a script, not the package

Slices = list[dict[str, tuple[int, int]]]  # per request: table -> (first rowid, last rowid) it inserted


def parsing(bodies: list[bytes]) -> float:
    """CPU seconds to parse the request bodies into protobuf messages."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    began = time.thread_time()
    for body in bodies:
        ExportTraceServiceRequest.FromString(body)
    return time.thread_time() - began


def tokenizing(database: Path) -> float:
    """CPU seconds to count every stored tool observation as ctxlens counts the standard load's: the
    encoding of the model of the LLM call the tool was linked to (none: the default model's)."""
    from pipeline.tokens.counting import model_profile
    from pipeline.tokens.encodings import tiktoken_encoding

    with sqlite3.connect(database) as db:
        rows = db.execute("SELECT t.observation, l.model FROM pipeline_toolcall t "
                          "LEFT JOIN pipeline_llmcall l ON l.id = t.llm_call_id").fetchall()
    work = [(tiktoken_encoding(model_profile(model).encoding_name).encode_ordinary, text) for text, model in rows]
    began = time.thread_time()
    for encode, text in work:
        encode(text)
    return time.thread_time() - began


def slice_recorder(database: Path) -> tuple[Slices, Callable[[], None]]:
    """A list of each request's inserted rowid ranges, and the function that appends the next
    request's (called after each ingest transaction)."""
    slices: Slices = []
    last: dict[str, int] = {}

    def record() -> None:
        with sqlite3.connect(database) as db:
            tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                               "AND name LIKE 'pipeline_%'")]
            now = {t: db.execute(f'SELECT COALESCE(MAX(rowid), 0) FROM "{t}"').fetchone()[0] for t in tables}
        slices.append({t: (last.get(t, 0) + 1, top) for t, top in now.items() if top > last.get(t, 0)})
        last.update(now)

    return slices, record


def empty_copy(stored: Path, empty: Path) -> sqlite3.Connection:
    """A connection to a new database with `stored`'s schema, set up as the server's writer is."""
    with sqlite3.connect(stored) as db:
        schema = [sql for (sql,) in db.execute(
            "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' "
            "ORDER BY type = 'index'")]  # tables first
    out = sqlite3.connect(empty, isolation_level=None)
    for pragma in ("journal_mode=WAL", "synchronous=NORMAL",
                   "wal_autocheckpoint=0"):  # the server checkpoints itself, off the commit
        out.execute(f"PRAGMA {pragma}")
    for sql in schema:
        out.execute(sql)
    return out


def request_rows(stored: Path, slices: Slices) -> list[list[tuple[str, list[tuple]]]]:
    """Per request, (INSERT statement, rows) for each table it inserted into, read out of `stored`."""
    out = []
    with sqlite3.connect(stored) as db:
        for request in slices:
            statements = []
            for table, (first, last) in request.items():
                rows = db.execute(f'SELECT * FROM "{table}" WHERE rowid BETWEEN ? AND ?', (first, last)).fetchall()
                if rows:
                    marks = ", ".join("?" * len(rows[0]))
                    statements.append((f'INSERT INTO "{table}" VALUES ({marks})', rows))
            out.append(statements)
    return out


def inserting(out: sqlite3.Connection, requests: list[list[tuple[str, list[tuple]]]],
              checkpoint_every: int) -> dict[str, float]:
    """CPU seconds of SQLite putting each request's rows in, in a transaction per request: the
    inserts, the commits and the checkpoints."""
    cpu = dict.fromkeys(("inserts", "commits", "checkpoints"), 0.0)

    def timed(part: str, run) -> None:
        began = time.thread_time()
        run()
        cpu[part] += time.thread_time() - began

    for i, statements in enumerate(requests):
        timed("commits", lambda: out.execute("BEGIN IMMEDIATE"))
        for sql, rows in statements:
            timed("inserts", lambda: out.executemany(sql, rows))
        timed("commits", lambda: out.execute("COMMIT"))
        if (i + 1) % checkpoint_every == 0 or i == len(requests) - 1:
            timed("checkpoints", lambda: out.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall())
    return cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spans", type=int, default=10000)
    parser.add_argument("--batch", type=int, default=100, help="spans per request (per transaction)")
    parser.add_argument("--every", type=int, default=5, help="requests between ctxlens's background runs")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="transactions between WAL checkpoints")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ctxlens-bench-"))
    try:
        stored = work / "bench.sqlite3"
        slices, record = slice_recorder(stored)
        ctxlens = run_here(args.spans, args.every, args.batch, work=work, after_request=record)
        from django.db import connections

        connections.close_all()
        from ingest import load_generator  # bench/ingest.py: the load generator beside the repository

        bodies = [r.SerializeToString() for r in load_generator().build_requests(args.spans, args.batch,
                                                                                 run_id="floor")]
        per_span = 1e6 / args.spans
        floor = {"protobuf parse (upb)": parsing(bodies) * per_span,
                 "tokenizing tool observations (tiktoken)": tokenizing(stored) * per_span}
        out = empty_copy(stored, work / "floor.sqlite3")
        sqlite_cpu = inserting(out, request_rows(stored, slices), args.checkpoint_every)
        out.close()
        floor |= {f"SQLite {part}, the same rows": seconds * per_span for part, seconds in sqlite_cpu.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total, done = sum(floor.values()), sum(ctxlens.values())

    print(f"CPU per span (µs), {args.spans} spans of the standard load in requests of {args.batch}, "
          f"SQLite {sqlite3.sqlite_version}, one process")
    print("native floor (C behind one Python call per request, statement or text)")
    for part, micros in floor.items():
        print(f"  {part:42}{micros:8.1f}")
    print(f"  {'floor':42}{total:8.1f}")
    print("ctxlens in-process, same load (" + ", ".join(f"{p} {ctxlens[p]:.0f}" for p in PHASES) + ")")
    print(f"  {'total':42}{done:8.1f}   the floor is {total / done:.0%} of it")
    print(f"reproduce       .venv/bin/python bench/ingest_floor.py --spans {args.spans} --batch {args.batch} "
          f"--every {args.every} --checkpoint-every {args.checkpoint_every}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
