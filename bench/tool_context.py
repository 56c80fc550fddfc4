"""What keeping each tool result's context cost adds to ingest (pipeline.ingest.write.tool_context).

1. The team's standard load (../shared/bench/otlp_load.py, or CTXLENS_OTLP_LOAD: batches of 100
   agent spans): `store_spans` time per span on a fresh temporary SQLite database, and how much
   of it the ledger's two calls on the write path took (timed directly: on a shared machine the
   difference of two runs is smaller than their noise). The token counts left for later are done
   after the timing.
2. One long conversation: --calls LLM calls, each asking for one tool and carrying every earlier
   tool result (nothing dropped, so call n carries n-1 results), stored one call and its tool per
   batch, as an agent exports them: ms per batch over the first and the last tenth, and how
   much of it the ledger took. Its cost per call grows with the results the call carries, never
   with the calls before it.

    .venv/bin/python bench/tool_context.py [--spans 20000] [--calls 200]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

from bench_setup import ROOT, django_in_temp_dir

LOAD = Path(os.environ.get("CTXLENS_OTLP_LOAD") or ROOT.parent / "shared" / "bench" / "otlp_load.py")


def load_generator():
    spec = importlib.util.spec_from_file_location("otlp_load", LOAD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Ledger:
    """Times the ledger's two calls on the write path (pipeline.ingest.write.store)."""

    def __init__(self) -> None:
        from pipeline.ingest.write import store, tool_context

        self.seconds = 0.0
        update, mark = tool_context.update_tool_context, store.mark_pending

        def timed(call):
            def run(*args, **kwargs):
                started = time.perf_counter()
                try:
                    return call(*args, **kwargs)
                finally:
                    self.seconds += time.perf_counter() - started
            return run

        tool_context.update_tool_context, store.mark_pending = timed(update), timed(mark)


def standard_load(spans: int, ledger: Ledger) -> tuple[float, float]:
    """(µs per span storing the load, µs per span of it in the ledger)."""
    from pipeline.ingest.decode.otlp import decode_traces_protobuf
    from pipeline.ingest.write import deferred
    from pipeline.ingest.write.store import store_spans

    # Token counts the batches leave for later are counted after the timing, not on a thread
    # that competes with it.
    schedule, deferred.schedule = deferred.schedule, lambda: None
    batches = [decode_traces_protobuf(r.SerializeToString()).spans for r in load_generator().build_requests(spans, 100)]
    stored, before, started = sum(len(b) for b in batches), ledger.seconds, time.perf_counter()
    for batch in batches:
        store_spans(batch)
    took = time.perf_counter() - started
    deferred.schedule = schedule
    deferred.complete_pending()
    return took / stored * 1e6, (ledger.seconds - before) / stored * 1e6


def long_conversation(calls: int, ledger: Ledger) -> tuple[list[float], list[float]]:
    """ms per batch and ms in the ledger per batch, for each of `calls` batches."""
    from pipeline.ingest.records import SpanRecord
    from pipeline.ingest.write.store import store_spans

    trace, t0, ms = "7" * 32, time.time_ns() - 3600 * 10**9, 10**6
    root = SpanRecord(trace, "f" * 16, "invoke_agent", t0, t0 + calls * 20 * ms, attributes={
        "gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "bench-long"})
    store_spans([root])
    history: list[dict] = [{"role": "user", "parts": [{"type": "text", "content": "Research context windows."}]}]
    batch_ms, ledger_ms = [], []
    for n in range(calls):
        ask = {"role": "assistant", "parts": [{"type": "tool_call", "id": f"call_{n}", "name": "web_search",
                                               "arguments": {"q": f"page {n}"}}]}
        result = f"result {n}: " + "context windows and tool output levels " * 30
        start = t0 + n * 20 * ms
        chat = SpanRecord(trace, f"{2 * n + 1:016x}", "chat gpt-4o", start, start + 5 * ms, parent_span_id="f" * 16,
                          attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
                                      "gen_ai.provider.name": "openai", "gen_ai.usage.input_tokens": 400 + 300 * n,
                                      "gen_ai.usage.output_tokens": 20, "gen_ai.input.messages": json.dumps(history),
                                      "gen_ai.output.messages": json.dumps([ask])})
        tool = SpanRecord(trace, f"{2 * n + 2:016x}", "execute_tool web_search", start + 6 * ms, start + 9 * ms,
                          parent_span_id="f" * 16, attributes={
                              "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "web_search",
                              "gen_ai.tool.call.id": f"call_{n}", "gen_ai.tool.call.result": result})
        before, started = ledger.seconds, time.perf_counter()
        store_spans([chat, tool])
        batch_ms.append((time.perf_counter() - started) * 1000)
        ledger_ms.append((ledger.seconds - before) * 1000)
        history += [ask, {"role": "tool", "parts": [{"type": "tool_call_response", "id": f"call_{n}",
                                                      "response": result}]}]
    return batch_ms, ledger_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    django_in_temp_dir()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from pipeline.signals import ingest_committed

    ingest_committed.disconnect(dispatch_uid="dashboard.live")  # no websocket listens here
    from pipeline.insight.costs import cost_of_input

    cost_of_input("gpt-4o", "openai", 1, None)  # loads the price database, once per process, before timing
    ledger = Ledger()

    per_span, in_ledger = standard_load(args.spans, ledger)
    print(f"standard load, {args.spans} spans in batches of 100: {per_span:.0f} µs per span stored, "
          f"{in_ledger:.1f} µs of it in the context ledger ({100 * in_ledger / per_span:.1f} %)")

    batch_ms, ledger_ms = long_conversation(args.calls, ledger)
    tenth = max(1, args.calls // 10)
    from pipeline.models import ToolCall

    first = ToolCall.objects.get(tool_call_id="call_0")
    print(f"one conversation of {args.calls} calls, each carrying every earlier result: "
          f"{statistics.mean(batch_ms[:tenth]):.1f} ms per batch over the first {tenth}, "
          f"{statistics.mean(batch_ms[-tenth:]):.1f} ms over the last {tenth}; the ledger "
          f"{statistics.mean(ledger_ms[:tenth]):.2f} ms and {statistics.mean(ledger_ms[-tenth:]):.2f} ms of it "
          f"(the first result carried {first.context_carries} times, {first.context_tokens} tokens)")
    print("reproduce:", shlex.join([".venv/bin/python", "bench/tool_context.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
