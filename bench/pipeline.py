"""The pipeline's cost per tool call, and the time to compress a 200k-token conversation.

Run from the repository root:  .venv/bin/python bench/pipeline.py [--calls 2000] [--repeat 5]

1. Per tool call around a no-op LangChain tool: what the agent loop does for each call
   (`execute_tool` span, ToolExecutor.execute_tool_call, span attributes, to_tool_message),
   median µs, interleaved so that other load hits every variant alike, for
   - tracing off (Telemetry.disabled()),
   - tracing on, spans dropped by a no-op exporter (the OpenTelemetry SDK's own cost),
   - tracing on, spans stored in-process (BatchSpanProcessor → StoreSpanExporter → a
     throw-away SQLite database, the export running on the processor's thread),
   each with the tool run inline (timeout_ms=None) and under a deadline (worker thread).
   The bare `tool.invoke()` is the baseline; overhead = variant − baseline.
2. ContextCompressor.compress on a ~200k-token conversation (claude-3-5-sonnet, 200k window,
   tool results of ~2k tokens), median ms per strategy. SUMMARIZE measures what the agent
   waits for: the extracts and scheduling the background summary (the summariser itself runs
   on its own thread and is not timed).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext

from bench_setup import django_in_temp_dir

WORK = django_in_temp_dir()

from django.core.cache import cache  # noqa: E402
from django.core.management import call_command  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult  # noqa: E402

from pipeline.adapters import in_process_telemetry, server_cache, tool_adapters  # noqa: E402
from pipeline.runtime.compression import CompressionStrategy, ContextCompressor  # noqa: E402
from pipeline.runtime.demo.fake_model import ScriptedChatModel  # noqa: E402
from pipeline.runtime.protocol import ExecutionContext  # noqa: E402
from pipeline.runtime.summariser import Summariser  # noqa: E402
from pipeline.runtime.telemetry.spans import Telemetry  # noqa: E402
from pipeline.runtime.telemetry.config import ObservabilityConfig  # noqa: E402
from pipeline.tokens.counting import count_conversation_tokens  # noqa: E402
from pipeline.runtime.executor import ToolExecutor  # noqa: E402

MODEL = "claude-3-5-sonnet"


@tool
def noop(value: int = 0) -> str:
    """Return at once."""
    return "ok"


class DropExporter(SpanExporter):
    def export(self, spans) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def per_call(telemetry: Telemetry, executor: ToolExecutor, inline: bool) -> Callable[[int], None]:
    options = {"timeout_ms": None} if inline else {}
    context = ExecutionContext(model="gpt-4o")

    def one(n: int) -> None:
        call = {"id": f"call_{n}", "name": "noop", "args": {"value": n}}
        with telemetry.turn(conversation_id="bench", agent_name="bench", user_message="") if n % 50 == 0 else nullcontext():
            with telemetry.tool(call, conversation_id="bench") as span:
                result = executor.execute_tool_call(call, context=context, **options)
                telemetry.record_tool_result(span, result)
            result.to_tool_message()

    return one


def bench_tool_calls(calls: int) -> None:
    call_command("migrate", verbosity=0)
    executor = ToolExecutor([noop], model="gpt-4o", **tool_adapters())
    telemetries = {
        "off": Telemetry.disabled(),
        "on, no-op exporter": Telemetry.from_config(ObservabilityConfig(), exporters=[DropExporter()]),
        "on, in-process store": in_process_telemetry(ObservabilityConfig()),
    }
    variants: dict[str, Callable[[int], None]] = {"bare tool.invoke()": lambda n: noop.invoke({"value": n})}
    for name, telemetry in telemetries.items():
        variants[f"tracing {name}, inline"] = per_call(telemetry, executor, inline=True)
        variants[f"tracing {name}, deadline thread"] = per_call(telemetry, executor, inline=False)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for n in range(calls):
        for name, func in variants.items():
            began = time.perf_counter()
            func(n)
            samples[name].append((time.perf_counter() - began) * 1e6)
    for telemetry in telemetries.values():
        telemetry.shutdown()
    base = statistics.median(samples["bare tool.invoke()"])
    print(f"Per tool call around a no-op tool, median of {calls} calls (µs):")
    for name, values in samples.items():
        median = statistics.median(values)
        extra = "" if name.startswith("bare") else f"   overhead {median - base:8.1f}"
        print(f"  {name:48s} {median:8.1f}{extra}")


def conversation(target_tokens: int) -> list[BaseMessage]:
    rows = "\n".join(f"{i:5d} | 2025-07-{i % 28 + 1:02d} | EMEA | Atlas | partner | {i % 13 + 1} units | EUR {1200 - i % 90}.00"
                     for i in range(120))
    messages: list[BaseMessage] = [SystemMessage("You are a sales analyst. Answer from the data.")]
    n = 0
    while count_conversation_tokens(messages[-40:], MODEL) * (len(messages) / max(len(messages[-40:]), 1)) < target_tokens:
        messages += [
            HumanMessage(f"Question {n}: how did order lines look in batch {n}?"),
            AIMessage(f"Querying batch {n}.", tool_calls=[{"id": f"call_{n}", "name": "query_sales", "args": {"batch": n}}]),
            ToolMessage(rows, tool_call_id=f"call_{n}", name="query_sales"),
            AIMessage(f"Batch {n} has 120 lines, mostly Atlas in the partner channel, EUR 1.1-1.2k per unit. " * 3),
        ]
        n += 1
    return messages


def bench_compression(repeat: int) -> None:
    messages = conversation(200_000)
    tokens = count_conversation_tokens(messages, MODEL)
    summariser = Summariser(ScriptedChatModel.from_script(iter(lambda: "summary", None)), model=MODEL, max_cost_per_hour=1e9,
                            cache=server_cache())
    print(f"\nCompressing a {tokens:,}-token conversation ({len(messages)} messages, {MODEL}, 200k window), "
          f"median of {repeat} (ms):")
    for strategy in CompressionStrategy:
        compressor = ContextCompressor(MODEL, strategy=strategy, summariser=summariser)
        times, result = [], None
        for _ in range(repeat):
            cache.clear()  # SUMMARIZE schedules afresh each time
            began = time.perf_counter()
            result = compressor.compress(messages)
            times.append((time.perf_counter() - began) * 1000)
        assert result is not None
        label = strategy.value if strategy is result.strategy else f"{strategy.value}→{result.strategy.value}"
        print(f"  {label:18s} {statistics.median(times):8.1f}   {result.tokens_before:,} → {result.tokens_after:,} tokens, "
              f"{len(result.dropped)} dropped, {len(result.summarised)} summarised")
    summariser.close()
    started = time.perf_counter()
    count_conversation_tokens(messages, MODEL)
    print(f"  (counting the conversation's tokens alone: {(time.perf_counter() - started) * 1000:.1f} ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    try:
        bench_tool_calls(args.calls)
        bench_compression(args.repeat)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    print(f"\nReproduce: .venv/bin/python bench/pipeline.py --calls {args.calls} --repeat {args.repeat}")
    print("Measured on a shared 2-core machine with other engineers' tests running: expect noise.")


if __name__ == "__main__":
    main()
