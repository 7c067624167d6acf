"""Hot-set choice: access-frequency ranking, in-degree fallback and tie-breaks, byte budget."""

from __future__ import annotations

import pytest
import torch

from distgnn.cache import access_frequency, choose_hot_set
from distgnn.errors import ConfigError, InputError


def brute_force_ranking(num_nodes, frequency, degree):
    keys = [
        (-int(frequency[i]) if frequency is not None else 0, -int(degree[i]) if degree is not None else 0, i)
        for i in range(num_nodes)
    ]
    return [key[2] for key in sorted(keys)]


def test_access_frequency_counts_every_occurrence():
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 50, (int(torch.randint(0, 40, (1,), generator=gen)),), generator=gen) for _ in range(9)]
    counts = access_frequency(batches, 50)
    expected = torch.zeros(50, dtype=torch.int64)
    for batch in batches:
        for i in batch.tolist():
            expected[i] += 1
    assert torch.equal(counts, expected)


def test_access_frequency_calls_a_sampling_callable_num_batches_times():
    calls = []

    def sample():
        calls.append(1)
        return torch.tensor([len(calls) % 5])

    counts = access_frequency(sample, 5, num_batches=12)
    assert len(calls) == 12
    assert counts.tolist() == [2, 3, 3, 2, 2]


def test_access_frequency_rejects_out_of_range_ids():
    with pytest.raises(InputError, match=r"\[0, 5\)"):
        access_frequency([torch.tensor([1, 5])], 5)


@pytest.mark.parametrize("seed", range(4))
def test_frequency_ranks_first_then_degree_then_id(seed):
    gen = torch.Generator().manual_seed(seed)
    num_nodes = 300
    batches = [torch.randint(0, 40, (30,), generator=gen) * 7 for _ in range(5)]
    degree = torch.randint(0, 6, (num_nodes,), generator=gen)
    frequency = access_frequency(batches, num_nodes)
    row_bytes = 12
    budget = int(torch.randint(0, num_nodes * row_bytes, (1,), generator=gen))
    hot = choose_hot_set(budget, row_bytes, num_nodes, samples=batches, in_degree=degree)
    assert hot.tolist() == brute_force_ranking(num_nodes, frequency, degree)[: budget // row_bytes]
    # Counts taken beforehand (a clique sums its trainers') rank exactly like the batches they came from.
    assert torch.equal(choose_hot_set(budget, row_bytes, num_nodes, frequency=frequency, in_degree=degree), hot)


def test_degree_is_the_fallback_without_samples():
    degree = torch.tensor([3, 9, 0, 9, 5])
    hot = choose_hot_set(4 * 8, 8, 5, in_degree=degree)
    assert hot.tolist() == [1, 3, 4, 0]


def test_budget_larger_than_graph_caches_every_node():
    hot = choose_hot_set(10**9, 4, 6, samples=[torch.tensor([5, 5, 2])])
    assert hot.tolist() == [5, 2, 0, 1, 3, 4]


def test_needs_samples_or_degree():
    with pytest.raises(ConfigError, match="samples="):
        choose_hot_set(100, 4, 10)
    with pytest.raises(ConfigError, match="not both"):
        choose_hot_set(100, 4, 10, samples=[torch.tensor([1])], frequency=torch.zeros(10, dtype=torch.int64))
