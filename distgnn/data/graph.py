"""The in-memory graph that loaders produce and the partitioner consumes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from distgnn.errors import InputError


@dataclass
class Graph:
    """A homogeneous directed graph as an edge list plus node and edge arrays.

    Attributes:
        name: graph name (used as the default partition name).
        num_nodes: node count N.
        src, dst: ``(E,)`` int64 endpoints; edge k goes ``src[k] -> dst[k]``.
        ndata: node arrays, first dim N (conventional names: ``feat`` float32
            ``(N, F)``, ``label`` int64 ``(N,)``, ``train_mask``/``val_mask``/
            ``test_mask`` bool ``(N,)``).
        edata: edge arrays, first dim E.
        num_classes: label count, where the graph has labels.
    """

    name: str
    num_nodes: int
    src: np.ndarray
    dst: np.ndarray
    ndata: dict[str, np.ndarray] = field(default_factory=dict)
    edata: dict[str, np.ndarray] = field(default_factory=dict)
    num_classes: int | None = None

    @property
    def num_edges(self) -> int:
        return int(self.src.shape[0])

    def validate(self) -> Graph:
        """Check shapes, dtypes and id ranges; raises InputError naming the first problem."""
        if self.num_nodes < 0:
            raise InputError(f"num_nodes must be >= 0, got {self.num_nodes}")
        for name, arr in (("src", self.src), ("dst", self.dst)):
            if arr.ndim != 1 or arr.dtype.kind not in "iu":
                raise InputError(f"{name} must be a 1-d integer array, got dtype {arr.dtype} shape {arr.shape}")
        if self.src.shape != self.dst.shape:
            raise InputError(f"src has {self.src.shape[0]} entries but dst has {self.dst.shape[0]}")
        for name, arr in (("src", self.src), ("dst", self.dst)):
            if arr.size and (arr.min() < 0 or arr.max() >= self.num_nodes):
                raise InputError(
                    f"{name} ids must be in [0, {self.num_nodes}), found {int(arr.min())}..{int(arr.max())}"
                )
        for name, arr in self.ndata.items():
            if arr.shape[:1] != (self.num_nodes,):
                raise InputError(
                    f"node array {name!r} has {arr.shape[0] if arr.ndim else 0} rows, expected {self.num_nodes}"
                )
        for name, arr in self.edata.items():
            if arr.shape[:1] != (self.num_edges,):
                raise InputError(
                    f"edge array {name!r} has {arr.shape[0] if arr.ndim else 0} rows, expected {self.num_edges}"
                )
        return self
