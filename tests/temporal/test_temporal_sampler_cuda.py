"""The temporal sampler's CUDA kernel against the numpy reference (skips without a GPU)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from distgnn.data.events import EventStream
from distgnn.temporal import TemporalSampler, build_temporal_csr
from distgnn.temporal.reference import candidates, sample_recent_reference

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def random_case(seed: int, num_nodes: int = 60, num_events: int = 2000, num_roots: int = 3000):
    rng = np.random.default_rng(seed)
    time = np.sort(rng.integers(0, 80, num_events)).astype(np.float64)
    events = EventStream(
        rng.integers(0, num_nodes, num_events), rng.integers(0, num_nodes, num_events), time, num_nodes
    )
    roots = rng.integers(0, num_nodes, num_roots)
    return build_temporal_csr(events), roots, rng.integers(-2, 85, num_roots).astype(np.float64)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 10, 25])
def test_cuda_recent_matches_reference(seed, k):
    csr, roots, times = random_case(seed)
    hop = TemporalSampler(csr, k, device="cuda").sample(torch.from_numpy(roots), torch.from_numpy(times))[0]
    assert hop.neighbors.is_cuda
    neighbors, when, eids, counts = sample_recent_reference(csr, roots, times, k)
    np.testing.assert_array_equal(hop.neighbors.cpu().numpy(), neighbors)
    np.testing.assert_array_equal(hop.times.cpu().numpy(), when)
    np.testing.assert_array_equal(hop.eids.cpu().numpy(), eids)
    np.testing.assert_array_equal(hop.mask.sum(1).cpu().numpy(), counts)


@pytest.mark.parametrize("seed", [3, 4])
def test_cuda_uniform_picks_distinct_candidates_before_the_root_time(seed):
    csr, roots, times = random_case(seed)
    hop = TemporalSampler(csr, 7, strategy="uniform", device="cuda", seed=seed).sample(
        torch.from_numpy(roots), torch.from_numpy(times)
    )[0]
    eids, neighbors, mask = hop.eids.cpu(), hop.neighbors.cpu(), hop.mask.cpu()
    picked_times = hop.times.cpu()
    for i, (root, t) in enumerate(zip(roots, times, strict=True)):
        pool = candidates(csr, int(root), float(t))
        assert int(mask[i].sum()) == min(7, len(pool))
        assert (picked_times[i][mask[i]].numpy() < t).all()
        pairs = Counter(zip(eids[i][mask[i]].tolist(), neighbors[i][mask[i]].tolist(), strict=True))
        assert not pairs - Counter(zip(csr.eids[pool].tolist(), csr.neighbors[pool].tolist(), strict=True))


def test_cuda_two_hops_and_bad_root():
    csr, roots, times = random_case(5)
    hops = TemporalSampler(csr, 5, hops=2, device="cuda").sample(torch.from_numpy(roots), torch.from_numpy(times))
    cpu = TemporalSampler(csr, 5, hops=2).sample(torch.from_numpy(roots), torch.from_numpy(times))
    for gpu_hop, cpu_hop in zip(hops, cpu, strict=True):
        torch.testing.assert_close(gpu_hop.eids.cpu(), cpu_hop.eids)
    with pytest.raises(ValueError, match="outside"):
        TemporalSampler(csr, 5, device="cuda").sample(torch.tensor([0, 60]), torch.tensor([1.0, 2.0]).double())
