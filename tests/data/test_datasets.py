"""Datasets by name: dispatch, graph names, Planetoid normalisation, and partition reuse in a workdir."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import pytest

from distgnn.data import datasets
from distgnn.data.datasets import DatasetSpec, graph_name, load_dataset
from distgnn.errors import ConfigError
from distgnn.partition.prepare import ensure_partition

CORA = (Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "planetoid").resolve()
SMALL = DatasetSpec("synthetic", num_nodes=300, avg_degree=4, feat_dim=8, num_classes=3, seed=5)


def test_synthetic_graphs_are_named_by_size_and_seed_and_built_to_that_size() -> None:
    assert graph_name(SMALL) == "synthetic-n300-d4-f8-c3-s5"
    g = load_dataset(SMALL)
    assert g.name == "synthetic-n300-d4-f8-c3-s5"
    assert g.num_nodes == 300 and g.ndata["feat"].shape == (300, 8)
    assert int(g.ndata["label"].max()) + 1 <= 3


def test_npz_datasets_load_from_the_path_after_the_colon(tmp_path) -> None:
    path = tmp_path / "tiny.npz"
    np.savez(path, src=np.array([0, 1, 2]), dst=np.array([1, 2, 0]), ndata_feat=np.eye(3, dtype=np.float32))
    spec = DatasetSpec(f"npz:{path}")
    assert spec.kind == "npz" and spec.argument == str(path)
    g = load_dataset(spec)
    assert g.name == "tiny" and g.num_nodes == 3 and g.num_edges == 3


@pytest.mark.parametrize("name", ["products", "npz", "npz:", "cora:x", "synthetic:3"])
def test_unknown_names_and_misplaced_arguments_are_refused_with_the_known_kinds(name) -> None:
    with pytest.raises(ConfigError, match=r"unknown dataset .*cora\|citeseer\|pubmed\|synthetic\|npz:PATH"):
        graph_name(DatasetSpec(name))


def test_a_registered_kind_is_found_by_name_and_cannot_be_registered_twice(monkeypatch) -> None:
    monkeypatch.setattr(datasets, "_KINDS", dict(datasets._KINDS))
    made = load_dataset(SMALL)
    datasets.register("fixed", lambda spec: made, lambda spec: f"fixed-{spec.argument}", takes_argument=True)
    assert graph_name(DatasetSpec("fixed:a")) == "fixed-a"
    assert load_dataset(DatasetSpec("fixed:b")).name == "fixed-b"
    assert "fixed:PATH" in datasets.kinds()
    with pytest.raises(ConfigError, match="already registered"):
        datasets.register("fixed", lambda spec: made)


def test_spec_from_the_shared_flags() -> None:
    parser = argparse.ArgumentParser()
    datasets.add_dataset_args(parser)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(["--dataset=synthetic", "--num-nodes=300", "--avg-degree=4", "--feat-dim=8"])
    spec = DatasetSpec.from_args(args)
    assert spec == DatasetSpec("synthetic", None, 300, 4.0, 8, 16, 0)


@pytest.mark.skipif(not (CORA / "ind.cora.graph").exists(), reason=f"Cora files not found in {CORA}")
def test_planetoid_features_are_row_normalised() -> None:
    g = load_dataset(DatasetSpec("cora", str(CORA)))
    sums = g.ndata["feat"].sum(1)
    assert g.name == "cora" and g.ndata["feat"].dtype == np.float32
    np.testing.assert_allclose(sums[sums > 0], 1.0, rtol=1e-5)


def test_ensure_partition_reuses_a_matching_partition_and_rewrites_other_ones(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="distgnn.partition.prepare")
    first = ensure_partition(SMALL, 2, "random", tmp_path)
    assert first == tmp_path / "synthetic-n300-d4-f8-c3-s5-random-2" / "synthetic-n300-d4-f8-c3-s5.json"
    assert "partitioned synthetic-n300-d4-f8-c3-s5 into 2 parts" in caplog.text
    stamp = first.stat().st_mtime_ns
    caplog.clear()
    assert ensure_partition(SMALL, 2, "random", tmp_path) == first
    assert "reusing partition" in caplog.text and first.stat().st_mtime_ns == stamp
    first.write_text("{ not json")
    caplog.clear()
    assert ensure_partition(SMALL, 2, "random", tmp_path) == first
    assert "re-partitioning" in caplog.text and "partitioned" in caplog.text
    other = ensure_partition(SMALL, 3, "random", tmp_path)
    assert other.parent.name.endswith("-random-3") and other != first
