"""How long does one turn's span waterfall (GET /api/rounds/<id>/spans/) take to compute?

Stores one turn through the real ingest flow (`store_spans`): an agent root span, then chain
spans that each carry a graph state of --payload-kb kilobytes in `input.value` and
`output.value` (as OpenInference's LangGraph spans do), with an LLM span and a tool span under
every fifth one. Then times `dashboard.waterfall.round_waterfall()` — which reads a few
attributes with one JSON extraction per row — against only fetching every span's whole
attributes column, the read it avoids. Prints the medians of several runs.

    .venv/bin/python bench/waterfall.py [--spans 2000] [--payload-kb 20] [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_setup import django_in_temp_dir  # noqa: E402


def spans(count: int, payload_kb: int) -> list:
    from pipeline.ingest.records import SpanRecord

    trace = "b" * 32
    base = time.time_ns() - 3_600_000_000_000
    state = json.dumps({"messages": [{"type": "human", "content": "x" * 1000}] * max(1, payload_kb // 2)})
    out = [SpanRecord(trace_id=trace, span_id=f"{1:016x}", name="invoke_agent bench", parent_span_id="",
                      start_time_unix_nano=base, end_time_unix_nano=base + count * 2_000_000, status_code=1,
                      attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "bench-waterfall"})]
    node = 1
    for i in range(2, count + 1):
        start = base + i * 1_000_000
        if i % 5 == 2:
            node = i
            attrs = {"openinference.span.kind": "CHAIN", "input.value": state, "output.value": state,
                     "metadata": json.dumps({"langgraph_node": "agent", "langgraph_step": i})}
            parent, name = 1, "agent"
        elif i % 5 == 3:
            attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
                     "gen_ai.usage.input_tokens": 1200, "gen_ai.usage.output_tokens": 40}
            parent, name = node, "chat gpt-4o"
        elif i % 5 == 4:
            attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search",
                     "gen_ai.tool.call.result": "ok"}
            parent, name = node, "execute_tool search"
        else:
            attrs = {"openinference.span.kind": "CHAIN", "input.value": state[:2000]}
            parent, name = node, "should_continue"
        out.append(SpanRecord(trace_id=trace, span_id=f"{i:016x}", name=name, parent_span_id=f"{parent:016x}",
                              start_time_unix_nano=start, end_time_unix_nano=start + 500_000, status_code=1,
                              attributes=attrs))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=2000)
    parser.add_argument("--payload-kb", type=int, default=20)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()

    work = django_in_temp_dir()
    from django.core.management import call_command
    from django.db import connection

    from dashboard.waterfall import round_waterfall
    from pipeline.ingest.write.store import store_spans
    from pipeline.models import Round, Span

    call_command("migrate", verbosity=0)
    records = spans(args.spans, args.payload_kb)
    for chunk in range(0, len(records), 500):
        store_spans(records[chunk:chunk + 500])
    turn = Round.objects.get()
    stored_mb = sum(len(json.dumps(r.attributes)) for r in records) / 1e6

    def timed(fn) -> float:
        times = []
        for _ in range(args.runs):
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
        return statistics.median(times) * 1000

    result = round_waterfall(turn)
    assert (result["span_count"], len(result["spans"])) == (args.spans, min(args.spans, 2000)), result["span_count"]
    waterfall_ms = timed(lambda: round_waterfall(turn))
    whole_ms = timed(lambda: list(Span.objects.filter(trace_id=turn.trace_id).values_list("attributes", flat=True)))
    print(f"waterfall of a {args.spans}-span turn ({stored_mb:.0f} MB of attributes), {connection.vendor}: "
          f"{waterfall_ms:.0f} ms; only fetching every span's whole attributes: {whole_ms:.0f} ms "
          f"(median of {args.runs})")
    connection.close()
    shutil.rmtree(work, ignore_errors=True)
    print(f"reproduce: .venv/bin/python bench/waterfall.py --spans {args.spans} --payload-kb {args.payload_kb} "
          f"--runs {args.runs}")


if __name__ == "__main__":
    main()
