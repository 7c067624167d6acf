"""Sparse optimizers' pushes that do not wait: same embeddings as the waiting path, reads after a push see it,
failed pushes are raised at the next sync point naming the push, a dead server is reported, never a hang."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import torch
from serving_graphs import child_processes, job_files, small_graph

from distgnn.client.context import connect
from distgnn.client.embedding import DistEmbedding, SparseAdagrad, SparseAdam, SparseSGD
from distgnn.client.tensor import DistTensor
from distgnn.errors import RpcError, ServerLostError
from distgnn.rpc import RpcClient
from distgnn.train.cluster import LocalCluster

OPTIMIZERS = {"sgd": SparseSGD, "adagrad": SparseAdagrad, "adam": SparseAdam}


@pytest.fixture(scope="module", params=[1, 2], ids=["1-server", "2-servers"])
def served(request, tmp_path_factory):
    """Two machines; with 2 servers per machine, remote rows are also pulled from backups (not the pushes' path)."""
    graph = small_graph(tmp_path_factory.mktemp("async") / "out", num_parts=2, num_nodes=200, num_edges=500)
    with (
        LocalCluster(graph.json_path, servers_per_machine=request.param, rpc_timeout_s=20) as cluster,
        connect(cluster.config(0)) as ctx,
    ):
        yield graph, ctx
    assert job_files(cluster.job_id) == []
    assert child_processes() == []


def _train(emb: DistEmbedding, opt, target: torch.Tensor, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(4):
        ids = torch.from_numpy(rng.integers(0, len(target), 60))  # repeats, rows of both machines
        ((emb(ids) - target[ids]) ** 2).sum().backward()
        opt.step()


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_async_and_waiting_pushes_give_the_same_embeddings(served, kind):
    graph, ctx = served
    n = graph.num_nodes
    target = torch.from_numpy(np.random.default_rng(0).standard_normal((n, 3)).astype(np.float32))
    tables = {}
    for async_push in (True, False):
        emb = DistEmbedding(n, 3, f"same_{kind}_{async_push}", init="ones", context=ctx)
        opt = OPTIMIZERS[kind]([emb], 0.1, async_push=async_push)
        _train(emb, opt, target, seed=1)
        tables[async_push] = emb.weight[torch.arange(n)]
    assert not torch.equal(tables[True], torch.ones(n, 3)), "the steps changed nothing"
    torch.testing.assert_close(tables[True], tables[False], rtol=0, atol=0)


def test_a_read_right_after_an_async_push_sees_it(served):
    graph, ctx = served
    n = graph.num_nodes
    tensor = DistTensor((n, 2), torch.float32, "read_after_push", init="zeros", context=ctx)
    everything = torch.arange(n)
    expected = torch.zeros(n, 2)
    rng = np.random.default_rng(2)
    for i in range(20):
        ids = torch.from_numpy(rng.integers(0, n, 30))
        tensor.push(ids, torch.full((30, 2), float(i)), mode="add", wait=False)
        expected.index_add_(0, ids, torch.full((30, 2), float(i)))
        first = int(ctx.range_ends("node")[0])
        for part in (ids, ids[ids < first], ids[ids >= first]):  # mixed, then each machine's rows alone
            torch.testing.assert_close(tensor[part], expected[part], rtol=0, atol=0)
    torch.testing.assert_close(tensor[everything], expected, rtol=0, atol=0)


def test_a_failed_async_push_is_raised_at_flush_naming_the_push(served):
    graph, ctx = served
    n = graph.num_nodes
    tensor = DistTensor((n, 2), torch.float32, "bad_push", init="zeros", context=ctx)
    # Valid ids pass the trainer's checks; the servers refuse an unknown tensor name.
    tensor.name = "no_such_tensor"
    tensor.push(torch.arange(n), torch.ones(n, 2), mode="add", wait=False)
    with pytest.raises(RpcError, match=r"write to node tensor 'bad_push' on machine [01] \(sent without waiting"):
        tensor.flush()
    tensor.flush()  # the failure was reported once; nothing is left pending
    tensor.name = "bad_push"
    torch.testing.assert_close(tensor[torch.arange(n)], torch.zeros(n, 2))


def test_a_failed_async_push_is_raised_by_the_next_read(served):
    graph, ctx = served
    n = graph.num_nodes
    tensor = DistTensor((n, 2), torch.float32, "bad_push_read", init="zeros", context=ctx)
    tensor.name = "no_such_tensor"
    tensor.push(torch.arange(n), torch.ones(n, 2), mode="add", wait=False)
    tensor.name = "bad_push_read"
    ends = ctx.range_ends("node")
    local = torch.arange(ends[ctx.machine_id - 1] if ctx.machine_id else 0, ends[ctx.machine_id])
    with pytest.raises(RpcError, match=rf"write to node tensor 'bad_push_read' on machine {ctx.machine_id}"):
        tensor[local]
    other = 1 - ctx.machine_id  # no row of the other machine was read: its push is still posted
    with pytest.raises(RpcError, match=rf"write to node tensor 'bad_push_read' on machine {other}"):
        tensor.flush()
    tensor.flush()


def test_flush_and_barrier_leave_nothing_posted(served):
    graph, ctx = served
    emb = DistEmbedding(graph.num_nodes, 2, "flushed", context=ctx)
    opt = SparseAdam([emb], 0.1)
    emb(torch.arange(graph.num_nodes)).sum().backward()
    opt.step()
    tags = [*emb.weight._push_tags, *opt.state["flushed"]._push_tags]
    assert any(ctx.client.has_posted(tag) for tag in tags)
    opt.flush()
    assert not any(ctx.client.has_posted(tag) for tag in tags)
    emb(torch.arange(graph.num_nodes)).sum().backward()
    opt.step()
    ctx.barrier("after-async-step")
    assert not any(ctx.client.has_posted(tag) for tag in tags)


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs POSIX job-control signals")
def test_settle_reports_a_dead_server_soon(tmp_path):
    graph = small_graph(tmp_path / "g", num_parts=2, num_nodes=60, num_edges=200)
    with LocalCluster(graph.json_path, rpc_timeout_s=60) as cluster, RpcClient(cluster.config(0)) as client:
        assert client.call(1, "meta").header["ok"]  # connected to machine 1
        server = cluster.process(1)
        os.kill(server.pid, signal.SIGSTOP)
        ids = np.arange(35, 40, dtype=np.int64)
        fields = {"policy": "node", "name": "feat", "mode": "add"}
        rows = np.zeros((5, 8), dtype=np.float32)  # small_graph's feat is (N, 8)
        client.post(1, "push", fields, [ids, rows], tag="write to node tensor 'feat' on machine 1")
        os.kill(server.pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(ServerLostError, match=r"write to node tensor 'feat' on machine 1 .*'push' on server 0"):
            client.settle()
        assert time.monotonic() - started < 5.0
