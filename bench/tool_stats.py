"""How long does GET /api/tools/stats/ take over many tool calls, before and after a change?

Fills a temporary database with N tool calls over 25 tools (one a second up to now, random
durations, some failures and retries) with this checkout — bulk-inserted, then the rollups built
by `rebuild_rollups` as ingest would have kept them — and times the endpoint in-process (Django's
test client, a read key) for several windows, in this checkout and, with --base, in that commit's
tree on the same database, one after the other. Every query the endpoint runs is checked for a
full scan of the tool calls (SQLite: EXPLAIN QUERY PLAN's SCAN; PostgreSQL: a Seq Scan in
EXPLAIN (FORMAT JSON)). Prints the median of several runs.

The database is a temporary SQLite file, or, with DATABASE_URL=postgres://…, a database the
bench creates on that server and drops after (bench/bench_db.py), ANALYZEd once filled.

    .venv/bin/python bench/tool_stats.py [--calls 200000] [--runs 7] [--base <commit>]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/tool_stats.py --calls 200000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.bench_db import analyze, bench_database, engine_name, reproduce_prefix  # noqa: E402

WINDOWS = ("all time", "window=7d", "window=24h", "window=1h", "since=half")

# Run in the tree measured (its own code on the shared database): prints {window: (ms, full scans)}.
MEASURE = r'''
import json, os, statistics, sys, time
sys.path.insert(0, os.getcwd())
import django
django.setup()
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient
client = APIClient()
client.credentials(HTTP_AUTHORIZATION="Bearer " + os.environ["BENCH_KEY"])
out = {}
for name, query in json.loads(os.environ["BENCH_WINDOWS"]).items():
    url = "/api/tools/stats/" + query
    assert client.get(url).status_code == 200, url
    times = []
    for _ in range(int(os.environ["BENCH_RUNS"])):
        began = time.perf_counter()
        client.get(url)
        times.append(time.perf_counter() - began)
    with CaptureQueriesContext(connection) as captured:
        client.get(url)
    scans = 0
    with connection.cursor() as cursor:
        for q in captured.captured_queries:
            sql = q["sql"].lstrip()
            if sql.upper().startswith("DECLARE ") and " FOR SELECT " in sql.upper():  # .iterator() on PostgreSQL
                sql = sql[sql.upper().index(" FOR SELECT ") + 5:]
            if not sql.upper().startswith("SELECT"):
                continue
            if connection.vendor == "postgresql":  # a Seq Scan node anywhere in the plan
                cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
                plan = cursor.fetchone()[0]
                nodes = [(plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]]
                while nodes:
                    node = nodes.pop()
                    nodes.extend(node.get("Plans", ()))
                    scans += node["Node Type"] == "Seq Scan" and node.get("Relation Name") == "pipeline_toolcall"
            else:
                cursor.execute("EXPLAIN QUERY PLAN " + sql)
                scans += sum(1 for row in cursor.fetchall() if row[-1].startswith("SCAN pipeline_toolcall"))
    out[name] = (statistics.median(times) * 1000, scans)
print(json.dumps(out))
'''


def populate(calls: int, now: datetime) -> str:
    """The database filled; returns a read key for the API."""
    from django.core.management import call_command

    from pipeline.models import ApiKey, Conversation, ToolCall
    from pipeline.models.apikeys import Scope
    from pipeline.rollups.compact import rebuild_rollups

    call_command("migrate", verbosity=0)
    start = now - timedelta(seconds=calls)
    conversation = Conversation.objects.create(external_id="bench-tool-stats", started_at=start, last_activity_at=now)
    rng = random.Random(7)
    rows = [
        ToolCall(
            conversation=conversation, tool_name=f"tool_{rng.randrange(25):02d}", trace_id=f"{i:032x}",
            span_id=f"{i:016x}", started_at=start + timedelta(seconds=i), duration_ms=rng.lognormvariate(4, 1),
            success=rng.random() > 0.05, retry_count=rng.choice((0, 0, 0, 1, 2)),
            observation_tokens=rng.randrange(2000),
        )
        for i in range(1, calls + 1)
    ]
    ToolCall.objects.bulk_create(rows, batch_size=2000)  # no signals: the rollups are built next
    rebuild_rollups(now)
    analyze()  # the planner sees the real sizes
    return ApiKey.generate("bench", scope=Scope.READ)[1]


def measure(tree: Path, env: dict[str, str]) -> dict[str, list]:
    done = subprocess.run([sys.executable, "-c", MEASURE], cwd=tree, env=env, check=True, capture_output=True,
                          text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--base", help="also measure this commit (a branch, tag or hash) on the same database")
    args = parser.parse_args()

    engine, prefix = engine_name(), reproduce_prefix()
    with (tempfile.TemporaryDirectory(prefix="ctxlens-bench-stats-") as data_dir,
          bench_database(Path(data_dir)) as database_url):
        env = {**os.environ, "CTXLENS_DATA_DIR": data_dir, "DATABASE_URL": database_url,
               "DJANGO_SETTINGS_MODULE": "config.settings", "DEBUG": "0", "LOG_LEVEL": "WARNING",
               "ALLOWED_HOSTS": "testserver"}
        os.environ.update(env)
        import django

        django.setup()
        now = datetime.now(UTC)
        key = populate(args.calls, now)
        half = (now - timedelta(seconds=args.calls // 2)).isoformat().replace("+00:00", "Z")
        queries = {"all time": "", "window=7d": "?window=7d", "window=24h": "?window=24h", "window=1h": "?window=1h",
                   "since=half": f"?since={half}"}
        env.update(BENCH_KEY=key, BENCH_RUNS=str(args.runs), BENCH_WINDOWS=json.dumps(queries))
        results = {}
        if args.base:
            from bench.trees import checkout, short

            with checkout(args.base) as base:
                results[f"base {short(args.base)}"] = measure(base, env)
        results["this checkout"] = measure(ROOT, env)

    print(f"GET /api/tools/stats/ over {args.calls:,} tool calls (one a second up to now), 25 tools, {engine}; "
          f"median of {args.runs}, ms (full scans of the tool calls):")
    print(f"{'':<16}" + "".join(f"{w:>16}" for w in WINDOWS))
    for tree, figures in results.items():
        print(f"{tree:<16}" + "".join(f"{figures[w][0]:>10.1f} ({figures[w][1]})" for w in WINDOWS))
    if len(results) == 2:
        before, after = results.values()
        print(f"{'ratio':<16}" + "".join(f"{before[w][0] / after[w][0]:>15.1f}x" for w in WINDOWS))
    base = f" --base {args.base}" if args.base else ""
    print(f"reproduce: {prefix}.venv/bin/python bench/tool_stats.py --calls {args.calls} --runs {args.runs}{base}")


if __name__ == "__main__":
    main()
