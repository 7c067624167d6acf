"""``find_edges``: the global (source, destination) node ids of global edge ids.

Edges of this machine's partition are read from the shared-memory CSC; the edges of each other machine
come from one ``find_edges`` request to its server, which looks them up the same way. Any edge type.
"""

from __future__ import annotations

import numpy as np
import torch

from distgnn.errors import DistGNNError, InputError
from distgnn.sampling.source import LocalCSC


def _local_endpoints(local: LocalCSC, eids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Endpoints of edges of the local CSC (every id in ``eids`` must be one of ``local.eids``)."""
    if len(eids) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    first = int(local.eids[0]) if len(local.eids) else 0
    if np.array_equal(local.eids, np.arange(first, first + len(local.eids))):
        positions = eids - first  # a partition's CSC positions hold its edge range in order
    else:
        order = np.argsort(local.eids, kind="stable")
        positions = order[np.minimum(np.searchsorted(local.eids, eids, sorter=order), max(len(order) - 1, 0))]
    if positions.min() < 0 or positions.max() >= len(local.eids) or not np.array_equal(local.eids[positions], eids):
        raise DistGNNError("an edge id owned by this machine is missing from its CSC")
    # A typed CSC's row is (node * R + edge type): the node is the row // R.
    dst_local = (np.searchsorted(local.indptr, positions, side="right") - 1) // local.num_etypes
    src = local.local2global[local.indices[positions]]
    return src.astype(np.int64), (dst_local + local.node_start).astype(np.int64)


def find_edges(g, eids: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, dst)``: ``(E,)`` int64 global node ids of the edges ``eids`` (``(E,)`` int ids, any order).

    Raises InputError for an id outside ``[0, g.num_edges())``.
    """
    if isinstance(eids, torch.Tensor):
        eids = eids.detach().cpu().numpy()
    eids = np.asarray(eids)
    if eids.ndim != 1 or (eids.size and eids.dtype.kind not in "iu"):
        raise InputError(f"edge ids must be a 1-d integer array, got {eids.dtype}{list(eids.shape)}")
    eids = eids.astype(np.int64, copy=False)
    book = g.get_partition_book()
    owners = book.eid2partid(eids)  # range check
    local, remote = g.sampling_view()
    src = np.empty(len(eids), dtype=np.int64)
    dst = np.empty(len(eids), dtype=np.int64)
    mine = owners == local.part_id
    src[mine], dst[mine] = _local_endpoints(local, eids[mine])
    if mine.all():
        return torch.from_numpy(src), torch.from_numpy(dst)
    if remote is None:
        raise InputError(
            f"edge {int(eids[~mine][0])} is owned by another partition but this graph has no remote access"
        )
    far = np.flatnonzero(~mine)
    wanted = {owner: eids[far[owners[far] == owner]] for owner in np.unique(owners[far]).tolist()}
    for owner, (owner_src, owner_dst) in remote.find_edges(wanted).items():
        where = far[owners[far] == owner]
        src[where], dst[where] = owner_src, owner_dst
    return torch.from_numpy(src), torch.from_numpy(dst)
