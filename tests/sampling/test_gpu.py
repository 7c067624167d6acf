"""The GPU sampler (distgnn.sampling.gpu) against the sampling semantics, on fresh random graphs.

CPU-only machines run the fallback and validation tests; the CUDA tests skip without a GPU and cover both
tiers (CSC on the GPU, and pinned host memory read zero-copy), int32 and int64 indices, with and without
replacement, empty seed lists and zero-degree nodes, each fill path (groups of 1..32 lanes per seed for
fanouts up to 32, a warp per seed above and for -1), both output paths (sized before the sync, and after it
for fanout -1 or a large num_seeds * fanout), and the picks against a numpy re-implementation of the
documented random stream.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sampling_graphs import random_csc

from distgnn.sampling import gpu, kernels

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
# Upper 0.9999 quantiles of chi-square by degrees of freedom (scipy.stats.chi2.ppf): loose on purpose.
CHI2_CRITICAL = {14: 42.6, 19: 50.8, 29: 66.2, 59: 108.2}
# Fanouts that reach every fill path: 1, 2, 4, 8, 16 and 32 lanes per seed, a warp per seed (> 32), all (-1).
PATH_FANOUTS = [0, 1, 2, 3, 5, 8, 15, 25, 32, 33, 100, -1]


def expected_counts(indptr, seeds, fanout, replace):
    degrees = indptr[seeds + 1] - indptr[seeds]
    if fanout == -1:
        return degrees
    if replace:
        return np.where(degrees > 0, fanout, 0)
    return np.minimum(degrees, fanout)


def place(array: np.ndarray, tier: str) -> torch.Tensor:
    tensor = torch.from_numpy(array)
    return tensor.cuda() if tier == "device" else tensor.pin_memory()


def check_groups(indptr, indices, seeds, fanout, replace, counts, positions, neighbors=None):
    """Counts as specified, every position inside its seed's CSC range, no repeats without replacement."""
    np.testing.assert_array_equal(counts, expected_counts(indptr, seeds, fanout, replace))
    assert len(positions) == counts.sum()
    groups = np.split(positions, np.cumsum(counts)[:-1]) if len(counts) else []
    for seed, group in zip(seeds, groups, strict=True):
        assert np.all((group >= indptr[seed]) & (group < indptr[seed + 1]))
        if not replace or fanout == -1:
            assert len(np.unique(group)) == len(group)
    if neighbors is not None:
        np.testing.assert_array_equal(neighbors, indices[positions].astype(np.int64))


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_LOW32 = np.uint64(0xFFFFFFFF)


