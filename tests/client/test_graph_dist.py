"""DistGraph on a cluster serving the real partitioner's output (reshuffled ids, HALO nodes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from serving_graphs import child_processes, job_files

import distgnn
from distgnn.client.context import connect
from distgnn.data.synthetic import synthetic
from distgnn.errors import ConfigError
from distgnn.partition import partition_graph
from distgnn.partition.format import load_orig_ids, read_meta
from distgnn.train.cluster import LocalCluster


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    graph = synthetic(num_nodes=800, avg_degree=6, feat_dim=8, num_classes=4, seed=3)
    json_path = partition_graph(graph, 2, tmp_path_factory.mktemp("graph") / "out", method="random", seed=1)
    orig_nid, orig_eid = load_orig_ids(read_meta(json_path), mmap=False)
    with LocalCluster(json_path, servers_per_machine=2, rpc_timeout_s=20) as cluster:
        yield graph, json_path, orig_nid, orig_eid, cluster
    assert job_files(cluster.job_id) == []
    assert child_processes() == []


def test_initialize_from_the_environment_and_read_features(served):
    graph, json_path, orig_nid, _, cluster = served
    ctx = distgnn.initialize(environ=cluster.trainer_env(1))
    try:
        with pytest.raises(ConfigError, match="already initialized"):
            distgnn.initialize(environ=cluster.trainer_env(1))
        g = distgnn.DistGraph(graph.name)
        assert g.machine_id == 1 and ctx.rank == 1 and ctx.world_size == 2
        assert g.num_nodes() == graph.num_nodes and g.num_edges() == read_meta(json_path).num_edges
        assert set(g.ndata) == set(graph.ndata)
        ids = torch.randperm(graph.num_nodes)[:300]
        for name, values in graph.ndata.items():
            np.testing.assert_array_equal(g.ndata[name][ids].numpy(), values[orig_nid[ids.numpy()]])
    finally:
        distgnn.shutdown()
    with pytest.raises(ConfigError, match="not initialized"):
        distgnn.DistGraph(graph.name)


@pytest.mark.parametrize("machine", [0, 1])
def test_local_partition_views_shared_memory_and_matches_the_graph(served, machine):
    graph, json_path, orig_nid, orig_eid, cluster = served
    with connect(cluster.config(machine), rank=machine, world_size=2) as ctx:
        g = distgnn.DistGraph(graph.name, json_path, context=ctx)
        lp = g.local_partition
        assert lp.node_range == tuple(g.get_partition_book().node_range(machine))
        assert not lp.indptr.flags.writeable and not lp.indices.flags.owndata
        dst_local = np.repeat(np.arange(lp.num_owned_nodes), np.diff(lp.indptr))
        src_global, dst_global = lp.local2global[lp.indices], dst_local + lp.node_range[0]
        # Every local edge is an original edge with the endpoints the id maps say.
        np.testing.assert_array_equal(graph.src[orig_eid[lp.eids]], orig_nid[src_global])
        np.testing.assert_array_equal(graph.dst[orig_eid[lp.eids]], orig_nid[dst_global])


def test_in_degrees_local_and_remote(served):
    graph, json_path, orig_nid, orig_eid, cluster = served
    with connect(cluster.config(0), rank=0, world_size=2) as ctx:
        g = distgnn.DistGraph(graph.name, json_path, context=ctx)
        new_dst = np.empty(graph.num_nodes, np.int64)
        new_dst[orig_nid] = np.arange(graph.num_nodes)
        expected = np.bincount(new_dst[graph.dst[orig_eid]], minlength=graph.num_nodes)
        rng = np.random.default_rng(0)
        start, end = g.get_partition_book().node_range(0)
        mixed = rng.integers(0, graph.num_nodes, 500)
        for ids in (mixed, rng.integers(start, end, 50), rng.integers(end, graph.num_nodes, 50)):
            np.testing.assert_array_equal(g.in_degrees(torch.from_numpy(ids)).numpy(), expected[ids])
        assert g.in_degrees(torch.zeros(0, dtype=torch.int64)).shape == (0,)


def test_wrong_graph_name_is_refused(served):
    graph, json_path, _, _, cluster = served
    with connect(cluster.config(0)) as ctx, pytest.raises(ConfigError, match="holds graph"):
        distgnn.DistGraph("not-" + graph.name, json_path, context=ctx)


def test_node_split_reads_a_dist_tensor_mask(served):
    graph, json_path, orig_nid, _, cluster = served
    with connect(cluster.config(1), rank=1, world_size=2) as ctx:
        g = distgnn.DistGraph(graph.name, json_path, context=ctx)
        share = distgnn.node_split(g.ndata["train_mask"], g.get_partition_book(), context=ctx)
        new_mask = graph.ndata["train_mask"][orig_nid]
        expected = distgnn.node_split(new_mask, g.get_partition_book(), rank=1, world_size=2)
        assert len(share) == new_mask.sum() // 2
        np.testing.assert_array_equal(share.numpy(), expected.numpy())


def test_chunked_pulls_spread_over_main_and_backup_servers(served, monkeypatch):
    import distgnn.client.tensor

    graph, json_path, orig_nid, _, cluster = served
    monkeypatch.setattr(distgnn.client.tensor, "PULL_CHUNK_BYTES", 5 * 8 * 4)
    with connect(cluster.config(0), rank=0, world_size=2) as ctx:
        g = distgnn.DistGraph(graph.name, json_path, context=ctx)
        ids = np.random.default_rng(2).integers(0, graph.num_nodes, 97)
        np.testing.assert_array_equal(g.ndata["feat"][ids].numpy(), graph.ndata["feat"][orig_nid[ids]])


def test_initialize_without_a_launcher_environment_says_what_is_missing():
    with pytest.raises(ConfigError, match="no ip_config"):
        distgnn.initialize(environ={})
