"""What the context-insight figures cost: reading a long conversation's findings and diffs, and ingest.

Two parts:
- **read**: a conversation of CALLS LLM calls (a tool loop whose history grows, a compression
  every 50 calls, the system prompt edited once) is ingested through the REST ingest API into a
  fresh SQLite database; then GET /api/conversations/<id>/findings/, GET /api/llm-calls/<id>/
  of the last call (through Django's test client), and the timeline's diff line of every call (its
  batch, pipeline.insight.calls.call_diffs) are timed, median of --repeat runs (target ≤ 50 ms
  for the findings and the diff);
- **ingest**: bench/ingest.py's standard load (../shared/bench/otlp_load.py, 20,000 spans)
  against this checkout and a base commit (default: the last commit before issue 12), back to
  back, alternating, --rounds times each; prints spans/s of each and the ratio (target: within
  10 %).

    .venv/bin/python bench/insight.py [--part read|ingest|all] [--calls 200] [--repeat 15]
    .venv/bin/python bench/insight.py --part ingest [--base fba03d2] [--spans 20000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

BASE = "fba03d2"  # main before issue 12 (context insight)
T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


def text(role: str, content: str) -> dict:
    return {"role": role, "parts": [{"type": "text", "content": content}]}


def conversation_events(calls: int) -> list[dict]:
    """One conversation: rounds of 5 calls, each call's input the whole history so far (system,
    user turns, tool calls and their ~2 KB results), a compression every 50 calls that keeps the
    system prompt and the last 10 messages, the system prompt edited at call 120."""
    events: list[dict] = [{"type": "conversation", "conversation_id": "bench-insight", "title": "insight bench"}]
    system = text("system", "You are a careful research agent. " * 20)
    history: list[dict] = []
    at = T0
    for i in range(calls):
        round_id = f"r{i // 5}"
        if i % 5 == 0:
            history.append(text("user", f"Question {i // 5}: what changed in dataset {i}?"))
            events.append({"type": "round_start", "conversation_id": "bench-insight", "round_id": round_id,
                           "timestamp": at.isoformat(), "user_message": history[-1]["parts"][0]["content"]})
        if i == 120:
            system = text("system", "You are a careful research agent. Cite sources. " * 20)
        if i and i % 50 == 0:
            before = [system, *history]
            history = history[-10:]
            events.append({"type": "compression", "conversation_id": "bench-insight", "round_id": round_id,
                           "compression_id": f"c{i}", "timestamp": at.isoformat(), "strategy": "truncate",
                           "tokens_before": 40_000, "tokens_after": 9_000, "messages_before": len(before),
                           "messages_after": len(history) + 1})
        messages = [system, *history]
        call_id = f"call_{i}"
        tool_request = {"role": "assistant", "parts": [
            {"type": "tool_call", "id": call_id, "name": "web_search", "arguments": {"q": f"dataset {i}"}}]}
        size = sum(len(json.dumps(m)) for m in messages)
        events.append({
            "type": "llm_call", "conversation_id": "bench-insight", "round_id": round_id, "call_id": f"llm{i}",
            "started_at": at.isoformat(), "duration_ms": 800, "model": "gpt-4o", "provider": "openai",
            "input_tokens": size // 4, "output_tokens": 40, "cache_read_tokens": (size // 4) // 2,
            "input_messages": messages, "output_messages": [tool_request],
        })
        at += timedelta(seconds=1)
        observation = f"Result {i}: " + "lorem ipsum dolor sit amet " * 80
        events.append({
            "type": "tool_call", "conversation_id": "bench-insight", "round_id": round_id, "tool_name": "web_search",
            "tool_call_id": call_id, "started_at": at.isoformat(), "duration_ms": 300,
            "arguments": {"q": f"dataset {i}"}, "observation": observation,
        })
        history += [tool_request, {"role": "tool", "parts": [
            {"type": "tool_call_response", "id": call_id, "response": observation}]}]
        at += timedelta(seconds=1)
        if i % 5 == 4:
            events.append({"type": "round_end", "conversation_id": "bench-insight", "round_id": round_id,
                           "timestamp": at.isoformat(), "final_answer": "done"})
    return events


def timed(get, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        reply = get()
        samples.append((time.perf_counter() - started) * 1000)
        if reply.status_code != 200:
            raise SystemExit(f"{reply.status_code}: {reply.content[:300]!r}")
    return statistics.median(samples)


def every_diff(conversation, repeat: int) -> float:
    """The timeline's batch: every call's digest loaded and diffed against its predecessor."""
    from pipeline.insight.calls import DIGEST_FIELDS, call_diffs
    from pipeline.models import LLMCall

    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        call_diffs(list(LLMCall.objects.filter(conversation=conversation).only(*DIGEST_FIELDS)))
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def read_part(calls: int, repeat: int) -> None:
    from bench_setup import django_in_temp_dir

    django_in_temp_dir()
    from django.conf import settings
    from django.core.management import call_command

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    from rest_framework.test import APIClient

    call_command("migrate", verbosity=0)
    from pipeline.ingest.write.writer_threads import stop_writer
    from pipeline.models import ApiKey, Conversation, LLMCall
    from pipeline.models.apikeys import Scope

    ingest = APIClient()
    ingest.credentials(HTTP_AUTHORIZATION=f"Bearer {ApiKey.generate('bench')[1]}")
    events = conversation_events(calls)
    for start in range(0, len(events), 100):
        reply = ingest.post("/api/ingest/", {"schema_version": "1.0", "events": events[start:start + 100]},
                            format="json")
        if reply.status_code >= 300:
            raise SystemExit(f"ingest: {reply.status_code} {reply.content[:300]!r}")
    conversation = Conversation.objects.get(external_id="bench-insight")
    last = LLMCall.objects.filter(conversation=conversation).order_by("-started_at").first()
    reader = APIClient()
    reader.credentials(HTTP_AUTHORIZATION=f"Bearer {ApiKey.generate('reader', scope=Scope.READ)[1]}")

    n = LLMCall.objects.filter(conversation=conversation).count()
    findings = reader.get(f"/api/conversations/{conversation.pk}/findings/").json()["results"]
    print(f"conversation: {n} LLM calls, {len(findings)} findings "
          f"({', '.join(sorted({f['code'] for f in findings}))})")
    figures = {
        "findings API": timed(lambda: reader.get(f"/api/conversations/{conversation.pk}/findings/"), repeat),
        "diff API (last call)": timed(lambda: reader.get(f"/api/llm-calls/{last.pk}/"), repeat),
    }
    figures["timeline diff lines, every call"] = every_diff(conversation, repeat)
    for name, ms in figures.items():
        print(f"{name:42s} {ms:8.1f} ms")
    print(f"(medians of {repeat} runs; the issue's target: findings and diff of a 200-call conversation ≤ 50 ms)")
    stop_writer()


def ingest_once(tree: Path, spans: int) -> dict:
    """bench/ingest.py of `tree` (its own code and migrations, a fresh database), its figures
    read off its report."""
    command = [sys.executable, str(tree / "bench" / "ingest.py"), "--spans", str(spans)]
    env = {**os.environ, "CTXLENS_OTLP_LOAD": str(ROOT.parent / "shared" / "bench" / "otlp_load.py")}
    out = subprocess.run(command, cwd=tree, env=env, check=True, capture_output=True, text=True).stdout
    figures = {}
    for name, pattern in (("spans_per_s", r"throughput\s+([\d,]+) spans/s persisted"),
                          ("cpu_us_per_span", r"= (\d+) µs per span"), ("rss_mb", r"peak RSS\s+(\d+) MB")):
        found = re.search(pattern, out)
        if not found:
            raise SystemExit(f"bench/ingest.py printed no {name}:\n{out}")
        figures[name] = float(found.group(1).replace(",", ""))
    return figures


def ingest_part(base: str, spans: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="ctxlens-insight-base-") as tmp:
        tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), base], cwd=ROOT, check=True)
        try:
            results: dict[str, list[dict]] = {"base": [], "head": []}
            for _ in range(rounds):
                results["base"].append(ingest_once(tree, spans))
                results["head"].append(ingest_once(ROOT, spans))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=True)
    rate = {name: statistics.median(r["spans_per_s"] for r in runs) for name, runs in results.items()}
    for name, runs in results.items():
        cpu = statistics.median(r["cpu_us_per_span"] for r in runs)
        print(f"{name}: {rate[name]:,.0f} spans/s persisted and queryable, {cpu:.0f} µs CPU per span "
              f"(runs: {', '.join(format(r['spans_per_s'], ',.0f') for r in runs)})")
    print(f"head / base = {rate['head'] / rate['base']:.3f} (target ≥ 0.90)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("read", "ingest", "all"), default="all")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--base", default=BASE)
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print("command: .venv/bin/python bench/insight.py " + shlex.join(sys.argv[1:]))
    if args.part in ("ingest", "all"):
        ingest_part(args.base, args.spans, args.rounds)
    if args.part in ("read", "all"):
        read_part(args.calls, args.repeat)


if __name__ == "__main__":
    main()
