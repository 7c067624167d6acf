"""The snapshot schedules: windows, BLAD's balance on sequences of known costs, the contiguous hand-off."""

from __future__ import annotations

import numpy as np
import pytest

from distgnn.errors import InputError
from distgnn.snapshot.schedule import (
    Segment,
    blad_plan,
    contiguous_plan,
    make_plan,
    make_windows,
    window_costs,
)


def test_windows_cover_the_span_once():
    assert [(w.start, w.stop) for w in make_windows(10, 4)] == [(0, 4), (4, 8), (8, 10)]
    assert [(w.start, w.stop) for w in make_windows(10, 0)] == [(0, 10)]
    with pytest.raises(InputError, match="--window 11 is longer than the 10 training snapshots"):
        make_windows(10, 11)


@pytest.mark.parametrize("trainers, contiguous_at_least", [(2, 1.3), (4, 1.5)])
@pytest.mark.parametrize("shape", ["growing", "bursty"])
def test_blad_balances_where_contiguous_does_not(trainers, contiguous_at_least, shape):
    rng = np.random.default_rng(0)
    t = np.arange(200)
    costs = 1000 + 50 * t if shape == "growing" else 1000 + 50 * t * rng.lognormal(0, 0.8, 200)
    windows = make_windows(200, 4)
    blad = make_plan("blad", costs, windows, trainers)
    contiguous = make_plan("contiguous", costs, windows, trainers)
    assert contiguous.imbalance() >= contiguous_at_least
    assert blad.imbalance() <= 1.1
    # Every window runs exactly once, on one trainer.
    ran = sorted(s.window for segs in blad.segments for s in segs)
    assert ran == list(range(len(windows)))
    np.testing.assert_allclose(sum(blad.loads), costs.sum())


def test_blad_balance_is_exact_on_known_costs():
    # Windows of costs 5, 4, 3, 3, 3 on 2 trainers: 9 each (longest first gives 5+3+3 / 4+3 = 11 / 7).
    costs = np.array([5.0, 4, 3, 3, 3])
    windows = make_windows(5, 1)
    plan = blad_plan(costs, windows, 2)
    assert sorted(plan.loads) == [9.0, 9.0] and plan.imbalance() == 1.0
    assert all([s.start for s in segs] == sorted(s.start for s in segs) for segs in plan.segments)


def test_two_processes_per_device_get_opposite_orders():
    costs = np.arange(1.0, 17.0)
    plan = blad_plan(costs, make_windows(16, 1), 4, procs_per_device=2)
    assert plan.imbalance() <= 1.05
    for device in range(2):
        heavy_first = [costs[s.window] for s in plan.segments[2 * device]]
        light_first = [costs[s.window] for s in plan.segments[2 * device + 1]]
        assert heavy_first == sorted(heavy_first, reverse=True)
        assert light_first == sorted(light_first)
    with pytest.raises(InputError, match="positive multiple of --procs-per-gpu"):
        blad_plan(costs, make_windows(16, 1), 3, procs_per_device=2)


def test_contiguous_hands_state_across_range_boundaries():
    windows = make_windows(12, 5)  # [0,5) [5,10) [10,12)
    plan = contiguous_plan(np.ones(12), windows, 3)  # ranges [0,4) [4,8) [8,12)
    assert plan.segments[0] == [Segment(0, 0, 4, sends=True)]
    # Trainer 1: its sending segment first, then the receiving one.
    assert plan.segments[1] == [Segment(1, 5, 8, sends=True), Segment(0, 4, 5, receives=True)]
    assert plan.segments[2] == [Segment(1, 8, 10, receives=True), Segment(2, 10, 12)]
    whole = contiguous_plan(np.ones(12), make_windows(12, 0), 3)
    assert whole.segments[1] == [Segment(0, 4, 8, receives=True, sends=True)]


def test_vertex_plan_runs_everything_everywhere_and_measured_costs_steer_blad():
    windows = make_windows(8, 2)
    plan = make_plan("vertex", np.ones(8), windows, 2)
    assert plan.vertex_split and all(len(segs) == 4 for segs in plan.segments)
    measured = np.array([10.0, 1, 1, 8])
    plan = make_plan("blad", np.ones(8), windows, 2, measured=measured)
    assert sorted(plan.loads) == [10.0, 10.0]
    np.testing.assert_allclose(window_costs(np.arange(8.0), windows), [1, 5, 9, 13])
    with pytest.raises(InputError, match="expected one of blad, contiguous, vertex"):
        make_plan("random", np.ones(8), windows, 2)
