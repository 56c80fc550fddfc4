"""The native floor of ingest: CPU per span that storing the standard load costs with no Python at all.

ctxlens stores the team's standard load (../shared/bench/otlp_load.py, or CTXLENS_OTLP_LOAD) in
this process on a throw-away SQLite database, phase by phase as bench/ingest_phases.py does. Then,
on this machine and in the same run, the work that any implementation storing the same rows must
do is timed alone, each part in C with one Python call per statement or text:

- protobuf: parsing the request bodies (upb), before any attribute is read;
- tokens: counting each tool observation with the encoding of the model its call was linked to
  (tiktoken), as ctxlens counts it;
- SQLite: the rows ctxlens stored (spans, calls, rounds, conversations, rollups, …) inserted into
  an empty copy of the same schema, with the same indexes, by `INSERT … SELECT` from the stored
  database, one transaction per request's share of every table, in WAL mode with
  `synchronous=NORMAL` as the server runs; split into the inserts, the commits (writing the WAL)
  and a passive checkpoint every `--checkpoint-every` transactions (the server checkpoints once a
  second, about every 20 requests at the standard load's rate).

It is a lower bound: every row goes in once in its final form (ingest inserts rounds and
conversations, then updates them), nothing is looked up, and no HTTP, decoding into Python
objects, normalising or linking is counted. bench/ingest.py prints what the server spends.

    .venv/bin/python bench/ingest_floor.py [--spans 10000] [--batch 100] [--checkpoint-every 20]
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from ingest_phases import PHASES, run_here  # noqa: E402

sys.path.insert(0, str(ROOT))  # before bench/: bench/pipeline.py is a script, not the package


def tokenizing(database: Path) -> float:
    """CPU seconds to count every stored tool observation as ctxlens does: the encoding of the
    model of the LLM call the tool was linked to (none: the default model's)."""
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


def parsing(bodies: list[bytes]) -> float:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    began = time.thread_time()
    for body in bodies:
        ExportTraceServiceRequest.FromString(body)
    return time.thread_time() - began


def inserting(stored: Path, empty: Path, transactions: int, checkpoint_every: int) -> dict[str, float]:
    """CPU seconds of SQLite alone putting the stored rows into `empty` (a new database with the
    same schema): the inserts, the commits and the checkpoints."""
    with sqlite3.connect(stored) as db:
        schema = [sql for (sql,) in db.execute(
            "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' "
            "ORDER BY type = 'index'")]  # tables first
        tables = [name for (name,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'pipeline_%'")]
        rowids = {t: [r for (r,) in db.execute(f'SELECT rowid FROM "{t}" ORDER BY rowid')] for t in tables}
    out = sqlite3.connect(empty, isolation_level=None)
    out.execute("PRAGMA journal_mode=WAL")
    out.execute("PRAGMA synchronous=NORMAL")
    out.execute("PRAGMA wal_autocheckpoint=0")  # the server checkpoints itself, off the commit
    for sql in schema:
        out.execute(sql)
    out.execute("ATTACH DATABASE ? AS stored", (str(stored),))
    # Each transaction takes its share of every table, in stored order, by rowid range.
    statements = []
    for i in range(transactions):
        batch = []
        for table, ids in rowids.items():
            lo, hi = len(ids) * i // transactions, len(ids) * (i + 1) // transactions
            if hi > lo:
                batch.append((f'INSERT INTO main."{table}" SELECT * FROM stored."{table}" WHERE rowid BETWEEN ? AND ?',
                              (ids[lo], ids[hi - 1])))
        statements.append(batch)
    cpu = dict.fromkeys(("inserts", "commits", "checkpoints"), 0.0)

    def timed(part: str, sql: str, params: tuple = ()) -> None:
        began = time.thread_time()
        out.execute(sql, params).fetchall()
        cpu[part] += time.thread_time() - began

    for i, batch in enumerate(statements):
        timed("commits", "BEGIN IMMEDIATE")
        for sql, params in batch:
            timed("inserts", sql, params)
        timed("commits", "COMMIT")
        if (i + 1) % checkpoint_every == 0:
            timed("checkpoints", "PRAGMA main.wal_checkpoint(PASSIVE)")
    out.close()
    return cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spans", type=int, default=10000)
    parser.add_argument("--batch", type=int, default=100, help="spans per request (per transaction)")
    parser.add_argument("--every", type=int, default=5, help="requests between ctxlens's background runs")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="transactions between WAL checkpoints")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ctxlens-bench-"))
    ctxlens = run_here(args.spans, args.every, args.batch, work=work)

    from django.db import connections

    connections.close_all()
    from ingest import load_generator  # bench/ingest.py: the load generator beside the repository

    bodies = [r.SerializeToString() for r in load_generator().build_requests(args.spans, args.batch, run_id="floor")]
    per_span = 1e6 / args.spans
    floor = {"protobuf parse (upb)": parsing(bodies) * per_span,
             "tokenizing tool observations (tiktoken)": tokenizing(work / "bench.sqlite3") * per_span}
    sqlite_cpu = inserting(work / "bench.sqlite3", work / "floor.sqlite3", len(bodies), args.checkpoint_every)
    floor |= {f"SQLite {part}, the same rows": seconds * per_span for part, seconds in sqlite_cpu.items()}
    total = sum(floor.values())
    done = sum(ctxlens.values())

    print(f"CPU per span (µs), {args.spans} spans of the standard load in requests of {args.batch}, "
          f"SQLite {sqlite3.sqlite_version}, one process")
    print("native floor (no Python around it)")
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
