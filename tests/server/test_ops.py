"""Every server op on a live 2-machine x 2-server cluster, compared with the global graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from serving_graphs import child_processes, job_files, small_graph

from distgnn.errors import RpcError
from distgnn.partition.format import load_part_array, read_meta
from distgnn.rpc import RpcClient
from distgnn.sampling import cpu
from distgnn.train.cluster import LocalCluster


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    # An installed distgnn ships the compiled sampler; in a source tree whose C++ changed, build it
    # here once, so the servers' first 'sample' loads it instead of compiling within an RPC deadline.
    cpu.extension()
    graph = small_graph(tmp_path_factory.mktemp("ops") / "out", num_parts=2)
    with (
        LocalCluster(graph.json_path, servers_per_machine=2, rpc_timeout_s=20) as cluster,
        RpcClient(cluster.config(0)) as client,
    ):
        yield graph, cluster, client
    assert job_files(cluster.job_id) == []
    assert child_processes() == []


def _owned(graph, machine, rng, n):
    start, end = graph.node_map[machine]
    return rng.integers(start, end, n).astype(np.int64)


def test_meta_describes_each_partition(served):
    graph, cluster, client = served
    for machine in range(2):
        for server in range(2):
            h = client.call(machine, "meta", server_id=server).header
            assert (h["machine_id"], h["server_id"]) == (machine, server)
            assert h["node_range"] == graph.node_map[machine].tolist()
            assert h["edge_range"] == graph.edge_map[machine].tolist()
            assert (h["num_nodes"], h["num_edges"]) == (graph.num_nodes, len(graph.src))


@pytest.mark.parametrize("server", [0, 1])
def test_pull_from_main_and_backup_equals_features(served, server):
    graph, _, client = served
    rng = np.random.default_rng(server)
    for machine in range(2):
        ids = _owned(graph, machine, rng, 50)
        for name in ("feat", "label", "train_mask"):
            got = client.call(machine, "pull", {"policy": "node", "name": name}, [ids], server_id=server).arrays[0]
            np.testing.assert_array_equal(got, graph.ndata[name][ids])
        eids = rng.integers(*graph.edge_map[machine], 20).astype(np.int64)
        got = client.call(machine, "pull", {"policy": "edge", "name": "w"}, [eids], server_id=server).arrays[0]
        np.testing.assert_array_equal(got, graph.edata["w"][eids])


def test_pipelined_requests_to_both_machines_are_matched_by_id(served):
    graph, _, client = served
    rng = np.random.default_rng(3)
    batches = [(m, _owned(graph, m, rng, int(rng.integers(0, 40)))) for m in (0, 1, 1, 0, 1)]
    rids = [
        client.send(m, "pull", {"policy": "node", "name": "feat"}, [ids], server_id=i % 2)
        for i, (m, ids) in enumerate(batches)
    ]
    for reply, (_, ids) in zip(client.wait(rids[::-1]), batches[::-1], strict=True):
        np.testing.assert_array_equal(reply.arrays[0], graph.ndata["feat"][ids])


def test_degrees_are_in_degrees(served):
    graph, _, client = served
    expected = np.bincount(graph.dst, minlength=graph.num_nodes)
    for machine in range(2):
        ids = graph.node_map[machine]
        ids = np.arange(*ids, dtype=np.int64)
        got = client.call(machine, "degrees", arrays=[ids], server_id=1).arrays[0]
        np.testing.assert_array_equal(got, expected[ids])
        # One edge type: its in-degrees are all of them; there is no second type.
        got = client.call(machine, "degrees", {"etype": 0}, [ids], server_id=1).arrays[0]
        np.testing.assert_array_equal(got, expected[ids])
        with pytest.raises(RpcError, match=r"edge type id 1 is not in \[0, 1\)"):
            client.call(machine, "degrees", {"etype": 1}, [ids])


@pytest.mark.parametrize("server", [0, 1])
def test_find_edges_gives_each_edges_endpoints(served, server):
    graph, _, client = served
    rng = np.random.default_rng(10 + server)
    for machine in range(2):
        eids = rng.integers(*graph.edge_map[machine], 40).astype(np.int64)  # any order, repeats
        src, dst = client.call(machine, "find_edges", arrays=[eids], server_id=server).arrays
        np.testing.assert_array_equal(src, graph.src[eids])
        np.testing.assert_array_equal(dst, graph.dst[eids])


def test_find_edges_refuses_edges_of_another_partition_and_wrong_dtypes(served):
    graph, _, client = served
    foreign = np.array([graph.edge_map[1][0]], dtype=np.int64)
    with pytest.raises(RpcError, match=rf"find_edges ids: id {foreign[0]} is not owned by this partition"):
        client.call(0, "find_edges", arrays=[foreign])
    with pytest.raises(RpcError, match="find_edges ids must be a 1-d int64 array"):
        client.call(0, "find_edges", arrays=[np.zeros(3, np.int32)])


@pytest.mark.parametrize("fanout, replace", [(3, False), (3, True), (-1, False), (0, False)])
def test_sample_returns_real_in_edges(served, fanout, replace):
    graph, _, client = served
    degree = np.bincount(graph.dst, minlength=graph.num_nodes)
    for machine in range(2):
        seeds = np.arange(*graph.node_map[machine], dtype=np.int64)[::3]
        counts, nbrs, eids = client.call(
            machine, "sample", {"fanout": fanout, "replace": replace, "seed": 7}, [seeds], server_id=machine
        ).arrays
        if fanout < 0:
            want = degree[seeds]
        elif replace:
            want = np.where(degree[seeds] > 0, fanout, 0)
        else:
            want = np.minimum(degree[seeds], fanout)
        np.testing.assert_array_equal(counts, want)
        owner = np.repeat(seeds, counts)
        np.testing.assert_array_equal(graph.dst[eids], owner)
        np.testing.assert_array_equal(graph.src[eids], nbrs)
        if not replace:
            for seed in seeds:
                picked = eids[owner == seed]
                assert len(np.unique(picked)) == len(picked)
        if fanout < 0:
            np.testing.assert_array_equal(np.sort(eids), np.flatnonzero(np.isin(graph.dst, seeds)))


def test_sample_with_probability_never_picks_zero_weight_edges(served):
    graph, _, client = served
    machine = 1
    seeds = np.arange(*graph.node_map[machine], dtype=np.int64)
    counts, _, eids = client.call(machine, "sample", {"fanout": 2, "prob": "w", "seed": 1}, [seeds]).arrays
    assert counts.sum() > 0 and np.all(graph.edata["w"][eids] > 0)
    np.testing.assert_array_equal(graph.dst[eids], np.repeat(seeds, counts))


def test_sample_refuses_a_probability_tensor_that_is_not_float32(served):
    graph, _, client = served
    fields = {"policy": "edge", "name": "w64", "dtype": "float64", "shape": [len(graph.src)], "init": "ones"}
    client.call(0, "init_data", fields)
    seeds = np.arange(*graph.node_map[0], dtype=np.int64)
    with pytest.raises(RpcError, match="float32"):
        client.call(0, "sample", {"fanout": 2, "prob": "w64"}, [seeds])


def test_sample_is_deterministic_for_a_seed(served):
    graph, _, client = served
    seeds = np.arange(*graph.node_map[0], dtype=np.int64)
    a = client.call(0, "sample", {"fanout": 2, "seed": 11}, [seeds], server_id=0).arrays
    b = client.call(0, "sample", {"fanout": 2, "seed": 11}, [seeds], server_id=1).arrays
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_server_samples_without_loading_torch(served):
    graph, cluster, client = served
    seeds = np.arange(*graph.node_map[0], dtype=np.int64)
    client.call(0, "sample", {"fanout": 2, "seed": 3}, [seeds], server_id=0)
    maps = (Path("/proc") / str(cluster.process(0, 0).pid) / "maps").read_text()
    assert "_cpu_kernels" in maps  # the compiled sampler is loaded ...
    assert "libtorch" not in maps  # ... and torch is not


def test_push_assign_and_add_on_a_new_tensor(served):
    graph, _, client = served
    client.call(
        1,
        "init_data",
        {"policy": "node", "name": "ops_t", "dtype": "float64", "shape": [graph.num_nodes, 2], "init": "ones"},
    )
    ids = np.array([160, 161, 160, 299], np.int64)
    rows = np.arange(8, dtype=np.float64).reshape(4, 2)
    client.call(1, "push", {"policy": "node", "name": "ops_t", "mode": "add"}, [ids, rows])
    got = client.call(
        1, "pull", {"policy": "node", "name": "ops_t"}, [np.array([160, 161, 299, 200], np.int64)], server_id=1
    )
    np.testing.assert_array_equal(got.arrays[0], [[1 + 0 + 4, 1 + 1 + 5], [3, 4], [7, 8], [1, 1]])
    client.call(1, "push", {"policy": "node", "name": "ops_t", "mode": "assign"}, [ids[1:2], rows[:1]])
    got = client.call(1, "pull", {"policy": "node", "name": "ops_t"}, [ids[1:2]]).arrays[0]
    np.testing.assert_array_equal(got, rows[:1])


def test_writes_go_to_the_main_server_only(served):
    graph, _, client = served
    with pytest.raises(RpcError, match="main server"):
        client.call(
            0,
            "push",
            {"policy": "node", "name": "feat", "mode": "add"},
            [np.array([0]), np.zeros((1, 8), np.float32)],
            server_id=1,
        )


def test_init_data_twice_maps_the_same_tensor_and_refuses_another_shape(served):
    graph, _, client = served
    fields = {
        "policy": "edge",
        "name": "ops_e",
        "dtype": "float32",
        "shape": [len(graph.src)],
        "init": "uniform",
        "low": 2.0,
        "high": 3.0,
    }
    client.call(0, "init_data", fields)
    ids = np.arange(*graph.edge_map[0], dtype=np.int64)
    first = client.call(0, "pull", {"policy": "edge", "name": "ops_e"}, [ids]).arrays[0].copy()
    assert np.all((first >= 2) & (first < 3))
    client.call(0, "init_data", fields)
    np.testing.assert_array_equal(client.call(0, "pull", {"policy": "edge", "name": "ops_e"}, [ids]).arrays[0], first)
    with pytest.raises(RpcError, match="exists"):
        client.call(0, "init_data", {**fields, "shape": [len(graph.src), 2]})


def _adam_tables(client, graph, name: str, dim: int) -> None:
    for table, width, init in ((name, dim, "uniform"), (f"{name}.adam", 2 * dim + 1, "zeros")):
        shape = [graph.num_nodes, width]
        client.call(1, "init_data", {"policy": "node", "name": table, "dtype": "float32", "shape": shape, "init": init})


def test_adam_step_equals_a_numpy_reference(served):
    graph, _, client = served
    dim, lr, b1, b2, eps = 3, 0.05, 0.8, 0.99, 1e-6
    _adam_tables(client, graph, "ops_adam", dim)
    rng = np.random.default_rng(4)
    start, end = graph.node_map[1]
    everything = np.arange(start, end, dtype=np.int64)
    weight = client.call(1, "pull", {"policy": "node", "name": "ops_adam"}, [everything]).arrays[0].astype(np.float64)
    m, v, t = np.zeros_like(weight), np.zeros_like(weight), np.zeros((len(weight), 1))
    fields = {"policy": "node", "name": "ops_adam", "state": "ops_adam.adam", "lr": lr, "beta1": b1, "beta2": b2}
    for _ in range(3):
        ids = np.unique(_owned(graph, 1, rng, 40))
        grad = rng.standard_normal((len(ids), dim)).astype(np.float32)
        client.call(1, "adam_step", {**fields, "eps": eps}, [ids, grad])
        at = ids - start
        m[at] = b1 * m[at] + (1 - b1) * grad
        v[at] = b2 * v[at] + (1 - b2) * grad.astype(np.float64) ** 2
        t[at] += 1
        weight[at] -= lr * (m[at] / (1 - b1 ** t[at])) / (np.sqrt(v[at] / (1 - b2 ** t[at])) + eps)
    got = client.call(1, "pull", {"policy": "node", "name": "ops_adam"}, [everything], server_id=1).arrays[0]
    np.testing.assert_allclose(got, weight, rtol=1e-5, atol=1e-6)
    state = client.call(1, "pull", {"policy": "node", "name": "ops_adam.adam"}, [everything]).arrays[0]
    np.testing.assert_allclose(state, np.concatenate([m, v, t], axis=1), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"arrays": [np.array([160, 160]), np.zeros((2, 3), np.float32)]}, "unique"),
        ({"arrays": [np.array([160]), np.zeros((1, 4), np.float32)]}, "gradient must be"),
        ({"arrays": [np.array([160]), np.zeros((1, 3), np.float64)]}, "gradient must be"),
        ({"arrays": [np.array([5]), np.zeros((1, 3), np.float32)]}, "not owned"),
        ({"state": "ops_adam_missing"}, "no node tensor"),
        ({"state": "ops_adam_bad2.adam"}, "state must be float32 rows of 7"),
        ({"lr": -1.0}, "lr > 0"),
        ({"beta1": 1.0}, "betas"),
        ({"eps": None}, "eps"),
        ({"server_id": 1}, "main server"),
    ],
)
def test_adam_step_refuses_bad_requests(served, change, message):
    graph, _, client = served
    _adam_tables(client, graph, "ops_adam_checks", 3)
    _adam_tables(client, graph, "ops_adam_bad2", 2)  # its state is 5 wide, not 7
    request = {
        "policy": "node",
        "name": "ops_adam_checks",
        "state": "ops_adam_checks.adam",
        "lr": 0.1,
        "beta1": 0.9,
        "beta2": 0.999,
        "eps": 1e-8,
        "arrays": [np.array([160, 161]), np.ones((2, 3), np.float32)],
        "server_id": 0,
    }
    request.update(change)
    arrays, server_id = request.pop("arrays"), request.pop("server_id")
    before = client.call(1, "pull", {"policy": "node", "name": "ops_adam_checks"}, [np.array([160, 161])]).arrays[0]
    with pytest.raises(RpcError, match=message):
        client.call(1, "adam_step", request, arrays, server_id=server_id)
    after = client.call(1, "pull", {"policy": "node", "name": "ops_adam_checks"}, [np.array([160, 161])]).arrays[0]
    np.testing.assert_array_equal(after, before)


@pytest.mark.parametrize(
    "op, fields, arrays, message",
    [
        ("pull", {"policy": "node", "name": "feat"}, [np.array([0, 5, 290])], "not owned"),
        ("pull", {"policy": "node", "name": "nope"}, [np.array([0])], "no node tensor"),
        ("pull", {"policy": "triangle", "name": "feat"}, [np.array([0])], "policy"),
        ("pull", {"policy": "node", "name": "../etc"}, [np.array([0])], "must match"),
        ("pull", {"policy": "node", "name": "feat"}, [np.array([0], np.int32)], "int64"),
        ("pull", {"policy": "node"}, [np.array([0])], "missing"),
        ("sample", {"fanout": 2, "edge_dir": "out"}, [np.array([0])], "edge_dir"),
        ("sample", {"fanout": 10**9}, [np.array([0])], "fanout"),
        ("sample", {"fanout": True}, [np.array([0])], "int"),
        ("frobnicate", {}, [], "unknown op"),
        ("neighbor_sum", {"policy": "node", "name": "label"}, [np.array([0, 1]), np.array([0])], "float32"),
        ("neighbor_sum", {"policy": "node", "name": "feat"}, [np.array([0, 2]), np.array([0])], "rise from 0"),
        ("neighbor_sum", {"policy": "node", "name": "feat"}, [np.array([0, 1]), np.array([290])], "not owned"),
        ("neighbor_sum", {"policy": "node", "name": "feat"}, [np.array([0, 1], np.int32), np.array([0])], "int64"),
        ("neighbor_sum", {"policy": "node", "name": "feat"}, [np.array([0, 1])], "arrays"),
        (
            "init_data",
            {"policy": "node", "name": "wide", "dtype": "float64", "shape": [290, 2**30]},
            [],
            "narrower rows",
        ),
    ],
)
def test_bad_requests_get_error_replies(served, op, fields, arrays, message):
    _, _, client = served
    with pytest.raises(RpcError, match=message):
        client.call(0, op, fields, arrays)
    assert client.call(0, "meta").header["ok"] is True


@pytest.mark.parametrize("server", [0, 1])
def test_neighbor_sum_sums_the_owned_rows_of_each_destination(served, server):
    graph, _, client = served
    rng = np.random.default_rng([server, 9])
    for machine in range(2):
        degrees = rng.integers(0, 5, 30)
        indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int64)
        ids = _owned(graph, machine, rng, int(indptr[-1]))
        fields = {"policy": "node", "name": "feat"}
        got = client.call(machine, "neighbor_sum", fields, [indptr, ids], server_id=server).arrays[0]
        feat = graph.ndata["feat"]
        expected = np.stack([feat[ids[indptr[d] : indptr[d + 1]]].sum(0) for d in range(30)])
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_barrier_releases_all_parties_together(served):
    _, cluster, _ = served
    clients = [RpcClient(cluster.config(m)) for m in (0, 1, 1)]
    try:
        rids = [c.send(0, "barrier", {"name": "b1", "parties": 3}) for c in clients[:2]]
        with pytest.raises(RpcError, match="no reply"):
            clients[0].wait(rids[:1], timeout_s=0.3)
        last = clients[2].send(0, "barrier", {"name": "b1", "parties": 3})
        assert clients[2].wait([last])[0].header["ok"]
        assert clients[1].wait(rids[1:])[0].header["ok"]
    finally:
        for c in clients:
            c.close()


@pytest.mark.parametrize("replace", [False, True])
def test_sample_equals_the_kernel_run_on_the_partition_files(served, replace):
    graph, _, client = served
    meta = read_meta(graph.json_path)
    arrays = {name: load_part_array(meta, 1, name) for name in ("indptr", "indices", "eids", "local2global")}
    seeds = np.random.default_rng(4).permutation(np.arange(*graph.node_map[1], dtype=np.int64))[:60]
    counts, positions = cpu.sample_neighbors(
        arrays["indptr"], arrays["indices"], seeds - graph.node_map[1][0], 4, replace=replace, rng_seed=99
    )
    got = client.call(1, "sample", {"fanout": 4, "replace": replace, "seed": 99}, [seeds], server_id=1).arrays
    np.testing.assert_array_equal(got[0], counts)
    np.testing.assert_array_equal(got[1], arrays["local2global"][arrays["indices"][positions]])
    np.testing.assert_array_equal(got[2], arrays["eids"][positions])


def test_one_client_used_from_several_threads_keeps_replies_apart(served):
    import threading

    graph, _, client = served
    errors = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(20):
                machine = int(rng.integers(2))
                ids = _owned(graph, machine, rng, int(rng.integers(1, 30)))
                got = client.call(machine, "pull", {"policy": "node", "name": "feat"}, [ids], server_id=seed % 2)
                np.testing.assert_array_equal(got.arrays[0], graph.ndata["feat"][ids])
        except Exception as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
