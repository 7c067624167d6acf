"""The time-sorted CSR and the temporal sampler's C++ kernel against the numpy reference on random streams."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from distgnn.data.events import EventStream, synthetic_events
from distgnn.errors import ConfigError
from distgnn.temporal import TemporalSampler, build_temporal_csr
from distgnn.temporal.reference import candidates, sample_recent_reference


def random_stream(seed: int, num_nodes: int = 40, num_events: int = 600) -> EventStream:
    rng = np.random.default_rng(seed)
    # Coarse times: many ties, so "strictly before" is exercised.
    time = np.sort(rng.integers(0, 50, num_events)).astype(np.float64)
    return EventStream(rng.integers(0, num_nodes, num_events), rng.integers(0, num_nodes, num_events), time, num_nodes)


def random_roots(events: EventStream, seed: int, n: int = 300) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed + 100)
    return rng.integers(0, events.num_nodes, n), rng.integers(-2, 55, n).astype(np.float64)


@pytest.mark.parametrize("undirected", [True, False])
def test_csr_lists_each_nodes_events_in_time_order(undirected):
    events = random_stream(0)
    csr = build_temporal_csr(events, undirected)
    assert csr.num_entries == len(events) * (2 if undirected else 1)
    for v in range(events.num_nodes):
        begin, end = csr.indptr[v], csr.indptr[v + 1]
        eids = csr.eids[begin:end]
        mine = np.flatnonzero((events.src == v) | (events.dst == v) if undirected else events.src == v)
        np.testing.assert_array_equal(np.unique(eids), mine)
        assert (np.diff(csr.times[begin:end]) >= 0).all()
        np.testing.assert_array_equal(csr.times[begin:end], events.time[eids])
        other = np.where(events.src[eids] == v, events.dst[eids], events.src[eids])
        np.testing.assert_array_equal(csr.neighbors[begin:end], other)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("k", [1, 4, 10])
def test_recent_matches_reference(seed, k):
    events = random_stream(seed)
    csr = build_temporal_csr(events)
    roots, times = random_roots(events, seed)
    hop = TemporalSampler(csr, k, num_threads=2).sample(torch.from_numpy(roots), torch.from_numpy(times))[0]
    neighbors, when, eids, counts = sample_recent_reference(csr, roots, times, k)
    np.testing.assert_array_equal(hop.neighbors.numpy(), neighbors)
    np.testing.assert_array_equal(hop.times.numpy(), when)
    np.testing.assert_array_equal(hop.eids.numpy(), eids)
    np.testing.assert_array_equal(hop.mask.sum(1).numpy(), counts)


@pytest.mark.parametrize("seed", [4, 5])
def test_uniform_picks_distinct_candidates_before_the_root_time(seed):
    events = random_stream(seed)
    csr = build_temporal_csr(events)
    roots, times = random_roots(events, seed)
    sampler = TemporalSampler(csr, 5, strategy="uniform", num_threads=2, seed=seed)
    hop = sampler.sample(torch.from_numpy(roots), torch.from_numpy(times))[0]
    for i, (root, t) in enumerate(zip(roots, times, strict=True)):
        pool = candidates(csr, int(root), float(t))
        picked = hop.eids[i][hop.mask[i]].numpy()
        assert len(picked) == min(5, len(pool))
        assert (hop.times[i][hop.mask[i]].numpy() < t).all()
        # Distinct CSR positions: the picks are a sub-multiset of the pool's (event, neighbour) pairs.
        pairs = Counter(zip(picked.tolist(), hop.neighbors[i][hop.mask[i]].tolist(), strict=True))
        available = Counter(zip(csr.eids[pool].tolist(), csr.neighbors[pool].tolist(), strict=True))
        assert not pairs - available
    # Same seed and thread count independent; every candidate of a busy root gets picked sometimes.
    again = TemporalSampler(csr, 5, strategy="uniform", num_threads=1, seed=seed)
    np.testing.assert_array_equal(
        again.sample(torch.from_numpy(roots), torch.from_numpy(times))[0].eids.numpy(), hop.eids.numpy()
    )
    busy = int(np.argmax(csr.indptr[1:] - csr.indptr[:-1]))
    pool = candidates(csr, busy, 1e9)
    seen = set()
    for _ in range(60):
        out = sampler.sample(torch.tensor([busy]), torch.tensor([1e9], dtype=torch.float64))[0]
        seen.update(out.eids[0][out.mask[0]].tolist())
    assert seen == set(csr.eids[pool].tolist())


@pytest.mark.parametrize("strategy", ["recent", "uniform"])
def test_two_hops_never_at_or_after_the_root_time(strategy):
    events = synthetic_events(300, 5000, seed=7)
    csr = build_temporal_csr(events)
    rng = np.random.default_rng(0)
    pick = rng.integers(0, len(events), 200)
    roots, times = torch.from_numpy(events.src[pick]), torch.from_numpy(events.time[pick])
    hop1, hop2 = TemporalSampler(csr, 6, hops=2, strategy=strategy, num_threads=2).sample(roots, times)
    assert hop1.neighbors.shape == (200, 6) and hop2.neighbors.shape == (1200, 6)
    assert (hop1.times[hop1.mask] < times[:, None].expand(-1, 6)[hop1.mask]).all()
    hop2_roots_time = torch.where(hop1.mask, hop1.times, -torch.inf).flatten()
    assert (hop2.times < hop2_roots_time[:, None])[hop2.mask].all()
    assert not hop2.mask[~hop1.mask.flatten()].any()
    if strategy == "recent":
        flat_roots = torch.where(hop1.mask, hop1.neighbors, 0).flatten().numpy()
        expected = sample_recent_reference(csr, flat_roots, hop2_roots_time.numpy(), 6)
        np.testing.assert_array_equal(hop2.eids.numpy(), expected[2])


def test_bad_roots_and_config():
    csr = build_temporal_csr(random_stream(0))
    sampler = TemporalSampler(csr, 3)
    with pytest.raises(ValueError, match="outside"):
        sampler.sample(torch.tensor([0, 40]), torch.tensor([1.0, 2.0], dtype=torch.float64))
    with pytest.raises(ConfigError, match="strategy"):
        TemporalSampler(csr, 3, strategy="latest")
    with pytest.raises(ConfigError, match="hops"):
        TemporalSampler(csr, 3, hops=3)


@pytest.mark.parametrize("k", [1, 5])
@pytest.mark.parametrize("cut", [0.5, 1.0])
def test_uniform_picks_every_candidate_equally_often(k, cut):
    """One root sampled many times: each candidate event before the root's time is picked k/m of the time (m
    candidates). Chi-square against the multinomial bound, which picks without replacement only tighten; and a
    sampler that favours recent events fails it."""
    from scipy.stats import chi2

    events = random_stream(6, num_nodes=10, num_events=600)
    csr = build_temporal_csr(events)
    busy = int(np.argmax(csr.indptr[1:] - csr.indptr[:-1]))
    t = float(np.quantile(csr.times[csr.indptr[busy] : csr.indptr[busy + 1]], cut)) + (1e9 if cut == 1.0 else 0)
    pool = candidates(csr, busy, t)
    m = len(pool)
    assert m > 3 * k
    draws = 6000
    sampler = TemporalSampler(csr, k, strategy="uniform", num_threads=2, seed=k)
    hop = sampler.sample(torch.full((draws,), busy), torch.full((draws,), t, dtype=torch.float64))[0]
    assert int(hop.mask.sum()) == draws * k
    # A self-loop is listed twice (once per endpoint) as the same (event, neighbour) pair: one cell, twice as likely.
    pairs = Counter(zip(csr.eids[pool].tolist(), csr.neighbors[pool].tolist(), strict=True))
    cells = {pair: i for i, pair in enumerate(pairs)}
    observed = np.zeros(len(cells))
    for pair in zip(hop.eids[hop.mask].tolist(), hop.neighbors[hop.mask].tolist(), strict=True):
        observed[cells[pair]] += 1
    expected = draws * k / m * np.array([pairs[pair] for pair in cells], dtype=np.float64)
    critical = chi2.ppf(0.9999, len(cells) - 1)
    statistic = float(((observed - expected) ** 2 / expected).sum())
    assert statistic < critical, (statistic, critical)
    # The test has power: moving a fifth of the picks from the first half of the cells to the second is rejected.
    half = len(cells) // 2
    skewed = observed.copy()
    skewed[:half] *= 0.8
    skewed[half:] += observed[:half].sum() * 0.2 / (len(cells) - half)
    assert float(((skewed - expected) ** 2 / expected).sum()) > critical
