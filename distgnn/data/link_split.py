"""Link-prediction splits: held-out node pairs, their evaluation negatives, and reverse-edge ids.

``split_links`` treats a graph as undirected (the usual link-prediction setup on citation
graphs), holds out a fraction of its node pairs for validation and test (both directions
leave the training graph) and draws, for every held-out pair, the same ``K`` negative
destinations for every run with the same seed. ``split_typed_links`` does the same for one
edge type of a heterogeneous graph (directed pairs; their twins of the reverse type leave the
training graph too). Held-out pairs are in the graph's original (homogeneous) node ids;
:func:`to_partition_ids` carries them into a partition's (reshuffled) ids and
:func:`distgnn.partition.prepare.partition_link_split` writes a split's partition with its held-out arrays beside it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distgnn.data.graph import Graph
from distgnn.data.hetero import CanonicalEtype, HeteroGraph, etype_str
from distgnn.errors import ConfigError, InputError

HELD_OUT = ("val_pairs", "val_negatives", "test_pairs", "test_negatives")
# Beside a partition's JSON: the held-out arrays and reverse edge ids, in the partition's new ids.
LINK_DIR = "link"


@dataclass
class LinkSplit:
    """A link-prediction split of a graph.

    Attributes:
        train: the training graph. Of :func:`split_links`: every kept pair in both directions, edges
            ``[0, H)`` one way and ``[H, 2H)`` the other (edge ``i``'s reverse is ``(i + H) % 2H``, the edge
            array ``reverse_eid``); the input's node data. Of :func:`split_typed_links`: a HeteroGraph
            without the held-out edges of the target type nor their reverse-type twins.
        val_pairs, test_pairs: ``(n, 2)`` int64 held-out ``(src, dst)`` node pairs (``src < dst`` for
            :func:`split_links`; homogeneous ids, types one after the other, for :func:`split_typed_links`).
        val_negatives, test_negatives: ``(n, K)`` int64 negative destinations of each held-out pair.
    """

    train: Graph | HeteroGraph
    val_pairs: np.ndarray
    val_negatives: np.ndarray
    test_pairs: np.ndarray
    test_negatives: np.ndarray

    def held_out(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in HELD_OUT}


def split_links(
    graph: Graph, val_fraction: float = 0.05, test_fraction: float = 0.1, num_negatives: int = 100, seed: int = 0
) -> LinkSplit:
    """Hold out ``val_fraction`` and ``test_fraction`` of ``graph``'s undirected pairs (self loops dropped).

    Deterministic in ``seed``. Raises InputError for fractions outside ``[0, 1)`` summing to 1 or more,
    or ``num_negatives < 1``.
    """
    _check_split_args(val_fraction, test_fraction, num_negatives)
    n = graph.num_nodes
    lo = np.minimum(graph.src, graph.dst).astype(np.int64)
    hi = np.maximum(graph.src, graph.dst).astype(np.int64)
    keys = np.unique(lo[lo != hi] * n + hi[lo != hi])
    rng = np.random.default_rng(seed)
    keys = keys[rng.permutation(len(keys))]
    num_val, num_test = int(len(keys) * val_fraction), int(len(keys) * test_fraction)
    pairs = np.stack([keys // n, keys % n], axis=1)
    val, test, kept = pairs[:num_val], pairs[num_val : num_val + num_test], pairs[num_val + num_test :]
    one_way = np.arange(len(kept), dtype=np.int64)
    train = Graph(
        graph.name,
        n,
        np.concatenate([kept[:, 0], kept[:, 1]]),
        np.concatenate([kept[:, 1], kept[:, 0]]),
        ndata=dict(graph.ndata),
        edata={"reverse_eid": np.concatenate([one_way + len(kept), one_way])},  # where exclude="reverse_id" looks
        num_classes=graph.num_classes,
    )
    return LinkSplit(
        train,
        val,
        rng.integers(0, n, size=(num_val, num_negatives), dtype=np.int64),
        test,
        rng.integers(0, n, size=(num_test, num_negatives), dtype=np.int64),
    )


def split_typed_links(
    graph: HeteroGraph,
    target: CanonicalEtype,
    reverse: CanonicalEtype | None = None,
    val_fraction: float = 0.05,
    test_fraction: float = 0.1,
    num_negatives: int = 100,
    seed: int = 0,
) -> LinkSplit:
    """Hold out ``val_fraction`` and ``test_fraction`` of the directed pairs of ``graph``'s edge type ``target``.

    Every edge of a held-out pair leaves the training graph, and so does every edge of type ``reverse`` (when
    given) that runs the other way between the same two nodes, or a model could read the answer off it. The
    negatives of a pair are nodes of ``target``'s destination type. Held-out arrays are in ``graph``'s
    homogeneous ids (:meth:`~distgnn.data.hetero.HeteroGraph.node_offsets`). Edge arrays of ``target`` and
    ``reverse`` are dropped (they would no longer line up with the thinned edges). Deterministic in ``seed``.

    Raises ConfigError for a graph with one edge type, an edge type it lacks, or a ``reverse`` that does not
    lead back from ``target``'s destination type to its source type; InputError as :func:`split_links`.
    """
    _check_split_args(val_fraction, test_fraction, num_negatives)
    if not isinstance(graph, HeteroGraph) or graph.is_homogeneous:
        raise ConfigError(f"a target edge type needs a heterogeneous dataset; {graph.name} has one edge type")
    for etype in (target, reverse):
        if etype is not None and etype not in graph.canonical_etypes:
            raise ConfigError(f"no edge type {etype_str(etype)} in {graph.name}; it has {graph.canonical_etypes}")
    if reverse is not None and (reverse[0], reverse[2]) != (target[2], target[0]):
        raise ConfigError(f"reverse edge type {etype_str(reverse)} does not lead back along {etype_str(target)}")
    src, dst = (np.asarray(a, dtype=np.int64) for a in graph.edges[target])
    n_dst = graph.num_nodes[target[2]]
    keys = np.unique(src * n_dst + dst)  # directed pairs, repeats once
    rng = np.random.default_rng(seed)
    keys = keys[rng.permutation(len(keys))]
    num_val, num_test = int(len(keys) * val_fraction), int(len(keys) * test_fraction)
    held = keys[: num_val + num_test]
    edges = dict(graph.edges)
    keep = ~np.isin(src * n_dst + dst, held)
    edges[target] = (src[keep], dst[keep])
    if reverse is not None:
        rsrc, rdst = (np.asarray(a, dtype=np.int64) for a in graph.edges[reverse])
        keep = ~np.isin(rdst * n_dst + rsrc, held)
        edges[reverse] = (rsrc[keep], rdst[keep])
    edata = {e: arrays for e, arrays in graph.edata.items() if e not in (target, reverse)}
    train = HeteroGraph(graph.name, graph.num_nodes, edges, graph.ndata, edata, graph.num_classes)
    offsets = graph.node_offsets()
    pairs = np.stack([held // n_dst + offsets[target[0]], held % n_dst + offsets[target[2]]], axis=1)
    negatives = rng.integers(0, n_dst, size=(len(held), num_negatives), dtype=np.int64) + offsets[target[2]]
    return LinkSplit(train, pairs[:num_val], negatives[:num_val], pairs[num_val:], negatives[num_val:])


def _check_split_args(val_fraction: float, test_fraction: float, num_negatives: int) -> None:
    if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
        raise InputError(
            f"held-out fractions must be in [0, 1) and sum below 1, got {val_fraction} and {test_fraction}"
        )
    if num_negatives < 1:
        raise InputError(f"num_negatives must be >= 1, got {num_negatives}")


def reverse_edge_ids(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """``(E,)`` int64 id of an edge ``dst[i] -> src[i]`` for each edge ``i`` (``i`` itself where there is none)."""
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    if src.shape != dst.shape or src.ndim != 1:
        raise InputError(f"src and dst must be 1-d of one length, got {src.shape} and {dst.shape}")
    if len(src) == 0:
        return np.zeros(0, np.int64)
    n = int(max(src.max(), dst.max())) + 1
    keys = src * n + dst
    order = np.argsort(keys, kind="stable")
    where = np.minimum(np.searchsorted(keys, dst * n + src, sorter=order), len(keys) - 1)
    found = keys[order[where]] == dst * n + src
    return np.where(found, order[where], np.arange(len(src))).astype(np.int64)


def to_partition_ids(orig_nid: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Original node ids ``ids`` (any shape) as a partition's new ids, given its ``orig_nid`` (new -> original)."""
    new_of_orig = np.empty(len(orig_nid), dtype=np.int64)
    new_of_orig[np.asarray(orig_nid)] = np.arange(len(orig_nid), dtype=np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= len(orig_nid)):
        raise InputError(f"node ids must be in [0, {len(orig_nid)}) to map into the partition")
    return new_of_orig[ids]


def save_held_out(split: LinkSplit, out_dir: str | os.PathLike) -> Path:
    """Write the held-out arrays as ``OUT/<name>.npy`` (plain .npy, no pickle)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, arr in split.held_out().items():
        np.save(out / f"{name}.npy", arr, allow_pickle=False)
    return out


def load_held_out(out_dir: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays :func:`save_held_out` wrote."""
    out = Path(out_dir)
    missing = [name for name in HELD_OUT if not (out / f"{name}.npy").exists()]
    if missing:
        raise InputError(f"{out} lacks held-out link arrays {missing}; write them with save_held_out")
    return {name: np.load(out / f"{name}.npy", allow_pickle=False) for name in HELD_OUT}


def load_link_partition(part_config: str | os.PathLike) -> dict[str, np.ndarray]:
    """The held-out arrays (new ids) :func:`distgnn.partition.prepare.partition_link_split` wrote beside
    ``part_config``."""
    link_dir = Path(part_config).parent / LINK_DIR
    if not link_dir.is_dir():
        raise InputError(
            f"no link split beside {part_config} ({link_dir} is missing); write it with distgnn.partition.prepare.partition_link_split"
        )
    return load_held_out(link_dir)
