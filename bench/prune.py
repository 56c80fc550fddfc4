"""Retention: wall time and CPU of `prune` deleting everything in a database of the standard load.

The team's standard load (../shared/bench/otlp_load.py, or CTXLENS_OTLP_LOAD) is stored once, by
this checkout, on a throw-away SQLite database (bench/ingest_phases.py's in-process ingest, token
counts completed). Each round then prunes a fresh copy of it, with every conversation, span and
log record past the cutoff, in a process of its own, timing the prune alone (wall: perf_counter,
CPU: process_time). With --base, that commit's tree (a temporary git worktree) and this checkout
each prune a copy of their own in every round, each going first every other round (base, this,
this, base, …), so a slow spell of a shared machine lands on both sides; the ratios this/base of
the mean figures follow.

    .venv/bin/python bench/prune.py [--spans 10000] [--rounds 4] [--batch-size 1000] [--base <commit>]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from trees import checkout, short  # noqa: E402

DATABASE = "bench.sqlite3"


def build(spans: int, work: Path) -> None:
    """The standard load stored in `work` by this checkout (run in a child process of its own)."""
    from ingest_phases import run_here

    run_here(spans, every=5, batch=100, work=work)


def prune_here(work: Path, batch_size: int) -> dict[str, float]:
    """Prune everything in `work`'s database with the code of the current directory's tree."""
    sys.path.insert(0, os.getcwd())
    os.environ.update(DJANGO_SETTINGS_MODULE="config.settings", DATABASE_URL=f"sqlite:///{work / DATABASE}",
                      CTXLENS_ARTIFACT_DIR=str(work / "artifacts"), LOG_LEVEL="WARNING")
    os.environ.pop("REDIS_URL", None)
    import django

    django.setup()
    from datetime import timedelta

    from django.core.management import call_command
    from django.utils import timezone

    from pipeline.models import Conversation, Span
    from pipeline.retention import prune

    call_command("migrate", verbosity=0)  # a newer tree's further migrations (not timed)
    conversations, spans = Conversation.objects.count(), Span.objects.count()
    wall, cpu = time.perf_counter(), time.process_time()
    result = prune(1, batch_size=batch_size, now=timezone.now() + timedelta(days=2))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert not Span.objects.exists() and not Conversation.objects.exists(), "prune left rows behind"
    assert (result.conversations, result.spans) == (conversations, spans), "prune miscounted"
    return {"wall": wall, "cpu": cpu, "conversations": conversations, "spans": spans, "batches": result.batches}


def run_child(tree: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, __file__, *args], cwd=tree, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"bench/prune.py {' '.join(args[:1])} failed in {tree.name}:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def prune_copy(tree: Path, built: Path, batch_size: int) -> dict[str, float]:
    """Prune a fresh copy of the built database with the code of `tree`."""
    with tempfile.TemporaryDirectory(prefix="ctxlens-prune-") as tmp:
        copy = Path(tmp)
        for file in built.glob(f"{DATABASE}*"):
            shutil.copy2(file, copy / file.name)
        if (built / "artifacts").exists():
            shutil.copytree(built / "artifacts", copy / "artifacts")
        return json.loads(run_child(tree, "--prune", str(copy), "--batch-size", str(batch_size)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spans", type=int, default=10000, help="spans of the standard load stored first")
    parser.add_argument("--rounds", type=int, default=4, help="prunes per side, alternating")
    parser.add_argument("--batch-size", type=int, default=1000, help="rows per prune transaction")
    parser.add_argument("--base", help="a commit whose prune runs too, alternating with this checkout's")
    parser.add_argument("--build", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--prune", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.build:
        build(args.spans, args.build)
        return 0
    if args.prune:
        print(json.dumps(prune_here(args.prune, args.batch_size)))
        return 0

    with tempfile.TemporaryDirectory(prefix="ctxlens-prune-built-") as tmp:
        built = Path(tmp)
        run_child(ROOT, "--build", str(built), "--spans", str(args.spans))
        with checkout(args.base) if args.base else nullcontext() as base:
            sides = {f"base {short(args.base)}": base} if args.base else {}
            sides["this checkout"] = ROOT
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
            for n in range(args.rounds):  # base first, then this checkout first, and so on
                for name, tree in (list(sides.items()) if n % 2 == 0 else reversed(sides.items())):
                    runs[name].append(prune_copy(tree, built, args.batch_size))

    first = next(iter(runs.values()))[0]
    print(f"prune of everything: {first['conversations']} conversations, {first['spans']} spans "
          f"({args.spans} spans of the standard load), SQLite, batches of {args.batch_size}")
    means = {}
    for name, rounds in runs.items():
        means[name] = {key: statistics.fmean(r[key] for r in rounds) for key in ("wall", "cpu")}
        walls = ", ".join(f"{r['wall']:.2f}" for r in rounds)
        cpus = ", ".join(f"{r['cpu']:.2f}" for r in rounds)
        print(f"{name:16} wall {means[name]['wall']:6.2f} s   CPU {means[name]['cpu']:6.2f} s   "
              f"(rounds: wall {walls} s; CPU {cpus} s)")
    if args.base:
        base, this = means[f"base {short(args.base)}"], means["this checkout"]
        print(f"{'this / base':16} wall {this['wall'] / base['wall']:5.2f}x   CPU {this['cpu'] / base['cpu']:5.2f}x")
    print(f"reproduce        .venv/bin/python bench/prune.py --spans {args.spans} --rounds {args.rounds} "
          f"--batch-size {args.batch_size}" + (f" --base {short(args.base)}" if args.base else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
