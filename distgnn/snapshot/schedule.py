"""Which trainer runs which snapshots: BLAD's balanced groups, the contiguous split, the vertex split.

Training samples are windows of consecutive snapshots (:func:`make_windows`); the recurrent state starts from
zero at each window, so windows do not depend on each other and form the groups a scheduler moves around.

* ``blad`` (:func:`blad_plan`): two levels, after BLAD. Level one assigns groups to devices by cost (longest
  processing time first, then moves and swaps off the heaviest device while they help); level two shares each
  device's groups among the processes on it the same way and orders them: with one process a device runs its
  groups in time order, with two, one runs heavy groups first and the other light ones first, so that a
  compute-heavy step of one meets a lighter one of the other.
* ``contiguous`` (:func:`contiguous_plan`): snapshot partition; equal-count contiguous snapshot ranges. A window
  cut by a range boundary hands its state on to the next trainer (a :class:`Segment` that sends / receives).
* ``vertex`` (:func:`vertex_plan`): every trainer runs every window on its share of the vertices.

A group's cost is the vertices plus edges of its snapshots, or a measured time per window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from distgnn.errors import InputError

SCHEDULES = ("blad", "contiguous", "vertex")


@dataclass(frozen=True)
class Window:
    """Snapshots ``start .. stop - 1`` trained as one sequence from a zero state."""

    index: int
    start: int
    stop: int


@dataclass(frozen=True)
class Segment:
    """The part ``start .. stop - 1`` of window ``window`` that one trainer runs.

    ``receives``: its initial state comes from the previous trainer (which ran the window's part before it);
    ``sends``: its final state goes to the next trainer.
    """

    window: int
    start: int
    stop: int
    receives: bool = False
    sends: bool = False


@dataclass
class Plan:
    """Per trainer, the segments it runs, in order, and their estimated cost.

    Attributes:
        schedule: ``blad``, ``contiguous`` or ``vertex``.
        segments: ``segments[rank]`` in run order.
        loads: ``loads[rank]``: estimated cost of trainer ``rank``'s segments.
        vertex_split: True when each trainer runs its segments on its share of every snapshot's vertices.
    """

    schedule: str
    segments: list[list[Segment]]
    loads: list[float] = field(default_factory=list)
    vertex_split: bool = False

    @property
    def num_trainers(self) -> int:
        return len(self.segments)

    def imbalance(self) -> float:
        """Max over mean of the trainers' estimated loads (1.0 = perfectly balanced)."""
        loads = np.asarray(self.loads, np.float64)
        return float(loads.max() / loads.mean()) if loads.mean() > 0 else 1.0


def make_windows(num_snapshots: int, window: int) -> list[Window]:
    """Consecutive non-overlapping windows of ``window`` snapshots (the last may be shorter); 0: one window of all.

    Raises:
        InputError: a window longer than the sequence, or negative.
    """
    if window < 0:
        raise InputError(f"--window {window}: give 0 (the whole span) or a positive number of snapshots")
    if window > num_snapshots:
        raise InputError(
            f"--window {window} is longer than the {num_snapshots} training snapshots; give at most {num_snapshots}"
        )
    size = window or num_snapshots
    return [Window(i, s, min(s + size, num_snapshots)) for i, s in enumerate(range(0, num_snapshots, size))]


def window_costs(snapshot_costs: np.ndarray, windows: list[Window]) -> np.ndarray:
    """``(len(windows),)`` float64: the summed cost of each window's snapshots."""
    prefix = np.concatenate([[0.0], np.cumsum(snapshot_costs, dtype=np.float64)])
    return np.array([prefix[w.stop] - prefix[w.start] for w in windows])


def _lpt(costs: np.ndarray, items: list[int], bins: int) -> list[list[int]]:
    """Longest processing time first, then single moves and pairwise swaps off the heaviest bin while they
    lower it."""
    assignment: list[list[int]] = [[] for _ in range(bins)]
    loads = np.zeros(bins)
    for i in sorted(items, key=lambda i: -costs[i]):
        b = int(np.argmin(loads))
        assignment[b].append(i)
        loads[b] += costs[i]
    for _ in range(10 * len(items) + 10):
        hi, lo = int(np.argmax(loads)), int(np.argmin(loads))
        gap = loads[hi] - loads[lo]
        best, best_gain = None, 1e-12
        for i in assignment[hi]:
            # Moving i: the pair's new max is max(hi - c, lo + c); the gain is the drop of hi's load.
            if costs[i] < gap and min(costs[i], gap - costs[i]) > best_gain:
                best, best_gain = (i, None), min(costs[i], gap - costs[i])
            for j in assignment[lo]:
                d = costs[i] - costs[j]
                if 0 < d < gap and min(d, gap - d) > best_gain:
                    best, best_gain = (i, j), min(d, gap - d)
        if best is None:
            break
        i, j = best
        assignment[hi].remove(i)
        assignment[lo].append(i)
        loads[hi] -= costs[i]
        loads[lo] += costs[i]
        if j is not None:
            assignment[lo].remove(j)
            assignment[hi].append(j)
            loads[lo] -= costs[j]
            loads[hi] += costs[j]
    return assignment


def blad_plan(costs: np.ndarray, windows: list[Window], num_trainers: int, procs_per_device: int = 1) -> Plan:
    """BLAD's two-level plan over ``windows`` whose costs are ``costs`` (``(len(windows),)``).

    Args:
        costs: per window (e.g. :func:`window_costs`, or measured seconds).
        windows: the groups to place.
        num_trainers: trainer processes; consecutive ranks share a device ``procs_per_device`` at a time.
        procs_per_device: 1, or 2 when two processes share a GPU.
    """
    _check_trainers(num_trainers, procs_per_device)
    costs = np.asarray(costs, np.float64)
    devices = _lpt(costs, list(range(len(windows))), num_trainers // procs_per_device)
    segments: list[list[Segment]] = []
    for groups in devices:
        procs = _lpt(costs, groups, procs_per_device) if procs_per_device > 1 else [groups]
        for p, mine in enumerate(procs):
            if procs_per_device == 1:
                order = sorted(mine, key=lambda i: windows[i].start)
            else:
                order = sorted(mine, key=lambda i: (-costs[i] if p % 2 == 0 else costs[i], windows[i].start))
            segments.append([Segment(i, windows[i].start, windows[i].stop) for i in order])
    loads = [float(sum(costs[s.window] for s in segs)) for segs in segments]
    return Plan("blad", segments, loads)


def contiguous_plan(snapshot_costs: np.ndarray, windows: list[Window], num_trainers: int) -> Plan:
    """Snapshot partition: trainer ``r`` runs snapshots ``[r T / P, (r + 1) T / P)`` of whichever windows they
    belong to; a window cut at a boundary continues on the next trainer from the state handed on.

    Each trainer runs its last (sending) segment first, then its first (receiving) one, then the rest, so a
    trainer waits only for its predecessor's last segment, not for all its work; when one window covers the
    whole range, the trainers form a pipeline.
    """
    _check_trainers(num_trainers, 1)
    num_snapshots = windows[-1].stop
    bounds = [round(r * num_snapshots / num_trainers) for r in range(num_trainers + 1)]
    snapshot_costs = np.asarray(snapshot_costs, np.float64)
    segments, loads = [], []
    for r in range(num_trainers):
        lo, hi = bounds[r], bounds[r + 1]
        mine = [
            Segment(w.index, max(w.start, lo), min(w.stop, hi), receives=w.start < lo, sends=w.stop > hi)
            for w in windows
            if w.start < hi and w.stop > lo
        ]
        first = [s for s in mine if s.sends and not s.receives]
        second = [s for s in mine if s.receives]
        rest = [s for s in mine if s not in first and s not in second]
        segments.append(first + second + rest)
        loads.append(float(snapshot_costs[lo:hi].sum()))
    return Plan("contiguous", segments, loads)


def vertex_plan(snapshot_costs: np.ndarray, windows: list[Window], num_trainers: int) -> Plan:
    """Every trainer runs every window on its vertex share (node ``v`` belongs to trainer ``v % P``); the
    estimated load is an even share of the total."""
    _check_trainers(num_trainers, 1)
    share = float(np.sum(snapshot_costs)) / num_trainers
    segments = [[Segment(w.index, w.start, w.stop) for w in windows] for _ in range(num_trainers)]
    return Plan("vertex", segments, [share] * num_trainers, vertex_split=True)


def make_plan(
    schedule: str,
    snapshot_costs: np.ndarray,
    windows: list[Window],
    num_trainers: int,
    procs_per_device: int = 1,
    measured: np.ndarray | None = None,
) -> Plan:
    """The plan of ``schedule`` over ``windows``; BLAD balances ``measured`` per-window costs when given, else
    the vertices + edges in ``snapshot_costs`` (``(T,)``)."""
    if schedule == "blad":
        costs = window_costs(snapshot_costs, windows) if measured is None else measured
        return blad_plan(costs, windows, num_trainers, procs_per_device)
    if schedule == "contiguous":
        return contiguous_plan(snapshot_costs, windows, num_trainers)
    if schedule == "vertex":
        return vertex_plan(snapshot_costs, windows, num_trainers)
    raise InputError(f"--schedule {schedule!r}: expected one of {', '.join(SCHEDULES)}")


def _check_trainers(num_trainers: int, procs_per_device: int) -> None:
    if num_trainers < 1 or procs_per_device < 1 or num_trainers % procs_per_device:
        raise InputError(
            f"{num_trainers} trainers with {procs_per_device} per device: give a positive multiple of "
            "--procs-per-gpu trainers"
        )


def idle_trainers_warning(plan: Plan, num_windows: int, num_train: int, window: int) -> str | None:
    """What to say when some trainers of ``plan`` get no window to train (the schedule has fewer windows than
    trainers), with the remedy; None when every trainer has work."""
    idle = [rank for rank, segments in enumerate(plan.segments) if not segments]
    if not idle:
        return None
    world = plan.num_trainers
    fits = num_train // world  # the longest window that still gives each trainer one
    remedy = f"pass --window {fits} or shorter" if fits > 0 else f"give at least {world} training snapshots"
    return (
        f"--window {window} cuts the {num_train} training samples into {num_windows} window(s) for {world} trainers: "
        f"trainer(s) {', '.join(map(str, idle))} have nothing to train and the others do all the work every epoch; "
        f"{remedy}, or --schedule contiguous or vertex (they split within a window)"
    )
