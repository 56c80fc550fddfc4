"""The live fan-out's frame budget (dashboard/hub.py), on explicit clock readings."""

from __future__ import annotations

from dashboard.hub import FrameBudget


def test_the_frame_budget_lets_a_few_frames_go_at_once_then_one_per_interval():
    budget = FrameBudget(interval=1.0, burst=4)
    for _ in range(4):  # after a quiet spell: back to back
        assert budget.wait(100.0) == 0
        budget.spend(100.0)
    assert budget.wait(100.0) == 1.0
    for now in (101.0, 102.0, 103.0):  # sustained: one per interval, never a second burst
        assert budget.wait(now) == 0
        budget.spend(now)
        assert budget.wait(now) == 1.0
    assert budget.wait(103.5) == 0.5
    for _ in range(2):  # two intervals quiet: two frames at once, then a wait
        assert budget.wait(105.0) == 0
        budget.spend(105.0)
    assert budget.wait(105.0) == 1.0
    for _ in range(4):  # a long quiet spell refills the burst, no more
        assert budget.wait(120.0) == 0
        budget.spend(120.0)
    assert budget.wait(120.0) == 1.0
