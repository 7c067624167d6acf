"""The replicated structure: every partition's CSC joined into one (``distgnn.client.structure``), and a
NeighborSampler with ``structure="replicated"`` sampling every layer from it with no ``sample`` request.

The joined CSC is checked edge by edge against the original graph (through the partition's id maps), on a
homogeneous and a typed graph; in a job it is joined once per machine into shared memory. The cases on a 2-machine LocalCluster (CPU and CUDA) sit beside the other cluster
cases in test_device.py, which share its cluster.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import numpy as np
import pytest
import torch

from distgnn.client import structure
from distgnn.data import synthetic, synthetic_mag
from distgnn.data.hetero import HeteroGraph
from distgnn.errors import ConfigError, SharedMemoryError
from distgnn.partition import partition_graph
from distgnn.partition.format import load_orig_ids, read_meta
from distgnn.sampling.neighbor import NeighborSampler
from distgnn.sampling.source import InProcessGraph
from distgnn.store import shm


def joined_edges_match(graph_src, graph_dst, meta, csc, num_etypes=1, edge_types=None) -> None:
    """Every position of the joined CSC is an edge of the original graph into its row's node (and of its row's
    edge type), with its source; every edge appears once."""
    orig_nid, orig_eid = (np.asarray(a) for a in load_orig_ids(meta))
    rows = np.repeat(np.arange(len(csc.indptr) - 1), np.diff(csc.indptr))
    assert csc.node_start == 0 and csc.replicated and len(csc.indices) == meta.num_edges
    eids = csc.eids if csc.eid_offset is None else csc.eid_offset + np.arange(meta.num_edges)
    np.testing.assert_array_equal(np.sort(eids), np.arange(meta.num_edges))
    edges = orig_eid[eids]
    np.testing.assert_array_equal(graph_dst[edges], orig_nid[rows // num_etypes])
    np.testing.assert_array_equal(graph_src[edges], orig_nid[csc.indices])
    if edge_types is not None:
        np.testing.assert_array_equal(edge_types[edges], rows % num_etypes)


@pytest.mark.parametrize("edge_ids", ["a range", "held"])
def test_the_joined_csc_holds_every_edge_of_a_partitioned_graph(tmp_path, monkeypatch, edge_ids) -> None:
    graph = synthetic(2000, 6, feat_dim=2, num_classes=2, seed=1)
    meta = read_meta(partition_graph(graph, 3, tmp_path / "g", graph_name="g", method="random"))
    if edge_ids == "held":  # as where a partition numbers its edges otherwise than in CSC order
        monkeypatch.setattr(structure, "range_offset", lambda ids: None)
    csc = structure.replicated_csc(meta, part_id=2)
    assert csc.part_id == 2 and csc.indices.dtype == np.int32
    if edge_ids == "a range":  # a reshuffled partition's: not held
        assert csc.eid_offset == 0 and len(csc.eids) == 0
    else:
        assert csc.eid_offset is None and len(csc.eids) == meta.num_edges
    joined_edges_match(graph.src, graph.dst, meta, csc)
    np.testing.assert_array_equal(csc.local2global, np.arange(graph.num_nodes))


def test_the_joined_csc_of_a_typed_graph_keeps_the_edge_type_rows(tmp_path) -> None:
    graph: HeteroGraph = synthetic_mag(num_papers=300, seed=2)
    meta = read_meta(partition_graph(graph, 2, tmp_path / "mag", graph_name="mag", method="random"))
    k = len(meta.etypes)
    csc = structure.replicated_csc(meta, part_id=0, num_etypes=k)
    offsets = dict(zip(graph.ntypes, np.cumsum([0] + [graph.num_nodes[t] for t in graph.ntypes])[:-1], strict=False))
    etypes = graph.canonical_etypes
    src = np.concatenate([graph.edges[e][0] + offsets[e[0]] for e in etypes])
    dst = np.concatenate([graph.edges[e][1] + offsets[e[2]] for e in etypes])
    types = np.repeat(np.arange(k), [graph.num_edges(e) for e in etypes])
    joined_edges_match(src, dst, meta, csc, k, types)


def test_a_structure_larger_than_the_host_memory_is_refused_with_its_size(tmp_path, monkeypatch) -> None:
    graph = synthetic(500, 4, feat_dim=2, num_classes=2, seed=1)
    meta = read_meta(partition_graph(graph, 2, tmp_path / "g", graph_name="g", method="random"))
    monkeypatch.setattr(structure, "available_bytes", lambda: 1000)
    with pytest.raises(ConfigError, match=r"needs 0\.00 GiB of host memory, 0\.00 GiB available.*partitioned"):
        structure.replicated_csc(meta, 0)


def test_the_sampler_checks_the_structure_option() -> None:
    with pytest.raises(ConfigError, match="structure must be one of"):
        NeighborSampler([3], structure="everywhere")
    with pytest.raises(ConfigError, match="edge arrays"):
        NeighborSampler([3], prob="w", structure="replicated")
    spec = NeighborSampler([3, 2], structure="replicated").spec()
    assert NeighborSampler.from_spec(spec).structure == "replicated"


def test_an_in_process_graph_samples_the_same_blocks_replicated() -> None:
    g = InProcessGraph(synthetic(1500, 6, feat_dim=2, num_classes=2, seed=4))
    seeds = np.arange(0, 1500, 11)
    for device in (None, "cpu"):
        want = NeighborSampler([4, 3], device=device).sample_blocks(g, seeds, rng_seed=7)
        got = NeighborSampler([4, 3], device=device, structure="replicated").sample_blocks(g, seeds, rng_seed=7)
        for a, b in zip(got[2], want[2], strict=True):
            torch.testing.assert_close(a.eids, b.eids)
            torch.testing.assert_close(a.src_nids, b.src_nids)


@pytest.fixture
def job_id():
    job = f"jst{secrets.token_hex(4)}"
    yield job
    shm.remove_segments(job)


def test_a_machine_joins_the_structure_once_and_its_trainers_map_it(tmp_path, job_id) -> None:
    graph = synthetic(800, 5, feat_dim=2, num_classes=2, seed=6)
    meta = read_meta(partition_graph(graph, 2, tmp_path / "g", graph_name="g", method="random"))
    first = structure.machine_structure(job_id, 1, meta)
    second = structure.machine_structure(job_id, 1, meta)  # another trainer of machine 1: maps the same pages
    assert shm.claim_holder(job_id, 1, structure.GROUP) == os.getpid()
    assert first.replicated and first.part_id == 1 and first.eid_offset == 0 and len(first.eids) == 0
    # Both map the shared copy read-only, the builder too (its private join is gone).
    assert not first.indices.flags.writeable and not second.indices.flags.writeable
    np.testing.assert_array_equal(first.indptr, second.indptr)
    joined_edges_match(graph.src, graph.dst, meta, second)
    other = read_meta(partition_graph(graph, 2, tmp_path / "h", graph_name="h", method="random"))
    with pytest.raises(SharedMemoryError, match="is of"):  # machine 1 holds g's structure, not h's
        structure.machine_structure(job_id, 1, other)


def test_a_trainer_waiting_for_a_dead_builder_names_it(tmp_path, job_id) -> None:
    graph = synthetic(300, 4, feat_dim=2, num_classes=2, seed=6)
    meta = read_meta(partition_graph(graph, 2, tmp_path / "g", graph_name="g", method="random"))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    shm.segment_path(job_id, 0, f"{structure.GROUP}.claim").write_text(str(dead.pid))
    with pytest.raises(SharedMemoryError, match=f"pid {dead.pid}.*exited before publishing"):
        structure.machine_structure(job_id, 0, meta, wait_s=10)
