"""What ToolExecutor.execute costs around a no-op tool, and what storing an artifact costs.

Run from the repository root:  .venv/bin/python bench/tool_executor.py [--calls 2000]

Figures (median µs per call, interleaved so that other load hits all variants alike):
- the bare `tool.invoke()` of a no-op LangChain tool (the baseline),
- `execute()` inline (timeout_ms=None) and with a deadline (the worker thread),
- `execute()` answered from the Django cache (CachePolicy.SHORT, local-memory cache),
and the median ms to store a 2 MiB result as an artifact (new content each time: hash,
temp file, fsync, rename, row). Uses a throw-away SQLite database and sandbox; no tracing
(bench/pipeline.py measures the tracing overhead).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from collections.abc import Callable

from bench_setup import django_in_temp_dir

WORK = django_in_temp_dir()

from django.core.management import call_command  # noqa: E402
from langchain_core.tools import tool  # noqa: E402

from pipeline.artifacts.store import store_artifact  # noqa: E402
from pipeline.runtime.protocol import CachePolicy  # noqa: E402
from pipeline.runtime.executor import ToolExecutor  # noqa: E402
from pipeline.adapters import tool_adapters  # noqa: E402


@tool
def noop(value: int = 0) -> str:
    """Return at once."""
    return "ok"


def timed(func: Callable[[], object]) -> float:
    began = time.perf_counter()
    func()
    return (time.perf_counter() - began) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--artifacts", type=int, default=20)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    executor = ToolExecutor([noop], model="gpt-4o", **tool_adapters())
    call = {"id": "call_1", "name": "noop", "args": {"value": 1}}
    executor.execute_tool_call(call, cache_policy=CachePolicy.SHORT)  # warm the cache and tiktoken
    variants: dict[str, Callable[[], object]] = {
        "tool.invoke (baseline)": lambda: noop.invoke({"value": 1}),
        "execute, inline": lambda: executor.execute_tool_call(call, timeout_ms=None),
        "execute, with deadline thread": lambda: executor.execute_tool_call(call, timeout_ms=30_000),
        "execute, cache hit": lambda: executor.execute_tool_call(call, cache_policy=CachePolicy.SHORT),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.calls):
        for name, func in variants.items():
            samples[name].append(timed(func))
    for name, values in samples.items():
        print(f"{name:32s} median {statistics.median(values):8.1f} µs  p95 {statistics.quantiles(values, n=20)[-1]:8.1f} µs")

    block = os.urandom(1024 * 1024).hex()  # 2 MiB of text
    stores = [timed(lambda i=i: store_artifact(f"{i}:{block}")) / 1000 for i in range(args.artifacts)]
    print(f"{'store_artifact, 2 MiB':32s} median {statistics.median(stores):8.1f} ms")
    print(f"(2 cores shared with other work; reproduce: .venv/bin/python bench/tool_executor.py --calls {args.calls})")


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
