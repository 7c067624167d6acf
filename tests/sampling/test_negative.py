"""Negative samplers: pair layout, id ranges, the degree bias, determinism and bad arguments."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from distgnn.data.graph import Graph
from distgnn.errors import ConfigError
from distgnn.sampling.negative import (
    DegreeBiased,
    PerSourceUniform,
    Uniform,
    all_in_degrees,
    negative_sampler,
)
from distgnn.sampling.neighbor import InProcessGraph


def _graph(num_nodes=50, num_edges=400, seed=0) -> InProcessGraph:
    rng = np.random.default_rng(seed)
    # Node 0..9 get no in-edges; destinations skewed towards high ids.
    dst = 10 + (rng.random(num_edges) ** 0.5 * (num_nodes - 10)).astype(np.int64)
    src = rng.integers(0, num_nodes, num_edges)
    g = InProcessGraph(Graph("g", num_nodes, src, dst))
    g.graph_dst = dst  # the truth the degree test compares against
    return g


def test_uniform_pairs_each_positive_with_k_destinations_over_all_nodes():
    g = _graph()
    src = np.array([3, 7, 7, 40])
    dst = np.array([11, 12, 13, 14])
    neg_src, neg_dst = Uniform(5).sample(g, src, dst, np.random.default_rng(0))
    np.testing.assert_array_equal(neg_src, np.repeat(src, 5))
    assert neg_dst.dtype == np.int64 and len(neg_dst) == 20
    assert neg_dst.min() >= 0 and neg_dst.max() < g.num_nodes()
    many = Uniform(1).sample(g, np.zeros(50_000, np.int64), None, np.random.default_rng(1))[1]
    counts = np.bincount(many, minlength=g.num_nodes())
    assert counts.min() > 0.8 * 1000 and counts.max() < 1.2 * 1000


def test_per_source_shares_k_negatives_per_distinct_source():
    g = _graph()
    src = np.array([9, 3, 9, 9, 3, 20])
    neg_src, neg_dst = PerSourceUniform(4).sample(g, src, src, np.random.default_rng(0))
    np.testing.assert_array_equal(neg_src, np.repeat([3, 9, 20], 4))
    assert len(neg_dst) == 12 and neg_dst.max() < g.num_nodes()


def test_degree_biased_draws_in_proportion_to_in_degree_power():
    g = _graph()
    degrees = all_in_degrees(g)
    np.testing.assert_array_equal(degrees, np.bincount(g.graph_dst, minlength=g.num_nodes()))
    draws = DegreeBiased(1).sample(g, np.zeros(200_000, np.int64), None, np.random.default_rng(2))[1]
    freq = np.bincount(draws, minlength=g.num_nodes()) / len(draws)
    expected = degrees**0.75 / (degrees**0.75).sum()
    assert freq[degrees == 0].sum() == 0
    np.testing.assert_allclose(freq, expected, atol=0.004)
    # A flatter bias than the degree itself: the top node is drawn less often than its degree share.
    top = int(np.argmax(degrees))
    assert freq[top] < degrees[top] / degrees.sum()


def test_same_stream_same_negatives():
    g = _graph()
    src = np.arange(10)
    for sampler in (Uniform(3), PerSourceUniform(3), DegreeBiased(3)):
        a = sampler.sample(g, src, src, np.random.default_rng(5))
        b = sampler.sample(g, src, src, np.random.default_rng(5))
        np.testing.assert_array_equal(a[1], b[1])


def test_degree_table_is_not_pickled():
    g = _graph()
    sampler = DegreeBiased(2, power=0.5)
    sampler.cdf(g)
    copy = pickle.loads(pickle.dumps(sampler))
    assert copy._cdf is None and (copy.k, copy.power) == (2, 0.5)
    np.testing.assert_array_equal(copy.cdf(g), sampler.cdf(g))


@pytest.mark.parametrize("k", [0, -1, 1.5, True])
def test_k_must_be_a_positive_int(k):
    with pytest.raises(ConfigError, match="k >= 1"):
        Uniform(k)


def test_samplers_by_name():
    assert isinstance(negative_sampler("degree", 3), DegreeBiased)
    assert negative_sampler("per_source", 2).k == 2
    with pytest.raises(ConfigError, match="unknown negative sampler 'bogus'"):
        negative_sampler("bogus", 1)
