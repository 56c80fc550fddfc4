"""One long conversation: its page, live fragments, detail API and admin delete page, before and after, in one run.

A conversation of --turns turns (2,000) with --llm-calls LLM calls and --tool-calls tool calls
(10,000 each: 20,000 calls, 5 of each per turn) is bulk-inserted (bench/live.py's bulk_insert)
into a fresh database; every LLM call carries the input and output digests the findings
read (the history since the last compression, one compression every 5 turns), a short input and
output (3 messages) and its context composition; bench/live.py's populate stores --spans
spans of other, short conversations beside it (100,000). Then each URL is fetched --repeat times
in-process through Django's test client, after one warm-up, and every query it ran is checked
for full scans (bench/bench_db.py's full_scans: EXPLAIN QUERY PLAN on SQLite, EXPLAIN (FORMAT
JSON) on PostgreSQL):

- the conversation page, as opened (the latest turns);
- the live fragments the page's script fetches when a turn changes (`?rounds=<id>`) and after a
  reconnect (`?timeline=1`);
- GET /api/conversations/<id>/ with its default page of rounds;
- the admin's page that confirms deleting the conversation, as a superuser sees it.

The base commit (--base) is measured first in a temporary worktree (bench/trees.py), with the
same data built by its own migrations, then this checkout; the table gives p50/p95 of each and
the ratio base/this of the p50s.

Each tree's database is a temporary SQLite file, or, with DATABASE_URL=postgres://…, a database
its worker creates on that server (COPY-loaded, ANALYZEd) and drops after (bench/bench_db.py).

    .venv/bin/python bench/long_conversation.py [--base 41c9637] [--turns 2000] [--spans 100000] [--repeat 15]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/long_conversation.py --base ''
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BASE = "41c9637"  # main before issue 13
T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
COMPRESS_EVERY = 5  # turns


def _entry(h: str, role: str, category: str, size: int, **ids: list[str]) -> dict:
    return {"hash": h, "role": role, "category": category, "bytes": size, **{k: v for k, v in ids.items() if v}}


def _message(role: str, text: str) -> dict:
    return {"role": role, "parts": [{"type": "text", "content": text}]}


def populate(turns: int, llm_calls: int, tool_calls: int) -> int:
    """The long conversation's rows; returns its id."""
    from django.db import transaction
    from live import analyze, bulk_insert, fast_writes, reset_sequences

    from pipeline.models import CompressionEvent, Conversation, LLMCall, Round, ToolCall

    fast_writes()
    llm_per_turn, tools_per_turn = max(1, llm_calls // turns), max(1, tool_calls // turns)
    system = _entry("5y5", "system", "system", 1200)
    history: list[dict] = []
    rounds, calls, tools, compressions = [], [], [], []
    llm_id = tool_id = 0
    last = T0
    for t in range(turns):
        start = T0 + timedelta(minutes=t)
        round_id = t + 1
        if t and t % COMPRESS_EVERY == 0:
            compressions.append(dict(conversation_id=1, round_id=round_id, trace_id=f"{t:032x}", span_id=f"{999:016x}",
                                     strategy="truncate", occurred_at=start, messages_before=len(history) + 1,
                                     messages_after=11, tokens_before=60_000, tokens_after=12_000))
            history = history[-10:]
        history.append(_entry(f"u{t}", "user", "user", 300))
        in_tokens = out_tokens = 0
        for i in range(max(llm_per_turn, tools_per_turn)):
            at = start + timedelta(seconds=10 * i)
            call_id = f"call_{t}_{i}"
            if i < llm_per_turn:
                llm_id += 1
                request = _entry(f"a{t}.{i}", "assistant", "assistant", 120, requests=[call_id])
                digest = [system, *history]
                size = sum(e["bytes"] for e in digest)
                tokens = size // 4
                calls.append(dict(
                    id=llm_id, conversation_id=1, round_id=round_id, trace_id=f"{t:032x}", span_id=f"{1 + 2 * i:016x}",
                    started_at=at, ended_at=at + timedelta(seconds=2), duration_ms=2000.0, step=i, model="gpt-4o",
                    provider="openai", input_tokens=tokens, output_tokens=40, total_tokens=tokens + 40,
                    context_window=128_000, context_tokens=tokens,
                    context_composition={"system": 300, "user": 75 * (len(history) // 3 + 1),
                                         "tool_observations": max(0, tokens - 375)},
                    input_messages=[_message("system", "You are a careful agent."), _message("user", f"Question {t}"),
                                    _message("tool", "Result " * 40)],
                    output_messages=[{"role": "assistant", "parts": [
                        {"type": "text", "content": f"Looking up {i}."},
                        {"type": "tool_call", "id": call_id, "name": "web_search", "arguments": {"q": f"{t}.{i}"}}]}],
                    input_digest=digest, output_digest=[request]))
                history.append(request)
                in_tokens += tokens
                out_tokens += 40
            if i < tools_per_turn:
                tool_id += 1
                ok = (t + i) % 23 != 0
                tools.append(dict(
                    id=tool_id, conversation_id=1, round_id=round_id, llm_call_id=llm_id if i < llm_per_turn else None,
                    trace_id=f"{t:032x}", span_id=f"{2 + 2 * i:016x}", started_at=at + timedelta(seconds=3),
                    ended_at=at + timedelta(seconds=4), duration_ms=900.0, tool_name="web_search", tool_call_id=call_id,
                    arguments={"q": f"{t}.{i}"}, observation="Result " * 40, observation_tokens=80, success=ok,
                    status="ok" if ok else "error", error_type="" if ok else "timeout"))
                history.append(_entry(f"r{t}.{i}", "tool", "tool_observations", 280, answers=[call_id]))
            last = at + timedelta(seconds=5)
        rounds.append(dict(id=round_id, conversation_id=1, key=f"{t:032x}:root", trace_id=f"{t:032x}",
                           user_message=f"Question {t}", final_answer=f"Answer {t}", status="ok", started_at=start,
                           ended_at=last, duration_ms=(last - start).total_seconds() * 1000,
                           llm_call_count=llm_per_turn, tool_call_count=tools_per_turn,
                           input_tokens=in_tokens, output_tokens=out_tokens))
    conversation = dict(id=1, external_id="bench-long", title="A long conversation", model="gpt-4o", status="ok",
                        started_at=T0, last_activity_at=last, round_count=turns, llm_call_count=len(calls),
                        tool_call_count=len(tools), input_tokens=sum(r["input_tokens"] for r in rounds),
                        output_tokens=sum(r["output_tokens"] for r in rounds), compression_count=len(compressions),
                        findings_stale=1, created_at=T0)
    with transaction.atomic():
        for model, rows in ((Conversation, [conversation]), (Round, rounds), (LLMCall, calls), (ToolCall, tools),
                            (CompressionEvent, compressions)):
            for start in range(0, len(rows), 2000):
                bulk_insert(model, rows[start:start + 2000])
    reset_sequences(Conversation, Round, LLMCall, ToolCall)
    analyze()  # the planner sees the real sizes
    from pipeline.insight.finding_counts import refresh_stale

    refresh_stale()  # the stored counts, as the background refresh leaves them
    return 1


def populate_others(spans: int) -> None:
    """Other conversations around it (bench/live.py's: 5 turns, 50 spans each), so the planner's
    statistics see a database of many conversations, not one."""
    if spans:
        from live import populate as populate_many

        populate_many(spans)


def measure(turns: int, llm_calls: int, tool_calls: int, others: int, repeat: int) -> dict:
    """In a worker process whose sys.path starts with the tree measured: every URL's timings."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from live import full_scans

    from pipeline.models import Round

    call_command("migrate", verbosity=0)
    call_command("collectstatic", interactive=False, verbosity=0)  # pages render with DEBUG off
    started = time.perf_counter()
    if not Round.objects.filter(conversation_id=1).exists():  # a kept database (--keep) holds it already
        populate(turns, llm_calls, tool_calls)
        populate_others(others)
    pk = 1
    built = time.perf_counter() - started
    latest_round = Round.objects.filter(conversation_id=pk).order_by("-started_at").values_list("pk", flat=True)[0]
    client, operator = Client(), Client()
    client.force_login(get_user_model().objects.get_or_create(username="bench-long")[0])
    operator.force_login(get_user_model().objects.get_or_create(
        username="bench-operator", defaults={"is_staff": True, "is_superuser": True})[0])
    urls = {
        "conversation page": f"/conversations/{pk}/",
        "live fragments, one turn": f"/fragments/conversations/{pk}/?rounds={latest_round}",
        "live fragments, timeline": f"/fragments/conversations/{pk}/?timeline=1",
        "detail API": f"/api/conversations/{pk}/",
        "admin delete page": f"/admin/pipeline/conversation/{pk}/delete/",
    }
    results = {}
    for name, url in urls.items():
        viewer = operator if url.startswith("/admin/") else client
        first = viewer.get(url)  # warm caches
        assert first.status_code == 200, (url, first.status_code, first.content[:300])
        timings = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            response = viewer.get(url)
            timings.append(time.perf_counter() - t0)
            assert response.status_code == 200, url
        with CaptureQueriesContext(connection) as captured:
            response = viewer.get(url)
        results[name] = {"url": url, "timings": timings, "queries": len(captured.captured_queries),
                         "scans": full_scans(captured.captured_queries), "bytes": len(response.content)}
    return {"built_s": built, "results": results}


def worker(tree: Path, args: argparse.Namespace) -> None:
    """Measure `tree` with this process: its code first on sys.path, a fresh database (or the one
    kept in --keep)."""
    sys.path.insert(0, str(HERE))
    from bench_db import bench_database

    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        with bench_database(Path(args.keep), keep=args.keep) as database_url:
            _measure_in(Path(args.keep), database_url, tree, args)
    else:
        with (tempfile.TemporaryDirectory(prefix="ctxlens-bench-long-") as work,
              bench_database(Path(work)) as database_url):
            _measure_in(Path(work), database_url, tree, args)


def _measure_in(work: Path, database_url: str, tree: Path, args: argparse.Namespace) -> None:
    os.environ.update(DJANGO_SETTINGS_MODULE="config.settings", CTXLENS_DATA_DIR=str(work),
                      DATABASE_URL=database_url, DEBUG="0", LOG_LEVEL="WARNING",
                      CTXLENS_ARTIFACT_DIR=str(work / "artifacts"), ALLOWED_HOSTS="127.0.0.1,localhost,testserver")
    os.environ.pop("REDIS_URL", None)
    sys.path.insert(0, str(HERE))
    import live  # noqa: F401  (it puts this checkout on sys.path: the tree measured goes before it)

    sys.path[:] = [p for p in sys.path if p not in (str(ROOT), str(tree))]
    sys.path.insert(0, str(tree))
    sys.path.insert(1, str(HERE))
    import django

    django.setup()
    print(json.dumps(measure(args.turns, args.llm_calls, args.tool_calls, args.spans, args.repeat)))


def run_tree(tree: Path, args: argparse.Namespace) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", str(tree), "--turns", str(args.turns),
               "--llm-calls", str(args.llm_calls), "--tool-calls", str(args.tool_calls), "--spans", str(args.spans), "--repeat", str(args.repeat)]
    if args.keep:
        command += ["--keep", str(Path(args.keep).resolve() / tree.name)]
    done = subprocess.run(command, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"measuring {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--llm-calls", type=int, default=10_000)
    parser.add_argument("--tool-calls", type=int, default=10_000)
    parser.add_argument("--spans", type=int, default=100_000, help="spans of other conversations stored beside it")
    parser.add_argument("--repeat", type=int, default=15, help="fetches of each URL (after one warm-up)")
    parser.add_argument("--base", default=BASE, help="the commit to compare with ('' for none)")
    parser.add_argument("--keep", metavar="DIR", help="keep (and reuse) the databases under DIR")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(Path(args.worker), args)
        return
    sys.path.insert(0, str(HERE))
    from bench_db import engine_name, reproduce_prefix
    from live import percentile
    from trees import checkout, short

    print(f"# {reproduce_prefix()}.venv/bin/python bench/long_conversation.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}".rstrip())
    print(f"# {os.cpu_count()} CPUs shared with other work while measuring: treat as noisy upper bounds")
    print(f"# one conversation: {args.turns:,} turns, {args.llm_calls:,} LLM calls, {args.tool_calls:,} tool calls;"
          f" {args.spans:,} spans of other conversations beside it; {engine_name()}; p50/p95 of {args.repeat} fetches through Django's test client")
    measured: dict[str, dict] = {}
    if args.base:
        with checkout(args.base) as tree:
            measured[f"base {short(args.base)}"] = run_tree(tree, args)
    measured["this checkout"] = run_tree(ROOT, args)
    names = list(next(iter(measured.values()))["results"])
    p50 = {}
    for name in names:
        print(name)
        for label, run in measured.items():
            r = run["results"][name]
            p50[label, name] = percentile(r["timings"], .5)
            scans = f"  FULL SCANS: {len(r['scans'])}" if r["scans"] else ""
            print(f"  {label:<14} p50 {p50[label, name] * 1000:8.1f} ms  p95 {percentile(r['timings'], .95) * 1000:8.1f} ms"
                  f"  {r['queries']:>3} queries  {r['bytes'] / 1024:8.0f} KiB  {r['url']}{scans}")
            for scan in r["scans"]:
                print(f"      {scan}")
        if len(measured) == 2:
            base, this = measured
            print(f"  base/this p50: {p50[base, name] / p50[this, name]:.1f}x")
    base_flag = "" if args.base == BASE else f" --base {shlex.quote(args.base)}"
    print(f"reproduce: {reproduce_prefix()}.venv/bin/python bench/long_conversation.py --turns {args.turns} --llm-calls {args.llm_calls} "
          f"--tool-calls {args.tool_calls} --spans {args.spans} --repeat {args.repeat}{base_flag}")


if __name__ == "__main__":
    main()
