"""Range partition book: which partition owns a node or edge id.

After reshuffling, partition ``i`` owns the contiguous global node ids
``node_map[i] = [start, end)`` and edge ids ``edge_map[i]``. Every lookup is a
vectorised binary search over the range ends; ids may be numpy arrays or torch
tensors and the result has the same kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from distgnn.errors import InputError, PartitionFormatError


def _check_ranges(ranges: np.ndarray, what: str) -> None:
    if ranges.ndim != 2 or ranges.shape[1] != 2 or len(ranges) == 0:
        raise PartitionFormatError(f"{what} must be a non-empty list of [start, end) pairs, got shape {ranges.shape}")
    if ranges[0, 0] != 0 or np.any(ranges[1:, 0] != ranges[:-1, 1]) or np.any(ranges[:, 1] < ranges[:, 0]):
        raise PartitionFormatError(
            f"{what} ranges must start at 0 and be contiguous and non-decreasing, got {ranges.tolist()}"
        )


def _to_numpy(ids: Any) -> tuple[np.ndarray, bool]:
    """Return ``(int64 array, was_torch)`` without copying where possible."""
    if type(ids).__module__.startswith("torch"):
        return ids.detach().cpu().numpy().astype(np.int64, copy=False), True
    arr = np.asarray(ids)
    if arr.dtype.kind not in "iu" and arr.size:
        raise InputError(f"ids must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False), False


def _like(result: np.ndarray, was_torch: bool) -> Any:
    if was_torch:
        import torch

        return torch.from_numpy(np.ascontiguousarray(result))
    return result


class RangePartitionBook:
    """Maps global node/edge ids to partitions and partition-local offsets.

    Args:
        node_map: ``(num_parts, 2)`` int64 ``[start, end)`` node ranges.
        edge_map: ``(num_parts, 2)`` int64 ``[start, end)`` edge ranges.
    """

    def __init__(self, node_map: Sequence[Sequence[int]] | np.ndarray, edge_map: Sequence[Sequence[int]] | np.ndarray):
        self.node_map = np.asarray(node_map, dtype=np.int64).reshape(-1, 2)
        self.edge_map = np.asarray(edge_map, dtype=np.int64).reshape(-1, 2)
        _check_ranges(self.node_map, "node_map")
        _check_ranges(self.edge_map, "edge_map")
        if len(self.node_map) != len(self.edge_map):
            raise PartitionFormatError(
                f"node_map has {len(self.node_map)} partitions but edge_map has {len(self.edge_map)}"
            )

    @property
    def num_partitions(self) -> int:
        return len(self.node_map)

    @property
    def num_nodes(self) -> int:
        return int(self.node_map[-1, 1])

    @property
    def num_edges(self) -> int:
        return int(self.edge_map[-1, 1])

    def _owner(self, ids: Any, ranges: np.ndarray, what: str) -> Any:
        arr, was_torch = _to_numpy(ids)
        if arr.size and (arr.min() < 0 or arr.max() >= ranges[-1, 1]):
            bad = arr[(arr < 0) | (arr >= ranges[-1, 1])][0]
            raise InputError(f"{what} id {int(bad)} is out of range [0, {int(ranges[-1, 1])})")
        return _like(np.searchsorted(ranges[:, 1], arr, side="right"), was_torch)

    def nid2partid(self, nids: Any) -> Any:
        """Partition id of each global node id (int64, same shape)."""
        return self._owner(nids, self.node_map, "node")

    def eid2partid(self, eids: Any) -> Any:
        """Partition id of each global edge id (int64, same shape)."""
        return self._owner(eids, self.edge_map, "edge")

    def _check_part(self, partid: int) -> None:
        if not 0 <= partid < self.num_partitions:
            raise InputError(f"partition id {partid} is out of range [0, {self.num_partitions})")

    def node_range(self, partid: int) -> tuple[int, int]:
        self._check_part(partid)
        start, end = self.node_map[partid]
        return int(start), int(end)

    def edge_range(self, partid: int) -> tuple[int, int]:
        self._check_part(partid)
        start, end = self.edge_map[partid]
        return int(start), int(end)

    def partid2nids(self, partid: int) -> np.ndarray:
        """Global node ids owned by ``partid`` (int64)."""
        return np.arange(*self.node_range(partid), dtype=np.int64)

    def partid2eids(self, partid: int) -> np.ndarray:
        """Global edge ids owned by ``partid`` (int64)."""
        return np.arange(*self.edge_range(partid), dtype=np.int64)

    def _to_local(self, ids: Any, start_end: tuple[int, int], what: str, partid: int) -> Any:
        arr, was_torch = _to_numpy(ids)
        start, end = start_end
        if arr.size and (arr.min() < start or arr.max() >= end):
            bad = arr[(arr < start) | (arr >= end)][0]
            raise InputError(f"{what} id {int(bad)} is not owned by partition {partid} (owns [{start}, {end}))")
        return _like(arr - start, was_torch)

    def nid2localnid(self, nids: Any, partid: int) -> Any:
        """Offsets of owned global node ids within ``partid``'s range."""
        return self._to_local(nids, self.node_range(partid), "node", partid)

    def eid2localeid(self, eids: Any, partid: int) -> Any:
        """Offsets of owned global edge ids within ``partid``'s range."""
        return self._to_local(eids, self.edge_range(partid), "edge", partid)
