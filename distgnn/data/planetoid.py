"""Planetoid citation graphs (Cora, Citeseer, Pubmed) from the raw ``ind.<name>.*`` files.

The raw files are Python-2 pickles, so they go through an unpickler that
resolves only the handful of numpy, scipy.sparse and collections names those
files use; anything else in a file is refused. The result matches PyG's
``Planetoid`` (public split): symmetrised edges without self loops or
duplicates, 20 train nodes per class, 500 validation and 1,000 test nodes, and
Citeseer's test-index gaps filled with isolated zero-feature nodes.
"""

from __future__ import annotations

import collections
import os
import pickle
from pathlib import Path

import numpy as np

from distgnn.data.download import planetoid_dir
from distgnn.data.graph import Graph
from distgnn.errors import InputError

PLANETOID_NAMES = ("cora", "citeseer", "pubmed")


def _allowed_globals() -> dict[tuple[str, str], object]:
    import scipy.sparse as sp

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    allowed: dict[tuple[str, str], object] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
        ("collections", "defaultdict"): collections.defaultdict,
        ("__builtin__", "list"): list,
        ("builtins", "list"): list,
    }
    for cls in (sp.csr_matrix, sp.csc_matrix, sp.coo_matrix, sp.lil_matrix):
        short = cls.__name__.split("_")[0]
        for module in ("scipy.sparse", f"scipy.sparse.{short}", f"scipy.sparse._{short}"):
            allowed[(module, cls.__name__)] = cls
    return allowed


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves only the globals Planetoid files need; refuses everything else."""

    def __init__(self, file, allowed: dict[tuple[str, str], object]):
        super().__init__(file, encoding="latin1")
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> object:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a Planetoid file") from None


def _unpickle(path: Path, allowed: dict[tuple[str, str], object]) -> object:
    try:
        with open(path, "rb") as f:
            return _RestrictedUnpickler(f, allowed).load()
    except FileNotFoundError:
        raise InputError(
            f"Planetoid file {path} does not exist; pass the directory holding ind.<name>.* files"
        ) from None
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise InputError(f"Planetoid file {path} is not readable: {exc}") from exc


def _dense(matrix: object, path: Path) -> np.ndarray:
    arr = matrix.toarray() if hasattr(matrix, "toarray") else np.asarray(matrix)
    if arr.ndim != 2:
        raise InputError(f"Planetoid file {path} should hold a 2-d matrix, got shape {arr.shape}")
    return arr


def load_planetoid(name: str, data_dir: str | os.PathLike | None = None) -> Graph:
    """Load ``ind.<name>.*`` from ``data_dir`` (None: the download cache, see :mod:`distgnn.data.download`) as a
    symmetric ``Graph``.

    Returns:
        Graph with ndata ``feat`` float32 ``(N, F)``, ``label`` int64 ``(N,)`` and
        the public ``train_mask``/``val_mask``/``test_mask`` (bool ``(N,)``).
    """
    name = name.lower()
    if name not in PLANETOID_NAMES:
        raise InputError(f"unknown Planetoid dataset {name!r}; expected one of {PLANETOID_NAMES}")
    root = planetoid_dir(name, data_dir)
    allowed = _allowed_globals()
    raw = {k: _unpickle(root / f"ind.{name}.{k}", allowed) for k in ("x", "y", "tx", "ty", "allx", "ally", "graph")}
    index_path = root / f"ind.{name}.test.index"
    try:
        test_index = np.loadtxt(index_path, dtype=np.int64, ndmin=1)
    except FileNotFoundError:
        raise InputError(f"Planetoid file {index_path} does not exist") from None
    except ValueError as exc:
        raise InputError(f"Planetoid file {index_path} should hold one integer per line: {exc}") from exc

    x, y = (_dense(raw[k], root / f"ind.{name}.{k}") for k in ("x", "y"))
    tx, ty = (_dense(raw[k], root / f"ind.{name}.{k}") for k in ("tx", "ty"))
    allx, ally = (_dense(raw[k], root / f"ind.{name}.{k}") for k in ("allx", "ally"))
    sorted_test = np.sort(test_index)
    if name == "citeseer":
        # Some test ids name isolated nodes missing from tx/ty: give them zero rows (as PyG does).
        span = int(sorted_test[-1] - sorted_test[0] + 1)
        tx_full = np.zeros((span, tx.shape[1]), dtype=tx.dtype)
        ty_full = np.zeros((span, ty.shape[1]), dtype=ty.dtype)
        tx_full[sorted_test - sorted_test[0]] = tx
        ty_full[sorted_test - sorted_test[0]] = ty
        tx, ty = tx_full, ty_full

    feat = np.concatenate([allx, tx]).astype(np.float32)
    onehot = np.concatenate([ally, ty])
    # Row k of tx/ty belongs to node test_index[k] (file order); this is PyG's reordering.
    feat[test_index] = feat[sorted_test]
    onehot[test_index] = onehot[sorted_test]
    label = onehot.argmax(axis=1).astype(np.int64)
    n = feat.shape[0]

    graph_dict = raw["graph"]
    if not isinstance(graph_dict, dict):
        raise InputError(f"Planetoid file {root / f'ind.{name}.graph'} should hold an adjacency dict")
    src = np.repeat(np.fromiter(graph_dict.keys(), dtype=np.int64), [len(v) for v in graph_dict.values()])
    dst = np.fromiter((v for vs in graph_dict.values() for v in vs), dtype=np.int64, count=src.shape[0])
    if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n):
        raise InputError(f"{name}: adjacency names node ids outside [0, {n})")
    keep = src != dst
    a, b = np.concatenate([src[keep], dst[keep]]), np.concatenate([dst[keep], src[keep]])
    keys = np.unique(b * n + a)  # sorted by (dst, src)
    dst, src = np.divmod(keys, n)

    masks = {k: np.zeros(n, dtype=bool) for k in ("train_mask", "val_mask", "test_mask")}
    masks["train_mask"][: y.shape[0]] = True
    masks["val_mask"][y.shape[0] : y.shape[0] + 500] = True
    masks["test_mask"][test_index] = True
    ndata = {"feat": feat, "label": label, **masks}
    return Graph(name, n, src, dst, ndata=ndata, num_classes=int(onehot.shape[1])).validate()
