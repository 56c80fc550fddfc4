"""Where ingest's CPU goes, phase by phase, in one process: µs of CPU per span for decoding,
validating and normalising, the ingest transaction, the deferred token counts and the finding
counts refresh.

The team's standard load (../shared/bench/otlp_load.py, or CTXLENS_OTLP_LOAD) is built, then
stored batch by batch on a throw-away SQLite database in this process, with no server and no
background threads: after every `--every` requests the deferred counts and the finding counts are
completed on this thread (the server runs them at most once a second), so each phase's CPU is
its own (time.thread_time). With --base, that commit's tree (a temporary git worktree) runs the
same load first, in a process of its own, and the ratios this/base follow. On a shared machine
the same code's CPU per span varied by up to a third from one run to the next here, so compare
with --rounds N: the two sides alternate (base, this, this, base, …), and each phase's median
over the rounds is reported, with every round's total.

    .venv/bin/python bench/ingest_phases.py [--spans 10000] [--every 5] [--batch 100] [--base <commit>] [--rounds 2]

--batch sets the spans per request, and so per transaction: `--batch 400` against `--batch 100`
is what the ingest writer's group commit gains when it joins four queued requests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from trees import checkout, short  # noqa: E402

PHASES = ("decode", "prepare", "store", "deferred", "findings")


def run_here(spans: int, every: int, batch: int = 100, work: Path | None = None,
             after_request: Callable[[], None] | None = None) -> dict[str, float]:
    """The phases' CPU per span (µs) of the code in the current directory's tree; the database is
    `work`/bench.sqlite3 (a new temporary directory when None), left there for the caller, who may
    also look at it after each request's transaction (`after_request`, not timed)."""
    sys.path.insert(0, os.getcwd())
    work = work or Path(tempfile.mkdtemp(prefix="ctxlens-bench-"))
    os.environ.update(DJANGO_SETTINGS_MODULE="config.settings", DATABASE_URL=f"sqlite:///{work / 'bench.sqlite3'}",
                      CTXLENS_ARTIFACT_DIR=str(work / "artifacts"), LOG_LEVEL="WARNING")
    os.environ.pop("REDIS_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    from ingest import load_generator  # bench/ingest.py: the load generator beside the repository
    from pipeline.ingest.decode import otlp
    from pipeline.ingest.write import deferred
    from pipeline.ingest.write.store import prepare_spans, store_prepared
    from pipeline.insight import finding_counts
    from pipeline.signals import ingest_committed

    call_command("migrate", verbosity=0)
    deferred.schedule = lambda: None  # completed below, on this thread
    ingest_committed.disconnect(dispatch_uid="pipeline.finding_counts")
    ingest_committed.disconnect(dispatch_uid="dashboard.live")
    bodies = [r.SerializeToString() for r in load_generator().build_requests(spans, batch, run_id="phases")]
    cpu = dict.fromkeys(PHASES, 0.0)

    def timed(phase: str, work):
        began = time.thread_time()
        result = work()
        cpu[phase] += time.thread_time() - began
        return result

    for i, body in enumerate(bodies):
        records = timed("decode", lambda: otlp.decode_traces_protobuf(body).spans)
        batch = timed("prepare", lambda: prepare_spans(records))
        timed("store", lambda: store_prepared(batch))
        if after_request:
            after_request()
        if (i + 1) % every == 0 or i == len(bodies) - 1:
            timed("deferred", deferred.complete_pending)
            timed("findings", finding_counts.refresh_stale)
    return {phase: seconds / spans * 1e6 for phase, seconds in cpu.items()}


def measure(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    done = subprocess.run([sys.executable, __file__, "--child", "--spans", str(args.spans), "--every", str(args.every),
                           "--batch", str(args.batch)], cwd=tree, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def alternating(sides: list[str], rounds: int) -> list[str]:
    """The order of the runs: ABBA for two sides (a slow spell of the machine lands on both), else each in turn."""
    order: list[str] = []
    for n in range(rounds):
        order += sides if n % 2 == 0 else sides[::-1]
    return order


def median_phases(measured: list[dict[str, float]]) -> dict[str, float]:
    return {phase: statistics.median(run[phase] for run in measured) for phase in PHASES}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spans", type=int, default=10000)
    parser.add_argument("--every", type=int, default=5, help="requests between background runs")
    parser.add_argument("--batch", type=int, default=100, help="spans per request (per transaction)")
    parser.add_argument("--base", help="a commit to measure first, in the same run")
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of each side, alternating (ABBA with --base); each phase's median is reported")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_here(args.spans, args.every, args.batch)))
        return 0
    if args.rounds < 1:
        parser.error("--rounds must be 1 or more")
    base_side = f"base {short(args.base)}" if args.base else None
    sides = [base_side, "this checkout"] if base_side else ["this checkout"]
    measured: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    with checkout(args.base) if args.base else nullcontext() as base_tree:
        trees = {"this checkout": ROOT, **({base_side: base_tree} if base_side else {})}
        for side in alternating(sides, args.rounds):
            measured[side].append(measure(trees[side], args))
    runs = {side: median_phases(rounds) for side, rounds in measured.items()}
    many = f", each phase the median of {args.rounds} alternating rounds (total: their sum)" if args.rounds > 1 else ""
    print(f"CPU per span (µs), {args.spans} spans of the standard load in requests of {args.batch}, SQLite, "
          f"background work every {args.every} requests{many}")
    print(f"{'':16}" + "".join(f"{phase:>10}" for phase in PHASES) + f"{'total':>10}")
    for name, phases in runs.items():
        print(f"{name:16}" + "".join(f"{phases[p]:10.1f}" for p in PHASES) + f"{sum(phases.values()):10.1f}")
    if base_side:
        before, after = runs[base_side], runs["this checkout"]
        print(f"{'this / base':16}" + "".join(f"{after[p] / before[p]:9.2f}x" for p in PHASES)
              + f"{sum(after.values()) / sum(before.values()):9.2f}x")
    if args.rounds > 1:
        for side, rounds in measured.items():
            print(f"{side:16}total by round: " + ", ".join(f"{sum(r.values()):.1f}" for r in rounds))
    print(f"reproduce       .venv/bin/python bench/ingest_phases.py --spans {args.spans} --every {args.every} "
          f"--batch {args.batch}"
          + (f" --base {args.base}" if args.base else "") + (f" --rounds {args.rounds}" if args.rounds > 1 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
