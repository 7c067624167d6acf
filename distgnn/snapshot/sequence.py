"""A snapshot sequence: a list of graphs over one growing (or fixed) node set, each with node signals.

Snapshot ``t`` holds the nodes ``0 .. num_nodes_t - 1``: a node set that grows keeps its old ids and appends
new ones, so a hidden state ``(num_nodes_{t-1}, d)`` carries into snapshot ``t`` by padding it with zero rows.
:meth:`SnapshotSequence.window_costs` gives the scheduler what a window of snapshots costs to train on.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from distgnn.errors import InputError
from distgnn.nn.recurrent import SparseAdjacency, normalized_adjacency


@dataclass(frozen=True)
class Snapshot:
    """One graph of a sequence.

    Attributes:
        edge_index: ``(2, E)`` int64, source row first; ids below ``num_nodes``.
        edge_weight: ``(E,)`` float32, or None for weight 1.
        x: ``(num_nodes, F)`` float32 node features.
        y: ``(num_nodes,)`` float32 node targets, or None (link prediction has no node targets).
        num_nodes: nodes of this snapshot.
    """

    edge_index: np.ndarray
    edge_weight: np.ndarray | None
    x: np.ndarray
    y: np.ndarray | None
    num_nodes: int

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])

    @property
    def cost(self) -> int:
        """Vertices + edges: what training on this snapshot costs, to first order."""
        return self.num_nodes + self.num_edges


class SnapshotSequence(Sequence[Snapshot]):
    """Snapshots in time order over one node set, checked for consistency when built.

    Args:
        snapshots: the graphs, oldest first.
        name: where they came from (used in messages).
        growing: False when every snapshot has the same node count; True when counts never decrease.

    Raises:
        InputError: no snapshots, node counts that differ (fixed) or shrink (growing), feature widths that
            differ, or arrays whose shapes disagree with ``num_nodes``.
    """

    def __init__(self, snapshots: Sequence[Snapshot], name: str = "sequence", growing: bool = False) -> None:
        self._snapshots = list(snapshots)
        self.name = name
        self.growing = growing
        self._costs: np.ndarray | None = None
        if not self._snapshots:
            raise InputError(f"{name}: no snapshots (after cutting); give a longer sequence or fewer lags")
        first = self._snapshots[0]
        self.num_features = int(first.x.shape[1])
        for t, s in enumerate(self._snapshots):
            _check_snapshot(name, t, s, self.num_features)
            if not growing and s.num_nodes != first.num_nodes:
                raise InputError(
                    f"{name}: snapshot {t} has {s.num_nodes} nodes, snapshot 0 has {first.num_nodes}; a fixed node "
                    "set needs the same count in every snapshot"
                )
            if growing and t and s.num_nodes < self._snapshots[t - 1].num_nodes:
                raise InputError(
                    f"{name}: snapshot {t} has {s.num_nodes} nodes, fewer than snapshot {t - 1}'s "
                    f"{self._snapshots[t - 1].num_nodes}; a growing node set never shrinks"
                )

    def __len__(self) -> int:
        return len(self._snapshots)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return SnapshotSequence(self._snapshots[index], self.name, self.growing)
        return self._snapshots[index]

    def __iter__(self) -> Iterator[Snapshot]:
        return iter(self._snapshots)

    @property
    def num_nodes(self) -> int:
        """Nodes of the largest (last) snapshot."""
        return max(s.num_nodes for s in self._snapshots)

    @property
    def has_targets(self) -> bool:
        return self._snapshots[0].y is not None

    def costs(self) -> np.ndarray:
        """``(T,)`` int64: vertices + edges of each snapshot."""
        if self._costs is None:
            self._costs = np.array([s.cost for s in self._snapshots], dtype=np.int64)
        return self._costs

    def split(self, train_ratio: float = 0.8) -> tuple[SnapshotSequence, SnapshotSequence]:
        """Chronological split: the first ``int(train_ratio * T)`` snapshots, then the rest (as PyTorch
        Geometric Temporal's ``temporal_signal_split``)."""
        cut = int(train_ratio * len(self))
        if cut == 0 or cut == len(self):
            raise InputError(
                f"{self.name}: a {train_ratio:g} split of {len(self)} snapshots leaves one side empty; "
                "give more snapshots"
            )
        return self[:cut], self[cut:]

    def __repr__(self) -> str:
        kind = "growing" if self.growing else "fixed"
        return (
            f"SnapshotSequence({self.name!r}, {len(self)} snapshots, {self.num_nodes} nodes ({kind}), "
            f"{self.num_features} features)"
        )


def _check_snapshot(name: str, t: int, s: Snapshot, width: int) -> None:
    where = f"{name}: snapshot {t}"
    if s.edge_index.ndim != 2 or s.edge_index.shape[0] != 2:
        raise InputError(f"{where}: edge_index has shape {s.edge_index.shape}, expected (2, E)")
    if s.edge_index.size and (s.edge_index.min() < 0 or s.edge_index.max() >= s.num_nodes):
        raise InputError(
            f"{where}: edge endpoints span [{s.edge_index.min()}, {s.edge_index.max()}], expected ids in "
            f"[0, {s.num_nodes})"
        )
    if s.edge_weight is not None and s.edge_weight.shape != (s.edge_index.shape[1],):
        raise InputError(
            f"{where}: {s.edge_weight.shape[0]} edge weights for {s.edge_index.shape[1]} edges; give one per edge"
        )
    if s.x.ndim != 2 or s.x.shape[0] != s.num_nodes:
        raise InputError(f"{where}: features of shape {s.x.shape}, expected ({s.num_nodes}, F)")
    if s.x.shape[1] != width:
        raise InputError(f"{where}: {s.x.shape[1]} features per node, snapshot 0 has {width}; widths must agree")
    if s.y is not None and s.y.shape != (s.num_nodes,):
        raise InputError(f"{where}: targets of shape {s.y.shape}, expected ({s.num_nodes},)")


@dataclass
class DeviceSnapshot:
    """A snapshot's tensors on a device, with what the convolutions need precomputed once.

    Attributes:
        x: ``(N, F)`` float32.
        y: ``(N,)`` float32 or None.
        cheb: the scaled Laplacian ``-D^{-1/2} A D^{-1/2}`` (no self-loops, weighted): Chebyshev convolutions
            multiply by it.
        gcn: ``D~^{-1/2} (A + I) D~^{-1/2}`` (EvolveGCN's convolution).
        edge_index: ``(2, E)`` int64 (link prediction's positives).
        num_nodes: N.
    """

    x: torch.Tensor
    y: torch.Tensor | None
    cheb: SparseAdjacency
    gcn: SparseAdjacency
    edge_index: torch.Tensor
    num_nodes: int


def to_device(snapshot: Snapshot, device: torch.device) -> DeviceSnapshot:
    """Move ``snapshot`` to ``device`` and precompute both normalised adjacencies once."""
    n = snapshot.num_nodes
    edges, weight = snapshot.edge_index, snapshot.edge_weight
    cheb = SparseAdjacency.from_coo(*normalized_adjacency(edges, weight, n, self_loops=False), n, device)
    gcn = SparseAdjacency.from_coo(*normalized_adjacency(edges, weight, n, self_loops=True), n, device)
    y = None if snapshot.y is None else torch.from_numpy(np.ascontiguousarray(snapshot.y, np.float32)).to(device)
    return DeviceSnapshot(
        torch.from_numpy(np.ascontiguousarray(snapshot.x, np.float32)).to(device),
        y,
        cheb,
        gcn,
        torch.from_numpy(snapshot.edge_index).to(device),
        n,
    )
