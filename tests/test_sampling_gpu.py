"""The GPU sampler (distgnn.sampling.gpu) against the sampling semantics, on fresh random graphs.

CPU-only machines run the fallback and validation tests; the CUDA tests skip without a GPU and cover both
tiers (CSC on the GPU, and pinned host memory read zero-copy), int32 and int64 indices, with and without
replacement, empty seed lists and zero-degree nodes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distgnn.sampling import gpu, kernels

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
# Upper 0.9999 quantiles of chi-square by degrees of freedom: loose on purpose (seeded streams, so a pass
# is reproducible).
CHI2_CRITICAL = {19: 47.0, 29: 59.7}


def random_csc(rng: np.random.Generator, num_nodes: int, max_degree: int, index_dtype=np.int64):
    """A numpy CSC graph where about a fifth of the nodes have no in-edges."""
    degrees = rng.integers(0, max_degree + 1, num_nodes)
    degrees[rng.random(num_nodes) < 0.2] = 0
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(degrees, out=indptr[1:])
    indices = rng.integers(0, num_nodes, int(indptr[-1])).astype(index_dtype)
    return indptr, indices


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
@pytest.mark.parametrize("fanout", [0, 1, 4, 25, -1])
def test_gpu_picks_are_in_neighbours_with_right_counts(tier, index_dtype, replace, fanout):
    rng = np.random.default_rng()
    indptr, indices = random_csc(rng, 500, 60, index_dtype)
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
def test_gpu_uniform_chi_square(tier, replace):
    """One node of degree 20 sampled many times: every edge equally often (chi-square, loose bound)."""
    degree, fanout, trials = 20, 5, 20000
    indptr = np.array([0, 7, 7 + degree], dtype=np.int64)
    indices = np.arange(7 + degree, dtype=np.int64)
    seeds = torch.ones(trials, dtype=torch.int64)
    rng_seed = int(np.random.default_rng().integers(2**63))
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
    assert chi2 < 40.0, (chi2, observed)  # 14 degrees of freedom; 0.9999 quantile is about 38.1


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
def test_gpu_rejects_bad_inputs():
    indptr = np.array([0, 2, 3], dtype=np.int64)
    indices = np.array([1, 0, 0], dtype=np.int64)
    dev_indptr, dev_indices = place(indptr, "device"), place(indices, "device")
    with pytest.raises(ValueError, match="seeds must be node ids"):
        gpu.sample_neighbors(dev_indptr, dev_indices, torch.tensor([0, 2]), 2)
    with pytest.raises(ValueError, match="seeds must be node ids"):
        gpu.sample_neighbors(dev_indptr, dev_indices, torch.tensor([-1]), 2)
    with pytest.raises(ValueError, match="pageable host memory"):
        gpu.sample_neighbors(torch.from_numpy(indptr), dev_indices, torch.tensor([0]), 2)
    with pytest.raises(ValueError, match="indptr\\[-1\\]"):
        gpu.sample_neighbors(dev_indptr, dev_indices[:2], torch.tensor([0]), 2)
    corrupt = torch.tensor([0, 3, 2], dtype=torch.int64, device="cuda")
    with pytest.raises(ValueError, match="corrupt"):
        gpu.sample_neighbors(corrupt, dev_indices[:2], torch.tensor([1]), 2)
