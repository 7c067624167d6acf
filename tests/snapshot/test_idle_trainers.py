"""A snapshot job that cannot give every trainer work says so at start, with the remedy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from distgnn.snapshot.schedule import idle_trainers_warning, make_plan, make_windows

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "snapshot"


@pytest.fixture(scope="module")
def warning_of():
    def warning(schedule: str, num_train: int, window: int, world: int) -> str | None:
        windows = make_windows(num_train, window)
        plan = make_plan(schedule, np.ones(num_train), windows, world)
        return idle_trainers_warning(plan, len(windows), num_train, window)

    return warning


def test_one_window_on_two_trainers_names_the_idle_one_and_the_remedy(warning_of):
    # The default --window 0 makes the 16 training snapshots one window: BLAD gives it to one trainer.
    text = warning_of("blad", 16, 0, 2)
    assert text == (
        "--window 0 cuts the 16 training samples into 1 window(s) for 2 trainers: trainer(s) 1 have nothing to "
        "train and the others do all the work every epoch; pass --window 8 or shorter, or --schedule contiguous or "
        "vertex (they split within a window)"
    )
    assert "trainer(s) 3 " in warning_of("blad", 16, 6, 4)  # 3 windows of 6, 6 and 4 for 4 trainers
    assert "give at least 4 training snapshots" in warning_of("blad", 3, 0, 4)


@pytest.mark.parametrize(
    "schedule, window, world", [("blad", 8, 2), ("blad", 3, 2), ("contiguous", 0, 2), ("vertex", 0, 4), ("blad", 0, 1)]
)
def test_every_trainer_busy_is_no_warning(warning_of, schedule, window, world):
    assert warning_of(schedule, 16, window, world) is None
