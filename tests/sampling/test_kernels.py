"""The C++ sampling kernels against their numpy reference, on fresh random graphs."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from sampling_graphs import random_csc

from distgnn.errors import ExtensionBuildError
from distgnn.native import cpu as native_cpu
from distgnn.sampling import cpu, reference

IMPLS = [cpu, reference]
# Upper 0.9999 quantiles of chi-square, by degrees of freedom: loose on purpose,
# the streams are seeded so a pass is reproducible.
CHI2_CRITICAL = {1: 15.1, 2: 18.4, 4: 23.5, 5: 25.7, 19: 47.0, 29: 59.7}


def expected_counts(indptr, seeds, fanout, replace, prob=None):
    counts = []
    for s in seeds:
        start, end = indptr[s], indptr[s + 1]
        available = int(np.count_nonzero(prob[start:end] > 0)) if prob is not None else int(end - start)
        if fanout == -1:
            counts.append(available)
        elif replace:
            counts.append(fanout if available > 0 else 0)
        else:
            counts.append(min(fanout, available))
    return np.array(counts, dtype=np.int64)


def split_by_seed(counts, positions):
    return np.split(positions, np.cumsum(counts)[:-1]) if len(counts) else []


def chi_square(observed, expected):
    observed = np.asarray(observed, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    return float(((observed - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("impl", IMPLS, ids=["cpp", "reference"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanout", [0, 1, 4, 25, -1])
def test_picks_are_in_neighbours_with_right_counts(impl, index_dtype, replace, fanout):
    rng = np.random.default_rng([fanout + 1, int(replace), np.dtype(index_dtype).itemsize])
    indptr, indices = random_csc(rng, 300, 30, index_dtype)
    seeds = rng.integers(0, 300, 400)  # repeats included
    counts, positions = impl.sample_neighbors(indptr, indices, seeds, fanout, replace=replace, rng_seed=7)
    assert counts.dtype == np.int64 and positions.dtype == np.int64
    np.testing.assert_array_equal(counts, expected_counts(indptr, seeds, fanout, replace))
    assert len(positions) == counts.sum()
    for seed, picked in zip(seeds, split_by_seed(counts, positions), strict=True):
        assert np.all((picked >= indptr[seed]) & (picked < indptr[seed + 1]))
        if not replace or fanout == -1:
            assert len(np.unique(picked)) == len(picked)


@pytest.mark.parametrize("impl", IMPLS, ids=["cpp", "reference"])
@pytest.mark.parametrize("replace", [False, True])
def test_per_seed_fanouts_give_each_seed_its_own_count(impl, replace):
    rng = np.random.default_rng([11, int(replace)])
    indptr, indices = random_csc(rng, 200, 20, np.int64)
    seeds = rng.integers(0, 200, 300)
    fanouts = rng.choice([-1, 0, 2, 7], size=len(seeds))
    counts, positions = impl.sample_neighbors(indptr, indices, seeds, fanouts, replace=replace, rng_seed=3)
    for f in np.unique(fanouts):
        mine = fanouts == f
        np.testing.assert_array_equal(counts[mine], expected_counts(indptr, seeds[mine], int(f), replace))
    if impl is cpu:
        # Seed i draws from stream (rng_seed, i) whatever the others' fanouts: a call with one fanout for
        # all seeds picks the same edges for the seeds that have that fanout.
        picked = split_by_seed(counts, positions)
        for f in np.unique(fanouts):
            same_counts, same_positions = cpu.sample_neighbors(indptr, indices, seeds, int(f), replace, None, 3)
            same = split_by_seed(same_counts, same_positions)
            for i in np.flatnonzero(fanouts == f):
                np.testing.assert_array_equal(picked[i], same[i])


@pytest.mark.parametrize("replace", [False, True])
def test_all_neighbours_match_reference_exactly(replace):
    rng = np.random.default_rng(11)
    indptr, indices = random_csc(rng, 500, 12, np.int32)
    seeds = rng.integers(0, 500, 700)
    prob = rng.random(len(indices)).astype(np.float32)
    prob[rng.random(len(indices)) < 0.3] = 0
    cases = [dict(fanout=-1), dict(fanout=-1, prob=prob)]
    if not replace:
        cases += [dict(fanout=12), dict(fanout=50, prob=prob)]
    for case in cases:
        got = cpu.sample_neighbors(indptr, indices, seeds, replace=replace, **case)
        want = reference.sample_neighbors(indptr, indices, seeds, replace=replace, **case)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("impl", IMPLS, ids=["cpp", "reference"])
@pytest.mark.parametrize("replace", [False, True])
def test_weighted_never_picks_zero_weight_edges(impl, replace):
    rng = np.random.default_rng(int(replace))
    indptr, indices = random_csc(rng, 400, 20)
    prob = rng.random(len(indices)).astype(np.float32)
    prob[rng.random(len(indices)) < 0.5] = 0
    seeds = rng.integers(0, 400, 600)
    counts, positions = impl.sample_neighbors(indptr, indices, seeds, 5, replace=replace, prob=prob, rng_seed=3)
    np.testing.assert_array_equal(counts, expected_counts(indptr, seeds, 5, replace, prob))
    assert np.all(prob[positions] > 0)
    for seed, picked in zip(seeds, split_by_seed(counts, positions), strict=True):
        assert np.all((picked >= indptr[seed]) & (picked < indptr[seed + 1]))
        if not replace:
            assert len(np.unique(picked)) == len(picked)


def one_node_graph(degree: int):
    return np.array([0, degree], dtype=np.int64), np.arange(degree, dtype=np.int64)


@pytest.mark.parametrize("impl", IMPLS, ids=["cpp", "reference"])
@pytest.mark.parametrize(
    ("degree", "fanout", "replace"),
    [(20, 5, False), (30, 29, False), (200, 100, False), (20, 3, True)],
    ids=["floyd", "floyd-dense", "fisher-yates", "replace"],
)
def test_uniform_picks_are_uniform(impl, degree, fanout, replace):
    indptr, indices = one_node_graph(degree)
    trials = 4000
    seeds = np.zeros(trials, dtype=np.int64)  # each repeat of a seed draws independently
    counts, positions = impl.sample_neighbors(indptr, indices, seeds, fanout, replace=replace, rng_seed=5)
    assert np.all(counts == fanout)
    hits = np.bincount(positions, minlength=degree)
    expected = np.full(degree, trials * fanout / degree)
    # Inclusions without replacement vary less than multinomial counts, so the
    # multinomial threshold is conservative; large degrees are pooled into 20 blocks.
    group = degree // 20 if degree % 20 == 0 else 1
    blocks = hits.reshape(-1, group).sum(axis=1)
    block_expected = expected.reshape(-1, group).sum(axis=1)
    df = len(blocks) - 1
    assert chi_square(blocks, block_expected) < CHI2_CRITICAL[df]


@pytest.mark.parametrize("impl", IMPLS, ids=["cpp", "reference"])
def test_weighted_with_replacement_follows_weights(impl):
    weights = np.array([0, 1, 2, 3, 0, 4, 10], dtype=np.float32)
    indptr, indices = one_node_graph(len(weights))
    seeds = np.zeros(3000, dtype=np.int64)
    counts, positions = impl.sample_neighbors(indptr, indices, seeds, 2, replace=True, prob=weights, rng_seed=9)
    assert counts.sum() == 6000
    hits = np.bincount(positions, minlength=len(weights))
    assert hits[0] == 0 and hits[4] == 0
    nonzero = weights > 0
    expected = 6000 * weights[nonzero] / weights.sum()
    assert chi_square(hits[nonzero], expected) < CHI2_CRITICAL[4]


@pytest.mark.parametrize("impl", IMPLS, ids=["cpp", "reference"])
def test_weighted_without_replacement_is_successive_sampling(impl):
    weights = np.array([1, 0, 2, 3, 4, 10], dtype=np.float32)
    indptr, indices = one_node_graph(len(weights))
    trials = 3000
    counts, positions = impl.sample_neighbors(
        indptr, indices, np.zeros(trials, dtype=np.int64), 2, prob=weights, rng_seed=13
    )
    assert np.all(counts == 2)
    picked = positions.reshape(trials, 2)
    assert np.all(picked[:, 0] != picked[:, 1]) and not np.any(picked == 1)
    # P(j in a 2-pick) = p_j + sum_{k != j} p_k * p_j / (1 - p_k), p = normalised weights.
    p = weights / weights.sum()
    inclusion = np.array([p[j] + sum(p[k] * p[j] / (1 - p[k]) for k in range(len(p)) if k != j) for j in range(len(p))])
    hits = np.bincount(positions, minlength=len(weights))
    nonzero = weights > 0
    assert chi_square(hits[nonzero], trials * inclusion[nonzero]) < CHI2_CRITICAL[5]


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_returned_neighbors_and_take_gather_indices(index_dtype):
    rng = np.random.default_rng(8)
    indptr, indices = random_csc(rng, 3000, 30, index_dtype)
    seeds = rng.integers(0, 3000, 5000)
    counts, positions = cpu.sample_neighbors(indptr, indices, seeds, 7, rng_seed=2)
    counts2, positions2, neighbors = cpu.sample_neighbors(indptr, indices, seeds, 7, rng_seed=2, return_neighbors=True)
    np.testing.assert_array_equal(counts2, counts)
    np.testing.assert_array_equal(positions2, positions)
    assert neighbors.dtype == np.int64
    np.testing.assert_array_equal(neighbors, indices[positions])
    for threads in (1, 2):
        taken = cpu.take(indices, positions, num_threads=threads)
        assert taken.dtype == np.int64
        np.testing.assert_array_equal(taken, indices[positions])
    with pytest.raises(ValueError, match="out of range"):
        cpu.take(indices, np.array([0, len(indices)]))
    with pytest.raises(ValueError, match="int32 or int64"):
        cpu.take(indices.astype(np.float64), positions)


@pytest.mark.parametrize("prob", [False, True])
@pytest.mark.parametrize("replace", [False, True])
def test_result_does_not_depend_on_thread_count(replace, prob):
    rng = np.random.default_rng(21)
    indptr, indices = random_csc(rng, 5000, 40, np.int32)
    weights = rng.random(len(indices)).astype(np.float32) if prob else None
    seeds = rng.integers(0, 5000, 20000)
    runs = [
        cpu.sample_neighbors(indptr, indices, seeds, 10, replace, weights, rng_seed=99, num_threads=t)
        for t in (1, 2, 3, None)
    ]
    for counts, positions in runs[1:]:
        np.testing.assert_array_equal(counts, runs[0][0])
        np.testing.assert_array_equal(positions, runs[0][1])
    other = cpu.sample_neighbors(indptr, indices, seeds, 10, replace, weights, rng_seed=100)
    assert not np.array_equal(other[1], runs[0][1])


def _sample_in_child(indptr, indices, seeds, expected, queue):
    _, positions = cpu.sample_neighbors(indptr, indices, seeds, 5, rng_seed=1, num_threads=2)
    queue.put(bool(np.array_equal(positions, expected)))


def test_forked_child_can_sample_after_parent_used_threads():
    rng = np.random.default_rng(4)
    indptr, indices = random_csc(rng, 5000, 20)
    seeds = rng.integers(0, 5000, 10000)
    _, expected = cpu.sample_neighbors(indptr, indices, seeds, 5, rng_seed=1, num_threads=2)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_sample_in_child, args=(indptr, indices, seeds, expected, queue))
    child.start()
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail("sampling in a forked child hung (threads after fork)")
    assert child.exitcode == 0 and queue.get(timeout=5)


@pytest.mark.parametrize("id_range", [10**12, 2000], ids=["sparse-ids", "dense-ids"])
@pytest.mark.parametrize("num_edges", [0, 1, 5000])
def test_to_block_matches_reference(num_edges, id_range):
    rng = np.random.default_rng(num_edges)
    dst = rng.choice(id_range, 300, replace=False).astype(np.int64)
    counts = rng.multinomial(num_edges, np.full(300, 1 / 300)).astype(np.int64)
    # Sources mix destination ids and other ids, with many repeats.
    pool = np.concatenate([dst[:50], rng.integers(0, id_range, 400)])
    src = rng.choice(pool, num_edges)
    eids = rng.integers(0, 10**7, num_edges)
    got = cpu.to_block(dst, counts, src, eids)
    want = reference.to_block(dst, counts, src, eids)
    for name in ("src_nids", "indptr", "indices", "eids"):
        assert getattr(got, name).dtype == getattr(want, name).dtype
        np.testing.assert_array_equal(getattr(got, name).numpy(), getattr(want, name).numpy())
    assert got.num_dst == 300
    np.testing.assert_array_equal(got.src_nids[got.indices].numpy(), src)
    np.testing.assert_array_equal(got.dst_nids.numpy(), dst)


def test_to_block_twice_in_a_row_does_not_mix_calls():
    first = cpu.to_block(np.array([4, 2]), np.array([2, 1]), np.array([7, 4, 9]), np.array([0, 1, 2]))
    second = cpu.to_block(np.array([9]), np.array([2]), np.array([7, 3]), np.array([5, 6]))
    np.testing.assert_array_equal(first.src_nids.numpy(), [4, 2, 7, 9])
    np.testing.assert_array_equal(first.indices.numpy(), [2, 0, 3])
    np.testing.assert_array_equal(second.src_nids.numpy(), [9, 7, 3])
    np.testing.assert_array_equal(second.indices.numpy(), [1, 2])


def test_to_block_rejects_bad_input():
    dst, counts = np.array([3, 1]), np.array([1, 1])
    with pytest.raises(ValueError, match="unique"):
        cpu.to_block(np.array([3, 3]), counts, np.array([5, 6]), np.array([0, 1]))
    with pytest.raises(ValueError, match="sum"):
        cpu.to_block(dst, np.array([1, 2]), np.array([5, 6]), np.array([0, 1]))
    with pytest.raises(ValueError, match="one entry per dst"):
        cpu.to_block(dst, np.array([2]), np.array([5, 6]), np.array([0, 1]))
    with pytest.raises(ValueError, match="negative"):
        cpu.to_block(dst, counts, np.array([5, -6]), np.array([0, 1]))
    with pytest.raises(ValueError, match="integer"):
        cpu.to_block(dst, counts, np.array([5.0, 6.0]), np.array([0, 1]))


def test_sample_neighbors_rejects_bad_input():
    rng = np.random.default_rng(0)
    indptr, indices = random_csc(rng, 50, 5)
    seeds = np.array([0, 1, 2])
    cases = {
        "not a node id": dict(seeds=np.array([0, 50])),
        "is not a node id": dict(seeds=np.array([-1])),
        "indptr must have dtype int64": dict(indptr=indptr.astype(np.int32)),
        "indices must have dtype int32 or int64": dict(indices=indices.astype(np.float32)),
        "1-D integer": dict(seeds=np.array([0.0, 1.0])),
        "must be 1-D": dict(indices=indices.reshape(1, -1)),
        "C-contiguous": dict(indptr=np.repeat(indptr, 2)[::2]),
        "end at len\\(indices\\)": dict(indices=indices[:-1]),
        "prob must have dtype float32": dict(prob=np.ones(len(indices))),
        "one weight per edge": dict(prob=np.ones(len(indices) + 1, dtype=np.float32)),
        "fanout must be": dict(fanout=-2),
        "num_threads must be": dict(num_threads=0),
    }
    for message, override in cases.items():
        args = dict(indptr=indptr, indices=indices, seeds=seeds, fanout=3) | override
        with pytest.raises(ValueError, match=message):
            cpu.sample_neighbors(**args)

    corrupt = indptr.copy()
    busy = int(np.argmax(np.diff(indptr)))
    corrupt[busy + 1] = corrupt[busy] - 1
    with pytest.raises(ValueError, match="indptr is corrupt"):
        cpu.sample_neighbors(corrupt, indices, np.array([busy]), 3)
    for bad in (-1.0, np.nan, np.inf):
        prob = np.ones(len(indices), dtype=np.float32)
        prob[indptr[busy]] = bad
        with pytest.raises(ValueError, match="negative or non-finite"):
            cpu.sample_neighbors(indptr, indices, np.array([busy]), 3, prob=prob)


# A one-function extension of the same module name, on Python's C API: the cached build's compile, cache and load
# steps without the long compile of the real kernels (which the install builds with the same flags:
# setup.py and distgnn/native/cpu.py share them). The pybind11 headers the real build needs: the next test.
MINI_SOURCES = {
    "answer.h": "inline long answer() { return 42; }\n",
    "mini.cpp": """#include <Python.h>
