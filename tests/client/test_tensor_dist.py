"""DistTensor on a 3-machine cluster: pulls and pushes equal a plain tensor; concurrent adds lose nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from serving_graphs import child_processes, job_files, small_graph

from distgnn.client.context import connect
from distgnn.client.tensor import DistTensor
from distgnn.errors import InputError, RpcError
from distgnn.train.cluster import LocalCluster


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    graph = small_graph(tmp_path_factory.mktemp("tensor") / "out", num_parts=3, num_nodes=600, num_edges=3000)
    with LocalCluster(graph.json_path, servers_per_machine=1, rpc_timeout_s=20, num_trainers=1) as cluster:
        contexts = [connect(cluster.config(m), rank=m, world_size=3) for m in range(3)]
        try:
            yield graph, cluster, contexts
        finally:
            for ctx in contexts:
                ctx.close()
    assert job_files(cluster.job_id) == []
    assert child_processes() == []


def _ids_cases(graph, machine, rng):
    start, end = graph.node_map[machine]
    other = np.concatenate([np.arange(0, start), np.arange(end, graph.num_nodes)])
    return {
        "random_with_repeats": rng.integers(0, graph.num_nodes, 500),
        "unsorted_unique": rng.permutation(graph.num_nodes)[:200],
        "empty": np.zeros(0, np.int64),
        "all_local": rng.integers(start, end, 100),
        "all_remote": rng.choice(other, 150),
        "single": np.array([graph.num_nodes - 1]),
    }


@pytest.mark.parametrize("machine", [0, 2])
@pytest.mark.parametrize("name", ["feat", "label", "train_mask"])
def test_pull_equals_the_reference_for_any_ids(served, machine, name):
    graph, _, contexts = served
    spec = graph.ndata[name]
    t = DistTensor.attach(spec.shape, torch.from_numpy(spec[:1]).dtype, name, "node", contexts[machine])
    rng = np.random.default_rng(machine)
    for case, ids in _ids_cases(graph, machine, rng).items():
        got = t[torch.from_numpy(ids.astype(np.int64))]
        assert got.dtype == torch.from_numpy(spec[:1]).dtype, case
        np.testing.assert_array_equal(got.numpy(), spec[ids], err_msg=case)


def test_reads_of_several_tensors_started_together_equal_the_reference(served):
    graph, _, contexts = served
    tensors = {
        name: DistTensor.attach(
            graph.ndata[name].shape, torch.from_numpy(graph.ndata[name][:1]).dtype, name, "node", contexts[1]
        )
        for name in ("feat", "label", "train_mask")
    }
    rng = np.random.default_rng()
    cases = list(_ids_cases(graph, 1, rng).values())
    started = [(name, ids, t.read_async(torch.from_numpy(ids))) for ids in cases for name, t in tensors.items()]
    for name, ids, pending in reversed(started):  # finished in another order than started
        np.testing.assert_array_equal(pending.result().numpy(), graph.ndata[name][ids], err_msg=name)


def test_edge_tensor_pull(served):
    graph, _, contexts = served
    w = DistTensor.attach((len(graph.src),), torch.float32, "w", "edge", contexts[1])
    ids = np.random.default_rng(5).integers(0, len(graph.src), 400)
    np.testing.assert_array_equal(w[ids].numpy(), graph.edata["w"][ids])


def test_new_tensor_push_assign_then_pull_everywhere(served):
    graph, _, contexts = served
    shape = (graph.num_nodes, 3)
    tensors = [DistTensor(shape, torch.float64, "assign_t", init="ones", context=ctx) for ctx in contexts]
    reference = np.ones(shape)
    rng = np.random.default_rng(9)
    for step in range(4):
        ids = rng.permutation(graph.num_nodes)[:120]
        rows = rng.standard_normal((120, 3))
        tensors[step % 3][torch.from_numpy(ids)] = torch.from_numpy(rows)
        reference[ids] = rows
    for t in tensors:
        np.testing.assert_array_equal(t[torch.arange(graph.num_nodes)].numpy(), reference)


def test_uniform_init_is_in_range_and_shape_is_checked(served):
    graph, _, contexts = served
    t = DistTensor((graph.num_nodes, 2), torch.float32, "uni_t", init="uniform", low=-2, high=-1, context=contexts[0])
    values = t[torch.arange(graph.num_nodes)]
    assert values.shape == (graph.num_nodes, 2) and bool(((values >= -2) & (values < -1)).all())
    with pytest.raises(RpcError, match="rows"):
        DistTensor((graph.num_nodes + 1, 2), torch.float32, "bad_rows", context=contexts[0])
    with pytest.raises(InputError, match="out of range"):
        t[torch.tensor([graph.num_nodes])]
    with pytest.raises(InputError, match="1-d integer"):
        t[torch.tensor([0.5])]


TRAINER = textwrap.dedent(
    """
    import numpy as np, torch, distgnn
    from distgnn.client.tensor import DistTensor
    ctx = distgnn.initialize()
    n = {num_nodes}
    t = DistTensor((n, 4), torch.float32, "concurrent_add", init="zeros")
    ctx.barrier("created")
    rng = np.random.default_rng(ctx.rank)
    for step in range({steps}):
        ids = rng.integers(0, n, 300)
        t.push(torch.from_numpy(ids), torch.ones(300, 4) * (ctx.rank + 1), mode="add")
    ctx.barrier("pushed")
    distgnn.shutdown()
    """
)


def test_concurrent_init_and_add_from_three_trainer_processes_lose_nothing(served):
    graph, cluster, contexts = served
    steps = 15
    procs = []
    for rank in range(3):
        env = {**os.environ, **cluster.trainer_env(rank), "RANK": str(rank), "WORLD_SIZE": "3"}
        code = TRAINER.format(num_nodes=graph.num_nodes, steps=steps)
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
    expected = np.zeros((graph.num_nodes, 4), np.float32)
    for rank in range(3):
        rng = np.random.default_rng(rank)
        for _ in range(steps):
            np.add.at(expected, rng.integers(0, graph.num_nodes, 300), float(rank + 1))
    t = DistTensor.attach((graph.num_nodes, 4), torch.float32, "concurrent_add", "node", contexts[1])
    np.testing.assert_array_equal(t[torch.arange(graph.num_nodes)].numpy(), expected)


def test_pulls_split_into_many_chunks_reassemble_in_order(served, monkeypatch):
    import distgnn.client.tensor

    graph, _, contexts = served
    monkeypatch.setattr(distgnn.client.tensor, "PULL_CHUNK_BYTES", 7 * 32)  # 7 rows of 8 float32 per request
    t = DistTensor.attach((graph.num_nodes, 8), torch.float32, "feat", "node", contexts[0])
    rng = np.random.default_rng(11)
    for ids in (rng.integers(0, graph.num_nodes, 333), rng.integers(*graph.node_map[2], 50)):
        np.testing.assert_array_equal(t[torch.from_numpy(ids)].numpy(), graph.ndata["feat"][ids])


def test_a_reply_of_the_wrong_row_shape_is_named_not_copied(served, monkeypatch):
    # A server that answers a pull with rows of another width (a corrupt or foreign reply): the read names
    # the tensor and both shapes rather than copying bytes into the wrong rows.
    from distgnn.rpc.client import Reply

    graph, _, contexts = served
    client = contexts[0].client
    t = DistTensor.attach((graph.num_nodes, 8), torch.float32, "feat", "node", contexts[0])
    real_wait = client.wait
    narrowed = lambda rids: [Reply(r.header, [r.arrays[0][:, :5]]) for r in real_wait(rids)]  # noqa: E731
    monkeypatch.setattr(client, "wait", narrowed)
    start, end = graph.node_map[0]
    ids = np.array([start, end, graph.num_nodes - 1], dtype=np.int64)  # one local row, two remote
    with pytest.raises(InputError, match=r"feat: a pull came back as float32\[1, 5\], expected float32\[1, 8\]"):
        t[torch.from_numpy(ids)]


def _self_and_mean_reference(table: np.ndarray, dst: np.ndarray, indptr: np.ndarray, src: np.ndarray) -> np.ndarray:
    means = np.zeros((len(dst), table.shape[1]), dtype=np.float64)
    for d in range(len(dst)):
        if indptr[d + 1] > indptr[d]:
            means[d] = table[src[indptr[d] : indptr[d + 1]]].astype(np.float64).mean(0)
    return np.concatenate([table[dst], means], axis=1)


def _feature_with_chunks(served, machine: int, chunk_rows: int | None, monkeypatch) -> DistTensor:
    """The served ``feat`` (8 float32 columns) seen from ``machine``, its pulls in chunks of ``chunk_rows`` rows."""
    import distgnn.client.tensor

    graph, _, contexts = served
    if chunk_rows is not None:
        monkeypatch.setattr(distgnn.client.tensor, "PULL_CHUNK_BYTES", chunk_rows * 4 * 8)
    return DistTensor.attach((graph.num_nodes, 8), torch.float32, "feat", "node", contexts[machine])


def _source_draws(graph, machine: int, rng: np.random.Generator, unique: bool) -> dict:
    """Draws of n node ids from anywhere, from ``machine``'s own range only and from the others' only."""
    start, end = graph.node_map[machine]
    pools = {
        "any": np.arange(graph.num_nodes),
        "all_local": np.arange(start, end),
        "all_remote": np.concatenate([np.arange(0, start), np.arange(end, graph.num_nodes)]),
    }
    return {case: (lambda n, pool=pool: rng.choice(pool, n, replace=not unique)) for case, pool in pools.items()}


@pytest.mark.parametrize("machine", [0, 2])
@pytest.mark.parametrize("chunk_rows", [None, 3])
def test_self_and_mean_summed_by_the_owners_equals_the_reference(served, machine, chunk_rows, monkeypatch):
    # The owners' partial sums (this machine's from shared memory, the others' by neighbor_sum, in chunks of a
    # few destinations spread over the servers) put together equal the mean of the pulled rows.
    graph, _, contexts = served
    t = _feature_with_chunks(served, machine, chunk_rows, monkeypatch)
    table = graph.ndata["feat"]
    rng = np.random.default_rng([machine, chunk_rows or 0])
    for case, draw in _source_draws(graph, machine, rng, unique=False).items():
        dst = rng.integers(0, graph.num_nodes, 40)
        degrees = rng.integers(0, 6, len(dst))  # zeros included: no neighbours, a zero mean
        indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int64)
        src = draw(int(indptr[-1]))
        got = t.self_and_mean(dst, indptr, src)
        assert got.dtype == torch.float32 and got.shape == (len(dst), 16), case
        np.testing.assert_allclose(
            got.numpy(), _self_and_mean_reference(table, dst, indptr, src), rtol=1e-5, atol=1e-6, err_msg=case
        )
    empty = t.self_and_mean(np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int64))
    assert empty.shape == (0, 16)


@pytest.mark.parametrize("machine", [0, 2])
@pytest.mark.parametrize("chunk_rows", [None, 3])
def test_read_self_and_mean_equals_the_mean_of_the_read_rows(served, machine, chunk_rows, monkeypatch):
    # The trainer's sums over the rows where they lie (shared memory, and the replies of pulls in chunks of a
    # few rows spread over the servers) equal the block's [self | mean] of the rows a read gives.
    graph, _, contexts = served
    t = _feature_with_chunks(served, machine, chunk_rows, monkeypatch)
    table = graph.ndata["feat"]
    rng = np.random.default_rng([machine, chunk_rows or 0, 5])
    for case, draw in _source_draws(graph, machine, rng, unique=True).items():
        src_ids = draw(30)
        degrees = rng.integers(0, 6, 12)  # 12 destinations (the first 12 sources), some without neighbours
        indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int64)
        indices = rng.integers(0, len(src_ids), int(indptr[-1]))
        got = t.read_self_and_mean(src_ids, indptr, indices)
        assert got.dtype == torch.float32 and got.shape == (12, 16), case
        expected = _self_and_mean_reference(table, src_ids[:12], indptr, src_ids[indices])
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-6, err_msg=case)
    with pytest.raises(InputError, match="feat: read_self_and_mean: source index 30 of edge 1 is outside"):
        t.read_self_and_mean(src_ids, np.array([0, 2], np.int64), np.array([0, 30], np.int64))
    with pytest.raises(InputError, match="indptr over at most 30 destinations"):
        t.read_self_and_mean(src_ids, np.zeros(32, np.int64), np.zeros(0, np.int64))


def test_self_and_mean_refuses_a_bad_csr_or_a_tensor_that_is_not_float_rows(served):
    graph, _, contexts = served
    t = DistTensor.attach((graph.num_nodes, 8), torch.float32, "feat", "node", contexts[0])
    dst = np.array([1, 2], dtype=np.int64)
    with pytest.raises(InputError, match="indptr of 3 entries rising from 0 to 3"):
        t.self_and_mean(dst, np.array([0, 2, 1]), np.array([4, 5, 6]))
    with pytest.raises(InputError, match="indptr of 3 entries"):
        t.self_and_mean(dst, np.array([0, 3]), np.array([4, 5, 6]))
    with pytest.raises(InputError, match="out of range|outside"):
        t.self_and_mean(dst, np.array([0, 1, 2]), np.array([4, graph.num_nodes]))
    label = DistTensor.attach(graph.ndata["label"].shape, torch.int64, "label", "node", contexts[0])
    with pytest.raises(InputError, match="float32"):
        label.self_and_mean(dst, np.array([0, 1, 2]), np.array([4, 5]))
