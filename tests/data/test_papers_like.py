"""The papers100M-shaped chunked generator: format, shapes, determinism, power-law degrees."""

from __future__ import annotations

import json

import numpy as np
import pytest

from distgnn.data.chunked import read_chunked
from distgnn.data.hetero import materialize
from distgnn.data.papers_like import _Layout, write_papers_like
from distgnn.errors import InputError


def test_layout_permutation_round_trips():
    layout = _Layout(1_000_003, 50, seed=3)
    positions = np.arange(0, 1_000_003, 7, dtype=np.int64)
    nodes = layout.node_of(positions)
    assert np.array_equal(layout.position_of(nodes), positions)
    assert np.unique(nodes).size == positions.size


def test_writes_a_chunked_graph_of_the_requested_size(tmp_path):
    meta_path = write_papers_like(tmp_path / "a", 3000, avg_degree=12, feat_dim=8, num_classes=5, nodes_per_chunk=1000)
    meta = json.loads(meta_path.read_text())
    assert meta["num_nodes_per_chunk"] == [[1000, 1000, 1000]] and sum(meta["num_edges_per_chunk"][0]) == 36_000
    graph = read_chunked(meta_path)
    feats = {name: materialize(a) for name, a in graph.ndata["paper"].items()}
    assert feats["feat"].shape == (3000, 8) and feats["feat"].dtype == np.float32
    assert feats["label"].max() < 5 and feats["train_mask"].dtype == bool
    assert not (feats["train_mask"] & feats["test_mask"]).any()
    src, dst = graph.edges[("paper", "cites", "paper")]
    in_degree = np.bincount(dst, minlength=3000)
    assert in_degree.max() > 8 * np.median(in_degree)  # a heavy tail
    # Two processes writing the chunks write the same files.
    again = write_papers_like(
        tmp_path / "b", 3000, avg_degree=12, feat_dim=8, num_classes=5, nodes_per_chunk=1000, jobs=2
    )
    for rel in ("edge_index/paper:cites:paper2.npy", "node_data/paper/feat-1.npy", "node_data/paper/label-0.npy"):
        assert np.array_equal(np.load(meta_path.parent / rel), np.load(again.parent / rel))
    with pytest.raises(InputError, match="already exists"):
        write_papers_like(tmp_path / "a", 3000)