#include "answer.h"
static PyObject* answer_py(PyObject*, PyObject*) { return PyLong_FromLong(answer()); }
static PyMethodDef methods[] = {{"answer", answer_py, METH_NOARGS, nullptr}, {nullptr, nullptr, 0, nullptr}};
static PyModuleDef mini = {PyModuleDef_HEAD_INIT, "_cpu_kernels", nullptr, -1, methods};
PyMODINIT_FUNC PyInit__cpu_kernels() {
    PyObject* m = PyModule_Create(&mini);
    if (m != nullptr && PyModule_AddStringConstant(m, "build_key", DISTGNN_BUILD_KEY) != 0) Py_CLEAR(m);
    return m;
}
""",
}
BUILD_SCRIPT = """
import logging, sys
from distgnn.native import cpu as native_cpu
logging.basicConfig(level=logging.WARNING, format="%(message)s")
source_dir, root = map(native_cpu.Path, sys.argv[1:])
module = native_cpu.load_cached_build(source_dir=source_dir, root=root)
print(module.__file__, module.answer(), module.build_key == native_cpu.build_key(source_dir))
"""


def test_cached_build_compiles_once_and_works(tmp_path):
    source_dir, root = tmp_path / "src", tmp_path / "cache"
    source_dir.mkdir()
    for name, text in MINI_SOURCES.items():
        (source_dir / name).write_text(text)
    # A fresh interpreter each time: a process imports an extension module only once.
    argv = [sys.executable, "-c", BUILD_SCRIPT, str(source_dir), str(root)]
    runs = [subprocess.run(argv, capture_output=True, text=True, timeout=300) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
        path, answer, same_key = run.stdout.split()
        assert path.startswith(str(root)) and answer == "42" and same_key == "True", run.stdout
    assert "building distgnn C++ kernels (once)" in runs[0].stderr
    assert "building" not in runs[1].stderr


def test_the_cached_build_finds_the_pybind11_headers():
    assert (Path(native_cpu.pybind11_include_dir()) / "pybind11" / "pybind11.h").is_file()


def test_missing_sources_raise_extension_build_error(tmp_path):
    with pytest.raises(ExtensionBuildError, match="sources are not at"):
        native_cpu.load_cached_build(source_dir=tmp_path / "no-sources", root=tmp_path)


def test_installed_build_of_other_sources_is_passed_over(monkeypatch):
    stale = types.SimpleNamespace(build_key="0000", __file__="stale.so")
    current = types.SimpleNamespace(build_key=native_cpu.build_key(), __file__="current.so")
    cached = object()
    monkeypatch.setattr(native_cpu, "load_cached_build", lambda: cached)
    monkeypatch.setattr(native_cpu.importlib, "import_module", lambda name: stale)
    assert native_cpu.load_extension() is cached
    monkeypatch.setattr(native_cpu.importlib, "import_module", lambda name: current)
    assert native_cpu.load_extension() is current


def test_a_process_without_torch_gives_the_kernels_torchs_default_thread_count():
    # A graph server samples without loading torch: its kernels take the threads torch would have given them.
    import os
    import subprocess
    import sys

    script = (
        "import sys\nfrom distgnn.sampling import kernels\nmine = kernels.default_threads()\n"
        "assert 'torch' not in sys.modules\nimport torch\nprint(mine, torch.get_num_threads())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    mine, torchs = out.stdout.split()
    assert mine == torchs
