"""``LocalCSC``: the partition a process samples directly (its shared-memory CSC, or an in-process graph)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LocalCSC:
    """The partition this process can read directly.

    Attributes:
        part_id: its partition id (= machine id).
        node_start: global id of local node 0 (owned nodes are a contiguous range).
        indptr, indices: CSC of the in-edges of the owned nodes (local ids); with ``num_etypes`` R > 1
            row ``v * R + t`` holds owned node ``v``'s in-edges of edge type ``t`` (see docs/partition-format.md).
        eids: global edge id of each CSC position.
        local2global: global id of each local node.
        edge_weights: optional edge arrays by name, one value per CSC position.
        num_etypes: R, the number of edge types.
    """

    part_id: int
    node_start: int
    indptr: np.ndarray
    indices: np.ndarray
    eids: np.ndarray
    local2global: np.ndarray
    edge_weights: dict[str, np.ndarray]
    num_etypes: int = 1

    def rows(self, seeds: np.ndarray, etypes: np.ndarray | None = None) -> np.ndarray:
        """CSC rows of owned global ``seeds`` (of one edge type each, ``etypes``, on a typed CSC)."""
        local = seeds - self.node_start
        if etypes is None:
            return local
        return local * self.num_etypes + etypes
