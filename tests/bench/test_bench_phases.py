"""bench/ingest_phases.py --rounds: the sides alternate ABBA, and each phase's median is reported."""

from __future__ import annotations

from bench import ingest_phases as phases


def test_two_sides_alternate_so_a_slow_spell_lands_on_both():
    assert phases.alternating(["base", "this"], 2) == ["base", "this", "this", "base"]
    assert phases.alternating(["base", "this"], 3) == ["base", "this", "this", "base", "base", "this"]
    assert phases.alternating(["this"], 2) == ["this", "this"]


def test_each_phase_is_the_median_of_its_rounds():
    rounds = [dict.fromkeys(phases.PHASES, value) for value in (300.0, 100.0, 200.0)]
    rounds[1]["store"] = 900.0  # one slow round: the mean of store would be 467
    median = phases.median_phases(rounds)
    assert median["store"] == 300.0
    assert median["decode"] == 200.0
