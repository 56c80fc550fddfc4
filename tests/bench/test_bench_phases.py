"""bench/ingest_phases.py --rounds: the sides alternate ABBA, and each phase's median is reported."""

from __future__ import annotations

import importlib.util
import sys

from tests.conftest import ROOT


def load_phases():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("bench_ingest_phases", ROOT / "bench" / "ingest_phases.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return module


def test_two_sides_alternate_so_a_slow_spell_lands_on_both():
    phases = load_phases()
    assert phases.alternating(["base", "this"], 3) == ["base", "this", "this", "base", "base", "this"]
    assert phases.alternating(["this"], 2) == ["this", "this"]


def test_each_phase_is_the_median_of_its_rounds():
    phases = load_phases()
    rounds = [dict.fromkeys(phases.PHASES, value) for value in (300.0, 100.0, 200.0)]
    rounds[1]["store"] = 900.0  # a round slow in one phase only does not move the others
    median = phases.median_phases(rounds)
    assert median["store"] == 300.0
    assert median["decode"] == 200.0
