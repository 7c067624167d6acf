"""distgnn.data: synthetic generator, Planetoid loader, npz loader."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from distgnn.data import load_npz, load_planetoid, synthetic
from distgnn.data.planetoid import _allowed_globals, _RestrictedUnpickler
from distgnn.errors import InputError

PLANETOID_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "planetoid"


def _need_cora() -> Path:
    if not (PLANETOID_DIR / "ind.cora.graph").exists():
        pytest.skip(f"Cora raw files not found in {PLANETOID_DIR.resolve()}")
    return PLANETOID_DIR


def test_cora_counts_and_public_split():
    g = load_planetoid("cora", _need_cora())
    assert g.num_nodes == 2708
    assert g.num_edges == 10556
    assert g.ndata["feat"].shape == (2708, 1433) and g.ndata["feat"].dtype == np.float32
    assert g.num_classes == 7
    masks = [g.ndata[k] for k in ("train_mask", "val_mask", "test_mask")]
    assert [int(m.sum()) for m in masks] == [140, 500, 1000]
    assert not (masks[0] & masks[1]).any() and not (masks[1] & masks[2]).any() and not (masks[0] & masks[2]).any()
    assert np.array_equal(np.bincount(g.ndata["label"][masks[0]]), np.full(7, 20))
    # Symmetric, no self loops, no duplicates.
    keys = g.src * g.num_nodes + g.dst
    assert np.unique(keys).size == keys.size
    assert not (g.src == g.dst).any()
    assert np.array_equal(np.sort(keys), np.sort(g.dst * g.num_nodes + g.src))


def test_planetoid_unpickler_refuses_other_globals(tmp_path):
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(pickle.dumps(Path("/etc/passwd"), protocol=2))
    with open(evil, "rb") as f, pytest.raises(pickle.UnpicklingError, match="not allowed"):
        _RestrictedUnpickler(f, _allowed_globals()).load()


def test_planetoid_missing_dir_is_input_error(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_planetoid("cora", tmp_path)
    with pytest.raises(InputError, match="unknown Planetoid"):
        load_planetoid("nope", tmp_path)


def test_npz_roundtrip_keeps_duplicates_and_self_loops(tmp_path):
    rng = np.random.default_rng(3)
    n, e = 50, 300
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    src[:5], dst[:5] = 7, 7  # self loops and duplicates
    feat = rng.standard_normal((n, 4)).astype(np.float32)
    w = rng.random(e)
    path = tmp_path / "g.npz"
    np.savez(path, src=src, dst=dst, num_nodes=n, ndata_feat=feat, edata_w=w)
    g = load_npz(path)
    assert g.num_nodes == n and g.name == "g"
    assert np.array_equal(g.src, src) and np.array_equal(g.dst, dst)
    assert np.array_equal(g.ndata["feat"], feat) and np.array_equal(g.edata["w"], w)

    u = load_npz(path, undirected=True)
    assert np.array_equal(u.src, np.concatenate([src, dst])) and np.array_equal(u.dst, np.concatenate([dst, src]))
    assert np.array_equal(u.edata["w"], np.concatenate([w, w]))


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"dst": [0]}, "no src"),
        ({"src": [0, 5], "dst": [1, 2], "num_nodes": 3}, "ids must be in"),
        ({"src": [0], "dst": [1], "num_nodes": 3, "ndata_feat": np.zeros((2, 1))}, "has 2 rows, expected 3"),
        ({"src": [0], "dst": [1], "num_nodes": 3, "edata_w": np.zeros(4)}, "has 4 rows, expected 1"),
        ({"src": [0.5], "dst": [1]}, "integer"),
    ],
)
def test_npz_bad_inputs(tmp_path, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **{k: np.asarray(v) for k, v in arrays.items()})
    with pytest.raises(InputError, match=message):
        load_npz(path)


def test_npz_not_an_archive(tmp_path):
    path = tmp_path / "text.npz"
    path.write_text("hello")
    with pytest.raises(InputError, match="not an .npz"):
        load_npz(path)
    with pytest.raises(InputError, match="does not exist"):
        load_npz(tmp_path / "missing.npz")
    single = tmp_path / "single.npy"
    np.save(single, np.arange(3))
    with pytest.raises(InputError, match="single array"):
        load_npz(single)


def test_synthetic_deterministic_by_seed_and_well_formed():
    a = synthetic(2000, 8, feat_dim=16, num_classes=5, seed=7)
    b = synthetic(2000, 8, feat_dim=16, num_classes=5, seed=7)
    c = synthetic(2000, 8, feat_dim=16, num_classes=5, seed=8)
    assert np.array_equal(a.src, b.src) and np.array_equal(a.dst, b.dst)
    for k in a.ndata:
        assert np.array_equal(a.ndata[k], b.ndata[k])
    assert not np.array_equal(a.ndata["feat"], c.ndata["feat"])
    a.validate()
    assert a.ndata["feat"].dtype == np.float32 and a.src.dtype == np.int64
    assert 0.8 * 2000 * 8 < a.num_edges <= 2000 * 8
    keys = a.src * a.num_nodes + a.dst
    assert np.unique(keys).size == keys.size and not (a.src == a.dst).any()
    assert np.array_equal(np.sort(keys), np.sort(a.dst * a.num_nodes + a.src))
    masks = np.stack([a.ndata[k] for k in ("train_mask", "val_mask", "test_mask")])
    assert np.array_equal(masks.sum(0), np.ones(2000))


def test_synthetic_degrees_are_heavy_tailed():
    g = synthetic(20000, 10, feat_dim=4, num_classes=4, seed=0)
    deg = np.bincount(g.dst, minlength=g.num_nodes)
    assert deg.max() > 10 * np.median(deg)


def _linear_accuracy(x: torch.Tensor, y: torch.Tensor, train: torch.Tensor, test: torch.Tensor, classes: int) -> float:
    torch.manual_seed(0)
    model = torch.nn.Linear(x.shape[1], classes)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: worker threads only add contention on a busy box
    try:
        for _ in range(200):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[train]), y[train]).backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return (model(x[test]).argmax(1) == y[test]).float().mean().item()


def test_synthetic_neighbours_carry_the_label_signal():
    """Proxy for GNN > MLP: one hop of mean aggregation lifts a linear model clearly."""
    g = synthetic(3000, 10, feat_dim=32, num_classes=8, seed=1, train_frac=0.5, val_frac=0.0)
    x, y = torch.from_numpy(g.ndata["feat"]), torch.from_numpy(g.ndata["label"])
    src, dst = torch.from_numpy(g.src), torch.from_numpy(g.dst)
    agg = torch.zeros_like(x).index_add_(0, dst, x[src])
    agg /= torch.bincount(dst, minlength=g.num_nodes).clamp(min=1)[:, None]
    train, test = torch.from_numpy(g.ndata["train_mask"]), torch.from_numpy(g.ndata["test_mask"])
    raw = _linear_accuracy(x, y, train, test, 8)
    gnn = _linear_accuracy(torch.cat([x, agg], 1), y, train, test, 8)
    assert raw > 1.5 / 8  # the features alone carry some signal
    assert gnn > raw + 0.15


def test_citeseer_style_test_index_gaps(tmp_path):
    """Test ids with a gap (an isolated node missing from tx/ty) get a zero row, as in PyG."""
    import collections

    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    n_all, feat, classes = 10, 5, 3
    test_ids = np.array([13, 10, 11])  # node 12 is the gap; file order is not sorted
    allx = rng.random((n_all, feat)).astype(np.float32)
    tx = rng.random((3, feat)).astype(np.float32)  # row k belongs to test_ids[k] (file order)
    ally = np.eye(classes)[rng.integers(0, classes, n_all)]
    ty = np.eye(classes)[[1, 2, 1]]
    graph = collections.defaultdict(list, {0: [1, 13], 1: [0], 10: [11, 11], 11: [10], 13: [0, 13]})
    files = {"x": sp.csr_matrix(allx[:4]), "y": ally[:4], "tx": sp.csr_matrix(tx), "ty": ty}
    files.update({"allx": sp.csr_matrix(allx), "ally": ally, "graph": graph})
    for key, value in files.items():
        (tmp_path / f"ind.citeseer.{key}").write_bytes(pickle.dumps(value, protocol=4))
    (tmp_path / "ind.citeseer.test.index").write_text("\n".join(map(str, test_ids)))

    g = load_planetoid("citeseer", tmp_path)
    assert g.num_nodes == 14
    assert np.array_equal(g.ndata["feat"][test_ids], tx)
    assert not g.ndata["feat"][12].any() and g.ndata["label"][12] == 0
    assert np.array_equal(g.ndata["label"][test_ids], [1, 2, 1])
    assert np.array_equal(np.flatnonzero(g.ndata["test_mask"]), [10, 11, 13])
    assert np.array_equal(np.flatnonzero(g.ndata["train_mask"]), np.arange(4))
    assert np.array_equal(np.flatnonzero(g.ndata["val_mask"]), np.arange(4, 14))
    edges = set(zip(g.src.tolist(), g.dst.tolist(), strict=True))
    assert edges == {(0, 1), (1, 0), (0, 13), (13, 0), (10, 11), (11, 10)}
