"""Per-stage epoch split for the training benchmarks: the clock the DistDGL loops use and the side-by-side table.

Both systems report ``stage_split_s`` in their RESULT line: per epoch, the slowest trainer's seconds in each of
:data:`STAGES` (each stage's maximum over trainers separately). distgnn's come from
``distgnn.train.epoch.EpochMeter`` (sample and fetch as the loader timed them, in the background with a
prefetch thread; forward / backward / optimizer between the loop's ``meter.mark`` calls; waiting: the time the
loop was blocked on a batch and its inputs). DistDGL's loops run inline, so their waiting is sample + fetch.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

STAGES = ("sample", "fetch", "forward", "backward", "optimizer", "wait")


class StepClock:
    """Adds up one epoch's inline stages: ``clock.start()`` before asking for a batch, ``clock.lap(stage)`` at
    the end of each of "sample", "fetch", "forward", "backward", "optimizer"."""

    def __init__(self) -> None:
        self.totals = dict.fromkeys(STAGES[:-1], 0.0)
        self._t = 0.0

    def start(self) -> None:
        self._t = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.totals[stage] += now - self._t
        self._t = now

    def values(self) -> list[float]:
        """[sample, fetch, forward, backward, optimizer] seconds (the order of :data:`STAGES`, waiting left out)."""
        return [self.totals[s] for s in STAGES[:-1]]


def inline_split(slowest: list[float]) -> list[float]:
    """An inline loop's [sample, fetch, forward, backward, optimizer] plus its waiting (sample + fetch)."""
    return [round(t, 4) for t in (*slowest, slowest[0] + slowest[1])]


def checkout_env(root: Path, own_root: Path) -> dict | None:
    """The environment that runs distgnn from the checkout ``root`` (a baseline: an export of an older commit,
    ``git archive COMMIT | tar -x -C DIR``) instead of the installed one; None for ``own_root`` itself."""
    if Path(root).resolve() == Path(own_root).resolve():
        return None
    return {**os.environ, "PYTHONPATH": str(Path(root).resolve())}


def median_split(result: dict) -> list[float] | None:
    """Median over epochs of each stage of ``result["stage_split_s"]`` (None when the run has none)."""
    epochs = result.get("stage_split_s")
    if not epochs:
        return None
    return [statistics.median(e[i] for e in epochs) for i in range(len(STAGES))]


def print_stage_table(results: dict[str, dict]) -> None:
    """Median epoch and per-stage seconds of every system side by side, then each stage's distgnn / DistDGL
    ratio for every (distgnn, DistDGL) pair."""
    pairs = [(a, b) for b in results if b.startswith("DistDGL") for a in results if not a.startswith("DistDGL")]
    width = max([10, *(len(name) for name in results), *(len(f"{a} / {b}") for a, b in pairs)])
    print(f"\nper-stage split (median over epochs of the slowest trainer's seconds per stage; {'/'.join(STAGES)})")
    header = f"{'system':<{width}} {'epoch s':>8} " + " ".join(f"{s:>9}" for s in STAGES)
    print(header)
    print("-" * len(header))
    splits = {name: median_split(r) for name, r in results.items()}
    for name, r in results.items():
        cells = " ".join(f"{t:>9.2f}" for t in splits[name]) if splits[name] else "(no split)"
        print(f"{name:<{width}} {r['epoch_time_s']:>8.2f} {cells}")
    for name, peer in pairs:
        if not splits[name] or not splits[peer]:
            continue
        ratios = " ".join(
            f"{x / y:>9.2f}" if y > 0 else f"{'-':>9}" for x, y in zip(splits[name], splits[peer], strict=True)
        )
        ratio = results[name]["epoch_time_s"] / results[peer]["epoch_time_s"]
        print(f"{f'{name} / {peer}':<{width}} {ratio:>8.2f} {ratios}")
