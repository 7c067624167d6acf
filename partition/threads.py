"""A rank's share of its machine's CPUs for the array steps numpy runs without the GIL.

A rank of a job with fewer ranks than its machine has CPUs splits its heaviest steps (the random assignment,
gathers, the sort of a partition's edges and its local ids, the order of its edges by partition) into contiguous
pieces run on a few threads, and reads several of its edge chunks at once: its share is the CPUs it may run on
(its affinity) divided among the machine's ranks (:func:`rank_threads`). Every split step gives the same result
as the whole step on one thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from distgnn.launch.cpus import cpus_each, local_world_size

# The smallest piece worth a thread: below it a step runs whole on the calling thread.
MIN_PIECE = 1 << 20
# Values sampled from each sorted piece to choose the splitters of a sort on several threads.
_SAMPLES = 64
# Up to this many sorted pieces are merged in place, on one thread; more, on every thread in a second array.
_MERGE_IN_PLACE = 2


def rank_threads() -> int:
    """The threads a rank may use: its share of the machine's CPUs among the job's ranks there."""
    return cpus_each(local_world_size())


class Workers:
    """``threads`` threads of one rank (the calling thread and ``threads - 1`` in a pool), splitting a step
    into pieces of at least ``min_piece`` items; create it in the rank (after any fork) and :meth:`close` it
    there."""

    def __init__(self, threads: int = 1, min_piece: int | None = None):
        self.threads = max(1, int(threads))
        self.min_piece = max(1, int(MIN_PIECE if min_piece is None else min_piece))
        self._pool = ThreadPoolExecutor(self.threads - 1, "partition-worker") if self.threads > 1 else None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def pieces(self, n: int) -> list[tuple[int, int]]:
        """``[lo, hi)`` ranges covering ``0 .. n``: one per thread, none shorter than ``min_piece`` (one
        range where ``n`` is small)."""
        k = max(1, min(self.threads, n // self.min_piece))
        bounds = [n * i // k for i in range(k + 1)]
        return list(zip(bounds[:-1], bounds[1:], strict=True))

    def run(self, fn: Callable, items: Sequence, at_once: int | None = None) -> list:
        """``[fn(item) for item in items]``, the items taken one after the other by the calling thread and
        the pool's threads (a thread busy with other work takes none), at most ``at_once`` of them running at
        a time (default: one per thread); the first error raised is raised here once every item begun has
        ended, and no item begins after it."""
        helpers_wanted = min(self.threads, len(items), max(1, at_once or self.threads)) - 1
        if self._pool is None or helpers_wanted <= 0:
            return [fn(item) for item in items]
        results: list = [None] * len(items)
        lock = threading.Lock()
        state = {"next": 0, "stop": False}
        errors: list[BaseException] = []

        def drain() -> None:
            while True:
                with lock:
                    i = state["next"]
                    if i >= len(items) or state["stop"]:
                        return
                    state["next"] = i + 1
                try:
                    results[i] = fn(items[i])
                except BaseException as exc:  # noqa: BLE001  (raised by run once every item begun has ended)
                    with lock:
                        state["stop"] = True
                        errors.append(exc)
                    return

        helpers = [self._pool.submit(drain) for _ in range(helpers_wanted)]
        try:
            drain()
        finally:
            with lock:
                state["stop"] = state["stop"] or state["next"] < len(items)
            for h in helpers:
                if not h.cancel():  # one not begun (its thread busy elsewhere) has nothing left to do
                    h.result()
        if errors:
            raise errors[0]
        return results

    def later(self, fn: Callable, *args) -> Callable[[], object]:
        """``fn(*args)`` started on a pool thread now (with one thread: when its result is asked for); returns
        the function that waits for the result and returns it (or raises its error)."""
        if self._pool is None:
            return lambda: fn(*args)
        return self._pool.submit(fn, *args).result

    def start(self, fn: Callable, *args) -> Callable[[], object]:
        """``fn(*args)`` begun now: on a pool thread, or with one thread run here at once; returns the function
        that waits for it to end and returns its result (or raises its error)."""
        if self._pool is None:
            result = fn(*args)
            return lambda: result
        return self._pool.submit(fn, *args).result

    def take(self, values: np.ndarray, positions: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``np.take(values, positions, out=out, axis=0, mode="clip")``: ``positions`` must be valid. Values
        not laid out contiguously (a column of a table) are first copied once, a piece per thread: ``np.take``
        would copy the whole of them for every piece."""
        if not values.flags.c_contiguous:
            dense = np.empty(values.shape, dtype=values.dtype)
            self.run(lambda r: np.copyto(dense[r[0] : r[1]], values[r[0] : r[1]]), self.pieces(values.shape[0]))
            values = dense

        def piece(r: tuple[int, int]) -> None:
            np.take(values, positions[r[0] : r[1]], axis=0, out=out[r[0] : r[1]], mode="clip")

        self.run(piece, self.pieces(positions.shape[0]))
        return out

    def gather(self, values: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """``values[positions]`` (``positions`` valid: it is not checked)."""
        out = np.empty((positions.shape[0], *values.shape[1:]), dtype=values.dtype)
        return self.take(values, positions, out)

    def sort(self, values: np.ndarray) -> np.ndarray:
        """The 1-D ``values`` sorted; returns the sorted array. Its pieces are sorted at once, then: with two
        pieces at most, merged in place (numpy's stable sort finds the sorted runs; ``values`` itself is
        returned); with more, in a second array (returned; ``values`` is left with its pieces sorted): the
        pieces are cut at common splitters sampled from them, and each cut's runs are copied together and
        sorted at once. (numpy's merge of many runs, on one thread, took longer than sorting the whole on one
        thread.)"""
        ranges = self.pieces(values.shape[0])
        if len(ranges) == 1:
            values.sort()
            return values
        self.run(lambda r: values[r[0] : r[1]].sort(), ranges)
        if len(ranges) <= _MERGE_IN_PLACE:
            values.sort(kind="stable")
            return values
        k = len(ranges)
        samples = np.sort(
            np.concatenate([values[lo + (hi - lo) * np.arange(1, _SAMPLES) // _SAMPLES] for lo, hi in ranges])
        )
        splitters = samples[len(samples) * np.arange(1, k) // k]
        # cuts[i, b]: where piece i's values from splitter b - 1 on begin (0 and the piece's end around them)
        cuts = np.stack(
            [np.concatenate([[lo], lo + np.searchsorted(values[lo:hi], splitters), [hi]]) for lo, hi in ranges]
        )
        sizes = (cuts[:, 1:] - cuts[:, :-1]).sum(axis=0)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        out = np.empty_like(values)

        def merge(b: int) -> None:
            at = int(starts[b])
            for i in range(k):
                lo, hi = int(cuts[i, b]), int(cuts[i, b + 1])
                out[at : at + hi - lo] = values[lo:hi]
                at += hi - lo
            out[starts[b] : starts[b + 1]].sort()

        self.run(merge, list(range(k)))
        return out

    def order_by_key(self, keys: np.ndarray, bound: int) -> np.ndarray:
        """The positions of ``keys`` (1-D, small non-negative integers below ``bound``) ordered by key, each
        key's positions ascending: ``np.argsort(keys, kind="stable")``, each piece ordered at once and its
        runs placed after the same key's runs of the pieces before it."""
        n = keys.shape[0]
        ranges = self.pieces(n)
        small = np.uint8 if bound <= (1 << 8) else np.int16 if bound <= (1 << 15) else np.int64
        if len(ranges) == 1:
            return np.argsort(keys.astype(small, copy=False), kind="stable")

        def local(r: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
            piece = keys[r[0] : r[1]]
            return np.argsort(piece.astype(small, copy=False), kind="stable"), np.bincount(piece, minlength=bound)

        parts = self.run(local, ranges)
        counts = np.stack([c for _, c in parts])  # (pieces, bound)
        # where piece i's run of key k starts in the output: every key before k, then pieces before i
        key_start = np.cumsum(counts.sum(axis=0)) - counts.sum(axis=0)
        start = key_start[None, :] + np.cumsum(counts, axis=0) - counts
        out = np.empty(n, dtype=np.int64)

        def place(i: int) -> None:
            order, c = parts[i]
            lo = ranges[i][0]
            at = 0
            for k in np.flatnonzero(c).tolist():
                m = int(c[k])
                s = int(start[i, k])
                np.add(order[at : at + m], lo, out=out[s : s + m])
                at += m

        self.run(place, list(range(len(ranges))))
        return out
