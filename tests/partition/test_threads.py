"""A rank's array steps split over threads give the same result as on one thread."""

import threading
import time

import numpy as np
import pytest

from distgnn.partition.reshuffle import stable_order
from distgnn.partition.threads import Workers, rank_threads


@pytest.fixture
def workers():
    w = Workers(3, min_piece=1000)
    yield w
    w.close()


def test_pieces_cover_the_range_and_small_steps_stay_whole(workers):
    assert workers.pieces(10_000) == [(0, 3333), (3333, 6666), (6666, 10_000)]
    assert workers.pieces(2500) == [(0, 1250), (1250, 2500)]
    assert workers.pieces(999) == [(0, 999)]
    assert workers.pieces(0) == [(0, 0)]


def test_stable_order_on_threads_equals_the_stable_argsort(workers):
    keys = np.random.default_rng(0).integers(0, 50, 10_007).astype(np.int64)
    expected = np.argsort(keys, kind="stable")
    np.testing.assert_array_equal(stable_order(keys.copy(), 50, workers), expected)


@pytest.mark.parametrize("bound", [3, 8, 300])
def test_order_by_key_equals_the_stable_argsort(workers, bound):
    keys = np.random.default_rng(bound).integers(0, bound, 10_001)
    keys[:100] = bound - 1  # a key that only some pieces hold
    np.testing.assert_array_equal(workers.order_by_key(keys, bound), np.argsort(keys, kind="stable"))


def test_gather_and_sort(workers):
    rng = np.random.default_rng(1)
    values = rng.integers(0, 1 << 40, (5000, 3))
    positions = rng.integers(0, 5000, 7000)
    # columns of a table (not contiguous): copied once, then gathered a piece per thread
    np.testing.assert_array_equal(workers.gather(values[:, 1], positions), values[:, 1][positions])
    np.testing.assert_array_equal(workers.gather(values[:, 1:], positions), values[:, 1:][positions])
    np.testing.assert_array_equal(workers.gather(values[::2, 0], positions % 2500), values[::2, 0][positions % 2500])
    flat = rng.integers(0, 1 << 40, 9000)
    expected = np.sort(flat)
    np.testing.assert_array_equal(workers.sort(flat), expected)


@pytest.mark.parametrize("threads", [2, 3, 7])
@pytest.mark.parametrize("values", ["distinct", "few", "sorted", "reversed", "one value"])
def test_a_sort_on_threads_equals_numpys(threads, values):
    rng = np.random.default_rng(threads)
    n = 20_011
    flat = {
        "distinct": rng.permutation(n).astype(np.int64) << 20,
        "few": rng.integers(0, 5, n),  # many values equal to a splitter
        "sorted": np.arange(n, dtype=np.int64),
        "reversed": np.arange(n, 0, -1, dtype=np.int64),
        "one value": np.full(n, 7, dtype=np.int64),
    }[values]
    workers = Workers(threads, min_piece=1000)
    try:
        np.testing.assert_array_equal(workers.sort(flat.copy()), np.sort(flat))
        small = flat[:999].copy()  # one piece: sorted in place
        assert workers.sort(small) is small and np.array_equal(small, np.sort(flat[:999]))
    finally:
        workers.close()


def test_an_error_in_a_piece_is_raised_after_every_piece_begun_has_ended(workers):
    begun, ended = [], []

    def piece(i):
        begun.append(i)
        time.sleep(0.01)
        if i == 1:
            raise ValueError(f"piece {i}")
        ended.append(i)

    with pytest.raises(ValueError, match="piece 1"):
        workers.run(piece, list(range(50)))
    assert len(begun) < 50  # none begins after the error
    assert sorted(ended) == sorted(set(begun) - {1})


@pytest.mark.parametrize("at_once", [1, 2, None])
def test_at_most_at_once_items_run_together(workers, at_once):
    running, most = [0], [0]
    lock = threading.Lock()

    def item(i):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.005)
        with lock:
            running[0] -= 1
        return i * 3

    assert workers.run(item, range(30), at_once=at_once) == [i * 3 for i in range(30)]
    assert most[0] <= (at_once or workers.threads)
    assert most[0] >= 1


def test_a_busy_thread_leaves_the_items_to_the_others():
    workers = Workers(2)
    try:
        slow = workers.later(time.sleep, 0.3)  # the pool's one thread busy
        start = time.perf_counter()
        assert workers.run(lambda i: i * 2, list(range(20))) == [i * 2 for i in range(20)]
        assert time.perf_counter() - start < 0.25
        slow()
    finally:
        workers.close()


def test_start_runs_beside_the_caller_with_a_pool_and_at_once_without():
    events = []
    workers = Workers(2)
    try:
        gate = threading.Event()
        done = workers.start(lambda: (gate.wait(5), events.append("pool"), 7)[-1])
        events.append("caller")  # the call above returned before its function ended
        gate.set()
        assert done() == 7 and events == ["caller", "pool"]
        failed = workers.start(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failed()
    finally:
        workers.close()
    alone = Workers(1)
    events.clear()
    done = alone.start(lambda: events.append("ran") or 3)
    assert events == ["ran"] and done() == 3  # no pool: run at once, not when asked for


def test_a_rank_gets_its_share_of_the_cpus(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    for ranks, threads in (("8", 2), ("1", 16), ("32", 1)):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", ranks)
        assert rank_threads() == threads
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert rank_threads() == 16  # unset: one rank on the machine


@pytest.mark.parametrize("bound", [5000, None])  # by a table of marks, by a sort
def test_distinct_with_index_on_threads_equals_one_thread(workers, bound):
    from distgnn.partition.reshuffle import distinct_with_index

    values = np.random.default_rng(3).integers(0, 5000, 8000)
    expected = distinct_with_index(values, bound)
    got = distinct_with_index(values, bound, workers)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])


@pytest.mark.parametrize("threads", [1, 3])
def test_stable_order_starts_are_the_indptr_of_the_keys(threads):
    from distgnn.partition.reshuffle import stable_order_starts

    keys = np.random.default_rng(4).integers(0, 700, 9001)
    keys[keys == 5] = 6  # a key with no entries
    workers = Workers(threads, min_piece=100)
    try:
        order, starts = stable_order_starts(keys.copy(), 700, workers)
    finally:
        workers.close()
    np.testing.assert_array_equal(order, np.argsort(keys, kind="stable"))
    np.testing.assert_array_equal(starts, np.concatenate([[0], np.cumsum(np.bincount(keys, minlength=700))]))


@pytest.mark.parametrize("threads", [1, 3])
def test_local_indices_number_the_halo_after_the_owned_nodes(threads):
    from distgnn.partition.reshuffle import local_indices

    n0, n1, bound = 300, 500, 2000
    srcs = np.random.default_rng(5).integers(0, bound, 12_000).astype(np.int32)
    workers = Workers(threads, min_piece=1000)
    try:
        halo, indices = local_indices(srcs, n0, n1, bound, workers)
    finally:
        workers.close()
    remote = (srcs < n0) | (srcs >= n1)
    np.testing.assert_array_equal(halo, np.unique(srcs[remote]))
    assert indices.dtype == np.int32
    local2global = np.concatenate([np.arange(n0, n1), halo])
    np.testing.assert_array_equal(local2global[indices], srcs)  # every local id maps back to its source
