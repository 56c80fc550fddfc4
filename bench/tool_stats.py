"""How long does the per-tool statistics query (GET /api/tools/stats/) take over many tool calls?

Fills a fresh database with N tool calls over 25 tools (random durations, some failures and
retries), then times `pipeline.stats.tool_stats()` — one grouped query plus, on SQLite, the
durations fetched unsorted and sorted per tool in Python for p50/p95 — and, for comparison,
fetching the durations sorted by SQL (ORDER BY tool_name, duration_ms) without any aggregate.
Prints the median of several runs.

    .venv/bin/python bench/tool_stats.py [--calls 100000] [--runs 7]
    .venv/bin/python bench/tool_stats.py --database-url postgres://postgres@127.0.0.1:5432/ctxlens_bench

The database is a temporary SQLite file, or the database --database-url names, whose tool calls
are deleted first: never point it at real data.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--database-url", default="", help="a scratch database; default: a temporary SQLite file")
    args = parser.parse_args()

    data_dir = tempfile.mkdtemp(prefix="ctxlens-bench-stats-")
    os.environ["CTXLENS_DATA_DIR"] = data_dir
    if args.database_url:
        os.environ["DATABASE_URL"] = args.database_url
    else:
        os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ["DEBUG"] = "0"
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from pipeline.models import Conversation, ToolCall
    from pipeline.stats import tool_calls_in, tool_stats

    call_command("migrate", verbosity=0)
    ToolCall.objects.all().delete()
    Conversation.objects.filter(external_id="bench-tool-stats").delete()
    start = datetime(2026, 5, 1, tzinfo=UTC)
    conversation = Conversation.objects.create(external_id="bench-tool-stats", started_at=start, last_activity_at=start)
    rng = random.Random(7)
    rows = [
        ToolCall(
            conversation=conversation, tool_name=f"tool_{rng.randrange(25):02d}", trace_id=f"{i:032x}",
            span_id=f"{i:016x}", started_at=start + timedelta(seconds=i), duration_ms=rng.lognormvariate(4, 1),
            success=rng.random() > 0.05, retry_count=rng.choice((0, 0, 0, 1, 2)),
            observation_tokens=rng.randrange(2000),
        )
        for i in range(1, args.calls + 1)
    ]
    ToolCall.objects.bulk_create(rows, batch_size=2000)

    def timed(fn) -> float:
        times = []
        for _ in range(args.runs):
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
        return statistics.median(times) * 1000

    def sql_sort() -> None:
        durations: dict[str, list[float]] = {}
        for name, duration in ToolCall.objects.filter(duration_ms__isnull=False).order_by(
                "tool_name", "duration_ms").values_list("tool_name", "duration_ms").iterator(chunk_size=5000):
            durations.setdefault(name, []).append(duration)

    window = start + timedelta(seconds=args.calls // 2)
    all_ms = timed(lambda: tool_stats())
    half_ms = timed(lambda: tool_stats(tool_calls_in(since=window)))
    sql_sort_ms = timed(sql_sort)
    print(f"tool_stats over {args.calls} tool calls, 25 tools, {connection.vendor}: "
          f"{all_ms:.0f} ms (all), {half_ms:.0f} ms (since= half of them); "
          f"only fetching the durations sorted by SQL: {sql_sort_ms:.0f} ms (median of {args.runs})")
    ToolCall.objects.all().delete()
    conversation.delete()
    connection.close()
    shutil.rmtree(data_dir, ignore_errors=True)
    db = f" --database-url {args.database_url}" if args.database_url else ""
    print(f"reproduce: .venv/bin/python bench/tool_stats.py --calls {args.calls} --runs {args.runs}{db}")


if __name__ == "__main__":
    main()