def _mix64(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _mulhi64(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The high 64 bits of a * b (CUDA's __umul64hi), from 32-bit halves."""
    a_lo, a_hi, b_lo, b_hi = a & _LOW32, a >> np.uint64(32), b & _LOW32, b >> np.uint64(32)
    lo_hi, hi_lo = a_lo * b_hi, a_hi * b_lo
    cross = ((a_lo * b_lo) >> np.uint64(32)) + (hi_lo & _LOW32) + lo_hi
    return a_hi * b_hi + (hi_lo >> np.uint64(32)) + (cross >> np.uint64(32))


def stream_reference(indptr, seeds, fanout, replace, rng_seed):
    """The GPU sampler's documented picks (csrc/cuda/sample.cu): splitmix64 draws keyed by (rng_seed, seed
    index, draw number), below(bits, n) = mulhi(bits, n), Floyd's algorithm without replacement."""
    with np.errstate(over="ignore"):
        index = np.arange(len(seeds), dtype=np.uint64)
        keys = _mix64(np.uint64(rng_seed) ^ _mix64(index * _GOLDEN + _GOLDEN))
    counts = expected_counts(indptr, seeds, fanout, replace)
    groups = []
    for i, (seed, count) in enumerate(zip(seeds, counts, strict=True)):
        start, degree = int(indptr[seed]), int(indptr[seed + 1] - indptr[seed])
        if count == degree and (not replace or fanout == -1):
            groups.append(np.arange(start, start + degree))
            continue
        draw = np.arange(count, dtype=np.uint64)
        with np.errstate(over="ignore"):
            bits = _mix64(keys[i] + (draw + np.uint64(1)) * _GOLDEN)
        if replace:
            groups.append(start + _mulhi64(bits, np.uint64(degree)).astype(np.int64))
            continue
        base = degree - count
        draws = _mulhi64(bits, np.uint64(base + 1) + draw).astype(np.int64)
        picks: list[int] = []
        for k, t in enumerate(draws.tolist()):
            picks.append(base + k if t in picks else t)
        groups.append(start + np.array(picks, dtype=np.int64))
    positions = np.concatenate(groups) if groups else np.zeros(0, dtype=np.int64)
    return counts, positions


# ---- CPU: fallback and validation ----


@pytest.mark.skipif(CUDA, reason="the CPU fallback runs only where CUDA is absent")
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_fallback_matches_cpu_kernel(replace, index_dtype):
    rng = np.random.default_rng()
    indptr, indices = random_csc(rng, 300, 30, index_dtype)
    seeds = rng.integers(0, 300, 200)
    rng_seed = int(rng.integers(2**32))
    got = gpu.sample_neighbors(
        torch.from_numpy(indptr), torch.from_numpy(indices), torch.from_numpy(seeds), 7, replace, rng_seed, True
    )
    want = kernels.sample_neighbors(indptr, indices, seeds, 7, replace, rng_seed=rng_seed, return_neighbors=True)
    assert len(got) == 3
    for g, w in zip(got, want, strict=True):
        assert g.device.type == "cpu" and g.dtype == torch.int64
        np.testing.assert_array_equal(g.numpy(), w)


def test_rejects_bad_arguments():
    indptr = torch.tensor([0, 2, 3], dtype=torch.int64)
    indices = torch.tensor([1, 0, 0], dtype=torch.int64)
    seeds = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="indptr must be int64"):
        gpu.sample_neighbors(indptr.int(), indices, seeds, 2)
    with pytest.raises(ValueError, match="indices must be int32 or int64"):
        gpu.sample_neighbors(indptr, indices.float(), seeds, 2)
    with pytest.raises(ValueError, match="seeds must be an integer"):
        gpu.sample_neighbors(indptr, indices, seeds.float(), 2)
    with pytest.raises(ValueError, match="1-D"):
        gpu.sample_neighbors(indptr, indices, seeds.reshape(2, 1), 2)
    with pytest.raises(ValueError, match="fanout"):
        gpu.sample_neighbors(indptr, indices, seeds, -2)
    with pytest.raises(TypeError, match="seeds must be a torch.Tensor"):
        gpu.sample_neighbors(indptr, indices, [0, 1], 2)


@pytest.mark.skipif(CUDA, reason="CPU fallback path")
def test_fallback_rejects_out_of_range_seed():
    indptr = torch.tensor([0, 2, 3], dtype=torch.int64)
    indices = torch.tensor([1, 0, 0], dtype=torch.int64)
    with pytest.raises(ValueError):
        gpu.sample_neighbors(indptr, indices, torch.tensor([0, 2]), 2)


# ---- CUDA ----


@needs_cuda
@pytest.mark.parametrize("tier", ["device", "pinned"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanout", PATH_FANOUTS)
def test_gpu_picks_are_in_neighbours_with_right_counts(tier, index_dtype, replace, fanout):
    rng = np.random.default_rng()
    indptr, indices = random_csc(rng, 500, 150, index_dtype)
    seeds = rng.integers(0, 500, 700)  # repeats included
    counts, positions, neighbors = gpu.sample_neighbors(
        place(indptr, tier), place(indices, tier), torch.from_numpy(seeds).cuda(), fanout, replace,
        int(rng.integers(2**63)), return_neighbors=True,
    )  # fmt: skip
    for t in (counts, positions, neighbors):
        assert t.is_cuda and t.dtype == torch.int64
    check_groups(indptr, indices, seeds, fanout, replace, counts.cpu().numpy(), positions.cpu().numpy(),
                 neighbors.cpu().numpy())  # fmt: skip


@needs_cuda
@pytest.mark.parametrize("tier", ["device", "pinned"])
def test_gpu_empty_seeds_and_zero_degree_nodes(tier):
    indptr = np.array([0, 0, 3, 3, 5], dtype=np.int64)  # nodes 0 and 2 have no in-edges
    indices = np.array([0, 1, 3, 2, 2], dtype=np.int32)
    dev_indptr, dev_indices = place(indptr, tier), place(indices, tier)
    counts, positions = gpu.sample_neighbors(dev_indptr, dev_indices, torch.zeros(0, dtype=torch.int64), 5)
    assert counts.shape == (0,) and positions.shape == (0,) and counts.is_cuda
    for replace in (False, True):
        counts, positions = gpu.sample_neighbors(dev_indptr, dev_indices, torch.tensor([0, 2, 0, 2]), 3, replace)
        assert counts.tolist() == [0, 0, 0, 0] and positions.numel() == 0
        counts, positions = gpu.sample_neighbors(dev_indptr, dev_indices, torch.tensor([2, 1, 0, 3]), 3, replace)
        check_groups(indptr, indices, np.array([2, 1, 0, 3]), 3, replace, counts.cpu().numpy(),
                     positions.cpu().numpy())  # fmt: skip


@needs_cuda
@pytest.mark.parametrize("tier", ["device", "pinned"])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize(("degree", "fanout"), [(20, 5), (30, 20), (60, 40)])  # 8 lanes, 32 lanes, a warp
def test_gpu_uniform_chi_square(tier, replace, degree, fanout):
    """One node sampled many times: every edge equally often (chi-square, loose bound)."""
    trials = 20000
    indptr = np.array([0, 7, 7 + degree], dtype=np.int64)
    indices = np.arange(7 + degree, dtype=np.int64)
    seeds = torch.ones(trials, dtype=torch.int64)
    rng_seed = 2026 + degree  # fixed, so a pass or a failure is reproducible
    counts, positions = gpu.sample_neighbors(
        place(indptr, tier), place(indices, tier), seeds, fanout, replace, rng_seed
    )
    assert counts.eq(fanout).all()
    observed = np.bincount(positions.cpu().numpy() - 7, minlength=degree)
    assert len(observed) == degree
    expected = trials * fanout / degree
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < CHI2_CRITICAL[degree - 1], (chi2, observed)
    if replace:
        # Draws with replacement are independent: the first pick of each group alone is uniform too. (Not so
        # without replacement: Floyd's draw order is biased, only the set is uniform; see the next test.)
        first = positions.cpu().numpy()[::fanout] - 7
        observed_first = np.bincount(first, minlength=degree)
        expected_first = trials / degree
        chi2_first = float(((observed_first - expected_first) ** 2 / expected_first).sum())
        assert chi2_first < CHI2_CRITICAL[degree - 1], (chi2_first, observed_first)


@needs_cuda
def test_gpu_subsets_are_uniform():
    """Without replacement from degree 6, fanout 2: all 15 unordered pairs equally likely."""
    indptr = np.array([0, 6], dtype=np.int64)
    indices = np.zeros(6, dtype=np.int64)
    trials = 30000
    counts, positions = gpu.sample_neighbors(
        place(indptr, "device"), place(indices, "device"), torch.zeros(trials, dtype=torch.int64), 2, False, 12345
    )
    pairs = np.sort(positions.cpu().numpy().reshape(trials, 2), axis=1)
    assert np.all(pairs[:, 0] < pairs[:, 1])
    codes = pairs[:, 0] * 6 + pairs[:, 1]
    _, observed = np.unique(codes, return_counts=True)
    assert len(observed) == 15
    expected = trials / 15
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < CHI2_CRITICAL[14], (chi2, observed)


@needs_cuda
def test_gpu_deterministic_per_rng_seed():
    rng = np.random.default_rng()
    indptr, indices = random_csc(rng, 400, 50)
    args = (place(indptr, "device"), place(indices, "device"), torch.from_numpy(rng.integers(0, 400, 300)).cuda(), 6)
    a = gpu.sample_neighbors(*args, rng_seed=7)
    b = gpu.sample_neighbors(*args, rng_seed=7)
    c = gpu.sample_neighbors(*args, rng_seed=8)
    assert torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


@needs_cuda
@pytest.mark.parametrize("fanout", [2, 40, -1])  # 2 lanes per seed, a warp per seed, output sized after the sync
def test_gpu_rejects_bad_inputs(fanout):
    indptr = np.array([0, 2, 3], dtype=np.int64)
    indices = np.array([1, 0, 0], dtype=np.int64)
    dev_indptr, dev_indices = place(indptr, "device"), place(indices, "device")
    with pytest.raises(ValueError, match="seeds must be node ids"):
        gpu.sample_neighbors(dev_indptr, dev_indices, torch.tensor([0, 2]), fanout)
    with pytest.raises(ValueError, match="seeds must be node ids"):
        gpu.sample_neighbors(dev_indptr, dev_indices, torch.tensor([-1]), fanout)
    with pytest.raises(ValueError, match="indptr is in pageable host memory"):
        gpu.sample_neighbors(torch.from_numpy(indptr), dev_indices, torch.tensor([0]), fanout)
    with pytest.raises(ValueError, match="indices is in pageable host memory"):
        gpu.sample_neighbors(dev_indptr, torch.from_numpy(indices), torch.tensor([0]), fanout)
    with pytest.raises(ValueError, match="indptr\\[-1\\]"):
        gpu.sample_neighbors(dev_indptr, dev_indices[:2], torch.tensor([0]), fanout)
    with pytest.raises(ValueError, match="indptr\\[-1\\]"):
        gpu.sample_neighbors(dev_indptr, dev_indices[:2], torch.zeros(0, dtype=torch.int64), fanout)
    corrupt = torch.tensor([0, 3, 2], dtype=torch.int64, device="cuda")
    with pytest.raises(ValueError, match="corrupt"):
        gpu.sample_neighbors(corrupt, dev_indices[:2], torch.tensor([1]), fanout)
    # A rejected call leaves the sampler usable, and the stream has no pending error.
    counts, positions = gpu.sample_neighbors(dev_indptr, dev_indices, torch.tensor([0, 1]), fanout)
    torch.cuda.synchronize()
    check_groups(indptr, indices, np.array([0, 1]), fanout, False, counts.cpu().numpy(), positions.cpu().numpy())


@needs_cuda
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanout", PATH_FANOUTS)
def test_gpu_picks_follow_the_documented_stream(replace, fanout):
    """Every fill path draws the same picks: those of a numpy re-implementation of the stream."""
    rng = np.random.default_rng()
    indptr, indices = random_csc(rng, 300, 150, np.int32)
    seeds = rng.integers(0, 300, 400)
    rng_seed = int(rng.integers(2**64, dtype=np.uint64))
    counts, positions, neighbors = gpu.sample_neighbors(
        place(indptr, "device"), place(indices, "device"), torch.from_numpy(seeds).cuda(), fanout, replace,
        rng_seed, return_neighbors=True,
    )  # fmt: skip
    want_counts, want_positions = stream_reference(indptr, seeds, fanout, replace, rng_seed)
    np.testing.assert_array_equal(counts.cpu().numpy(), want_counts)
    np.testing.assert_array_equal(positions.cpu().numpy(), want_positions)
    np.testing.assert_array_equal(neighbors.cpu().numpy(), indices[want_positions])


@needs_cuda
@pytest.mark.parametrize("fanout", [5, 32])
def test_gpu_output_sized_after_the_sync_gives_the_same_picks(fanout):
    """Over 2^24 / fanout seeds the outputs are sized after the sync: same picks for the same seed indices."""
    rng = np.random.default_rng()
    indptr, indices = random_csc(rng, 1000, 40)
    dev_indptr, dev_indices = place(indptr, "device"), place(indices, "device")
    seeds = torch.randint(0, 1000, (2**24 // fanout + 1000,), device="cuda")
    head = 5000
    small = gpu.sample_neighbors(dev_indptr, dev_indices, seeds[:head], fanout, False, 99, return_neighbors=True)
    large = gpu.sample_neighbors(dev_indptr, dev_indices, seeds, fanout, False, 99, return_neighbors=True)
    np.testing.assert_array_equal(large[0].cpu().numpy(), expected_counts(indptr, seeds.cpu().numpy(), fanout, False))
    assert large[1].numel() == int(large[0].sum())
    picks = int(small[0].sum())
    assert torch.equal(large[0][:head], small[0])
    assert torch.equal(large[1][:picks], small[1]) and torch.equal(large[2][:picks], small[2])
    assert small[1].numel() == picks


@needs_cuda
@pytest.mark.parametrize("fanout", [1, 5, 20])
def test_gpu_many_tiles(fanout):
    """Thousands of scan tiles (the look-back walks windows of 32): counts, group bounds and distinctness."""
    rng = np.random.default_rng()
    indptr, indices = random_csc(rng, 5000, 40)
    seeds = rng.integers(0, 5000, 300_000)
    counts, positions = gpu.sample_neighbors(
        place(indptr, "device"), place(indices, "device"), torch.from_numpy(seeds).cuda(), fanout, False, 5
    )
    counts, positions = counts.cpu().numpy(), positions.cpu().numpy()
    np.testing.assert_array_equal(counts, expected_counts(indptr, seeds, fanout, False))
    assert len(positions) == counts.sum()
    owner = np.repeat(np.arange(len(seeds)), counts)
    assert np.all((positions >= indptr[seeds][owner]) & (positions < indptr[seeds + 1][owner]))
    order = np.lexsort((positions, owner))
    same = (owner[order][1:] == owner[order][:-1]) & (positions[order][1:] == positions[order][:-1])
    assert not same.any()


@needs_cuda
def test_extension_check_failures_raise_with_their_values():
    """A failed check with formatted values raises (it crashed the process on the GPU image: csrc/cuda/check.h)."""
    from distgnn.native.cuda import graph_kernels

    indptr = torch.tensor([0, 1, 2], device="cuda")
    indices = torch.tensor([1, 0], device="cuda")
    seeds = torch.tensor([0], device="cuda")
    with pytest.raises(RuntimeError, match="fanout must be >= -1 \\(-1 = all neighbours\\), got -5"):
        graph_kernels().sample_neighbors(indptr, indices, seeds, -5, False, 0, False, 0)
