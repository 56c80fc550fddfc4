"""How long does the call-to-call diff of a long conversation take to read?

Run from the repository root:  .venv/bin/python bench/call_diff.py [--calls 200] [--runs 15]

Sends one conversation of N LLM calls through the REST ingest service (each call's input is
the previous one plus a tool call and its ~2 KB result, so input N holds 2N+2 messages; a
compression every 50 calls restarts the input from a summary), then times, median of the runs:
- the timeline's batch (pipeline.insight.calls.call_diffs): loading every call's digest and
  token columns and diffing each against its predecessor, the queries included;
- one call's diff as GET /api/llm-calls/<id>/ computes it (call_diff on the last call).
The issue's target is the findings and diff of a 200-call conversation in ≤ 50 ms.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from bench_setup import django_in_temp_dir

WORK = django_in_temp_dir()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from pipeline.ingest import service  # noqa: E402
from pipeline.ingest.service import Failed, IngestRequest, Rejected  # noqa: E402
from pipeline.insight.calls import DIGEST_FIELDS, call_diff, call_diffs  # noqa: E402
from pipeline.models import ApiKey, LLMCall  # noqa: E402

T0 = datetime(2026, 5, 1, tzinfo=UTC)
SYSTEM = {"role": "system", "content": "You are a research agent. " * 40}


def events(calls: int) -> list[dict]:
    base = {"conversation_id": "bench-diff", "round_id": "r1"}
    out = [{**base, "type": "round_start", "timestamp": T0.isoformat(), "user_message": "Research it."}]
    messages = [SYSTEM, {"role": "user", "content": "Research it."}]
    for n in range(calls):
        at = T0 + timedelta(seconds=10 * n + 1)
        if n and n % 50 == 0:
            after = [SYSTEM, {"role": "user", "content": f"Summary of {n} steps. " * 20}]
            out.append({**base, "type": "compression", "compression_id": f"c{n}", "timestamp": at.isoformat(),
                        "strategy": "extract", "tokens_before": 100_000, "tokens_after": 2_000,
                        "before_messages": messages, "after_messages": after})
            messages = after
        size = sum(len(m.get("content") or "") + 40 for m in messages)
        out.append({**base, "type": "llm_call", "call_id": f"llm-{n}", "model": "gpt-4o", "provider": "openai",
                    "started_at": (at + timedelta(seconds=1)).isoformat(), "duration_ms": 800,
                    "input_tokens": size // 4, "output_tokens": 40, "cache_read_tokens": size // 5,
                    "input_messages": messages})
        call = {"id": f"call_{n}", "name": "search", "arguments": {"q": f"query {n}"}}
        messages = [*messages, {"role": "assistant", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": call["id"], "content": f"result {n} " + "x" * 2000}]
    out.append({**base, "type": "round_end", "timestamp": (T0 + timedelta(seconds=10 * calls + 5)).isoformat()})
    return out


def store(calls: int) -> None:
    raw_key = ApiKey.generate("bench")[1]
    body = json.dumps({"schema_version": "1.0", "events": events(calls)}).encode()
    outcome = service.ingest(IngestRequest(source="rest", body=body, content_type="application/json",
                                           authorization=f"Bearer {raw_key}"))
    assert not isinstance(outcome, Failed | Rejected), outcome
    assert LLMCall.objects.count() == calls


def median_ms(work: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        work()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    store(args.calls)

    def load() -> list[LLMCall]:
        return list(LLMCall.objects.only(*DIGEST_FIELDS).order_by("started_at", "pk"))

    loaded = load()
    breaks = sum(d["cache_break"] for d in call_diffs(loaded).values())
    last = loaded[-1]
    batch_ms = median_ms(lambda: call_diffs(load()), args.runs)
    load_ms = median_ms(load, args.runs)
    one_ms = median_ms(lambda: call_diff(last), args.runs)
    print(f"call diffs of a {args.calls}-call conversation ({len(last.input_digest)} messages in the last input, "
          f"{breaks} cache breaks), {connection.vendor}: {batch_ms:.1f} ms for every call (timeline batch; "
          f"{load_ms:.1f} ms of it loading the digests), {one_ms:.1f} ms for one call (API), "
          f"median of {args.runs}")
    print(f"reproduce: .venv/bin/python bench/call_diff.py --calls {args.calls} --runs {args.runs}")
    connection.close()
    shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
