"""DistEmbedding with SparseSGD/SparseAdagrad/SparseAdam: updates equal a dense torch reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from serving_graphs import child_processes, job_files, small_graph

from distgnn.client.context import connect
from distgnn.client.embedding import DistEmbedding, SparseAdagrad, SparseAdam, SparseSGD
from distgnn.train.cluster import LocalCluster


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    graph = small_graph(tmp_path_factory.mktemp("emb") / "out", num_parts=2, num_nodes=200, num_edges=500)
    with LocalCluster(graph.json_path, rpc_timeout_s=20) as cluster, connect(cluster.config(0)) as ctx:
        yield graph, ctx
    assert job_files(cluster.job_id) == []
    assert child_processes() == []


def _batch_loss(rows: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((rows - target) ** 2).sum()


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam"])
def test_steps_equal_the_dense_reference(served, kind):
    graph, ctx = served
    n, dim, lr = graph.num_nodes, 4, 0.1
    emb = DistEmbedding(n, dim, f"emb_{kind}", context=ctx)
    opt = {"sgd": SparseSGD, "adagrad": SparseAdagrad, "adam": SparseAdam}[kind]([emb], lr)
    everything = torch.arange(n)
    weight = emb.weight[everything].clone()
    assert bool(((weight >= -1) & (weight < 1)).all())
    state = torch.zeros(n, dim)
    m, v, steps = torch.zeros(n, dim), torch.zeros(n, dim), torch.zeros(n, 1)
    target = torch.from_numpy(np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32))
    rng = np.random.default_rng(1)
    for _ in range(3):
        batches = [torch.from_numpy(rng.integers(0, n, 40)) for _ in range(2)]  # repeats within and across
        loss = sum(_batch_loss(emb(ids), target[ids]) for ids in batches)
        loss.backward()
        opt.step()
        grad = torch.zeros(n, dim)
        for ids in batches:
            grad.index_add_(0, ids, 2 * (weight[ids] - target[ids]))
        touched = torch.unique(torch.cat(batches))
        if kind == "sgd":
            weight[touched] -= lr * grad[touched]
        elif kind == "adagrad":
            state[touched] += grad[touched] ** 2
            weight[touched] -= lr * grad[touched] / (state[touched].sqrt() + 1e-10)
        else:  # per-row Adam, each row counting its own steps
            g = grad[touched]
            m[touched] = 0.9 * m[touched] + 0.1 * g
            v[touched] = 0.999 * v[touched] + 0.001 * g * g
            steps[touched] += 1
            m_hat = m[touched] / (1 - 0.9 ** steps[touched])
            v_hat = v[touched] / (1 - 0.999 ** steps[touched])
            weight[touched] -= lr * m_hat / (v_hat.sqrt() + 1e-8)
        torch.testing.assert_close(emb.weight[everything], weight)


def test_a_unique_lookup_sends_its_gradient_as_it_is_and_steps_as_the_summed_path(served):
    graph, ctx = served
    n, dim = graph.num_nodes, 4
    embs = [DistEmbedding(n, dim, f"emb_unique_{flag}", context=ctx) for flag in (False, True)]
    embs[1].weight[torch.arange(n)] = embs[0].weight[torch.arange(n)]
    opts = [SparseAdam([emb], 0.1) for emb in embs]
    target = torch.from_numpy(np.random.default_rng().standard_normal((n, dim)).astype(np.float32))
    rng = np.random.default_rng()
    for _ in range(3):
        ids = torch.from_numpy(rng.permutation(n)[:60])  # unique, unsorted, on both machines
        for emb, opt, unique in zip(embs, opts, (False, True), strict=True):
            _batch_loss(emb.lookup_async(ids, unique=unique)(), target[ids]).backward()
            opt.step()
    for opt in opts:
        opt.flush()
    everything = torch.arange(n)
    torch.testing.assert_close(embs[1].weight[everything], embs[0].weight[everything], rtol=1e-5, atol=1e-6)


def test_lookups_without_grad_or_after_zero_grad_change_nothing(served):
    graph, ctx = served
    emb = DistEmbedding(graph.num_nodes, 2, "emb_frozen", init="ones", context=ctx)
    opt = SparseSGD([emb], 0.5)
    with torch.no_grad():
        emb(torch.arange(10)).sum()
    rows = emb(torch.arange(5))
    rows.sum().backward()
    opt.zero_grad()
    opt.step()
    torch.testing.assert_close(emb.weight[torch.arange(graph.num_nodes)], torch.ones(graph.num_nodes, 2))


def test_zero_grad_between_forward_and_backward_keeps_the_step(served):
    """DGL's examples call zero_grad after the forward: that step's gradient must still be applied."""
    graph, ctx = served
    emb = DistEmbedding(graph.num_nodes, 2, "emb_dgl_order", init="ones", context=ctx)
    opt = SparseSGD([emb], 0.5)
    rows = emb(torch.arange(3))
    opt.zero_grad()
    rows.sum().backward()
    opt.step()
    expect = torch.ones(graph.num_nodes, 2)
    expect[:3] -= 0.5
    torch.testing.assert_close(emb.weight[torch.arange(graph.num_nodes)], expect)
