"""SnapshotSequence, the PyTorch Geometric Temporal reader on the real files, the synthetic generator."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from distgnn.errors import InputError
from distgnn.nn.recurrent import normalized_adjacency
from distgnn.snapshot import Snapshot, SnapshotSequence, read_pgt_json, synthetic_sequence, to_device

PGT = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "pyg_temporal"
needs_pgt = pytest.mark.skipif(not (PGT / "chickenpox.json").exists(), reason=f"PGT JSON files not found in {PGT}")


@needs_pgt
@pytest.mark.parametrize(
    "name, snapshots, nodes, features, lags",
    [
        ("chickenpox", 517, 20, 4, None),
        ("pedalme_london", 31, 15, 4, None),
        ("england_covid", 53, 129, 8, None),
        ("twitter_tennis_rg17", 120, 1000, 16, None),
        ("chickenpox", 519, 20, 2, 2),
    ],
)
def test_reads_each_layout_framed_as_pgt(name, snapshots, nodes, features, lags):
    seq = read_pgt_json(PGT / f"{name}.json", lags=lags)
    assert (len(seq), seq.num_nodes, seq.num_features) == (snapshots, nodes, features)
    assert seq.has_targets and not seq.growing


@needs_pgt
def test_lag_framing_and_standardisation():
    raw = json.loads((PGT / "chickenpox.json").read_text())
    seq = read_pgt_json(PGT / "chickenpox.json")
    fx = np.asarray(raw["FX"], np.float32)
    np.testing.assert_allclose(seq[3].x, fx[3:7].T)
    np.testing.assert_allclose(seq[3].y, fx[7])
    assert seq[0].edge_weight is None and seq[0].num_edges == len(raw["edges"])

    covid = json.loads((PGT / "england_covid.json").read_text())
    seq = read_pgt_json(PGT / "england_covid.json")
    y = np.asarray(covid["y"], np.float64)
    z = (y - y.mean(0)) / (y.std(0) + 1e-10)
    np.testing.assert_allclose(seq[5].y, z[13], rtol=1e-5)
    assert seq[5].num_edges == len(covid["edge_mapping"]["edge_index"]["5"])
    np.testing.assert_allclose(seq[5].edge_weight, covid["edge_mapping"]["edge_weight"]["5"])


@needs_pgt
def test_twitter_one_hot_and_next_hour_target():
    raw = json.loads((PGT / "twitter_tennis_rg17.json").read_text())
    seq = read_pgt_json(PGT / "twitter_tennis_rg17.json")
    x = seq[0].x
    assert np.all(x[:, :5].sum(1) == 1) and np.all(x[:, 5:].sum(1) == 1)
    degree, transitivity = raw["0"]["X"][0]
    assert x[0, min(int(np.ceil(np.log(degree + 1))), 4)] == 1
    assert x[0, 5 + int(np.floor(transitivity * 10))] == 1
    np.testing.assert_allclose(seq[0].y, np.log1p(np.asarray(raw["1"]["y"], np.float32)))
    np.testing.assert_allclose(seq[-1].y, np.log1p(np.asarray(raw["119"]["y"], np.float32)))


@needs_pgt
def test_a_fifth_file_of_a_known_layout_reads(tmp_path):
    raw = json.loads((PGT / "pedalme_london.json").read_text())
    raw["X"] = raw["X"][:20]
    path = tmp_path / "my_deliveries.json"
    path.write_text(json.dumps(raw))
    seq = read_pgt_json(path)
    assert len(seq) == 16 and seq.name == "my_deliveries"


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    "data, message",
    [
        ({"nodes": [1]}, "match no PyTorch Geometric Temporal layout"),
        ({"edges": [[0, 1]], "FX": [[1.0, 2.0], [1.0]]}, "rows differ in length"),
        ({"edges": [[0, 5]], "FX": [[1.0, 2.0]] * 6}, "edge endpoints span"),
        ({"edges": [[0, 1]], "FX": [[1.0, 2.0]] * 3}, "leave no snapshot"),
        ({"edges": [[0, 1]], "weights": [1.0, 2.0], "X": [[1.0, 2.0]] * 6}, "2 values for 1 edges"),
        ({"time_periods": 9, "edge_mapping": {"edge_index": {}}, "y": [[1.0]] * 9}, "no key 'edge_weight'"),
        ({"time_periods": 2, "0": {"edges": [], "weights": []}}, "no key 'X'"),
        (
            {
                "time_periods": 2,
                "0": {"edges": [], "weights": [], "X": [[1, 0.5]], "y": [1]},
                "1": {"edges": [], "weights": [], "X": [[1, 0.5], [2, 0.1]], "y": [1, 2]},
            },
            r"snapshot 0: targets of shape \(2,\), expected \(1,\)",
        ),
    ],
)
def test_bad_files_say_what_is_wrong(tmp_path, data, message):
    with pytest.raises(InputError, match=message):
        read_pgt_json(_write(tmp_path, data))


def _snap(n: int, width: int = 3) -> Snapshot:
    return Snapshot(np.array([[0], [n - 1]]), None, np.zeros((n, width), np.float32), np.zeros(n, np.float32), n)


def test_sequence_checks():
    with pytest.raises(InputError, match="no snapshots"):
        SnapshotSequence([], "empty")
    with pytest.raises(InputError, match="3 features per node, snapshot 0 has 2"):
        SnapshotSequence([_snap(4, 2), _snap(4, 3)])
    with pytest.raises(InputError, match="never shrinks"):
        SnapshotSequence([_snap(5), _snap(4)], growing=True)
    seq = SnapshotSequence([_snap(4), _snap(6)], growing=True)
    assert seq.num_nodes == 6 and list(seq.costs()) == [5, 7]
    train, test = SnapshotSequence([_snap(4)] * 10).split(0.8)
    assert (len(train), len(test)) == (8, 2)


def test_normalized_adjacency_matches_dense():
    rng = np.random.default_rng(1)
    n = 7
    edges = rng.integers(0, n, (2, 20))
    weight = rng.random(20).astype(np.float32) + 0.5
    a = np.zeros((n, n))
    for (s, d), w in zip(edges.T, weight, strict=True):
        if s != d:
            a[d, s] += w
    out_deg = a.sum(0)
    inv = np.where(out_deg > 0, out_deg, 1) ** -0.5 * (out_deg > 0)
    dense = np.zeros((n, n))
    rows, cols, vals = normalized_adjacency(edges, weight, n, self_loops=False)
    np.add.at(dense, (rows, cols), vals)
    np.testing.assert_allclose(dense, -(inv[:, None] * a * inv[None, :]), rtol=1e-5, atol=1e-6)
    a_loop = a + np.eye(n)
    inv = a_loop.sum(1) ** -0.5
    dense = np.zeros((n, n))
    rows, cols, vals = normalized_adjacency(edges, weight, n, self_loops=True)
    np.add.at(dense, (rows, cols), vals)
    np.testing.assert_allclose(dense, inv[:, None] * a_loop * inv[None, :], rtol=1e-5, atol=1e-6)
    dev = to_device(Snapshot(edges, weight, np.ones((n, 2), np.float32), None, n), torch.device("cpu"))
    np.testing.assert_allclose(dev.gcn.matrix.to_dense().numpy(), dense, rtol=1e-5, atol=1e-6)


def test_synthetic_is_skewed_growing_and_deterministic():
    a = synthetic_sequence(num_nodes=20_000, num_snapshots=40, seed=3)
    b = synthetic_sequence(num_nodes=20_000, num_snapshots=40, seed=3)
    c = synthetic_sequence(num_nodes=20_000, num_snapshots=40, seed=4)
    assert a.growing and len(a) == 40 and a.num_nodes == 20_000
    np.testing.assert_array_equal(a[7].edge_index, b[7].edge_index)
    np.testing.assert_array_equal(a[7].y, b[7].y)
    assert not np.array_equal(a[7].edge_index, c[7].edge_index)
    costs = a.costs()
    assert costs[-10:].sum() > 3 * costs[:10].sum()
