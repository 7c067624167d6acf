"""``find_edges``: the global (source, destination) node ids of global edge ids.

Edges of this machine's partition are read from the shared-memory CSC. An edge of another
machine is found without a new server op: the partition format stores each partition's
edges in CSC order with consecutive ids (``eids == arange(edge_map[p])``), so with the
in-degrees of that machine's nodes (one ``degrees`` request) an edge id gives its
destination, and one full-neighbourhood ``sample`` request per machine for those
destinations gives the sources. Meant for a loader's seed edges, resolved once.

On a typed partition the CSC rows are (node, edge type) pairs and in-degrees mix the types, so a remote
edge of type ``t`` is found among the full type-``t`` in-neighbourhoods of all its machine's nodes of
``t``'s destination type (one typed ``sample`` request per machine, all types at once): exact, at the cost
of reading that machine's edges of the types asked for.
"""

from __future__ import annotations

import numpy as np
import torch

from distgnn.errors import DistGNNError, InputError
from distgnn.partition_book import RangePartitionBook
from distgnn.sampling.neighbor import LocalCSC, sample_layer, sampling_view


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


def _remote_destinations(g, eids: np.ndarray, owner: int) -> np.ndarray:
    """Destination of each edge of machine ``owner`` from that machine's in-degrees (CSC edge order)."""
    book = g.get_partition_book()
    node_start, node_end = book.node_range(owner)
    edge_start, _ = book.edge_range(owner)
    degrees = g.in_degrees(torch.arange(node_start, node_end)).numpy()
    offsets = np.zeros(len(degrees) + 1, dtype=np.int64)
    np.cumsum(degrees, out=offsets[1:])
    return np.searchsorted(offsets, eids - edge_start, side="right") - 1 + node_start


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
    local, remote = sampling_view(g)
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
    if book.is_homogeneous:
        for owner in np.unique(owners[far]).tolist():
            where = far[owners[far] == owner]
            dst[where] = _remote_destinations(g, eids[where], owner)
        # Every in-edge of those destinations, then each wanted edge picked out by its id.
        _, nbr_src, nbr_eids = sample_layer(book, local, remote, np.unique(dst[far]), -1, False, None, 0)
        nbr_dst = None
    else:
        items, item_etypes = _typed_candidates(book, owners[far], eids[far])
        counts, nbr_src, nbr_eids = sample_layer(
            book, local, remote, items, [-1] * len(book.canonical_etypes), False, None, 0, item_etypes
        )
        nbr_dst = np.repeat(items, counts)
    order = np.argsort(nbr_eids, kind="stable")
    hit = np.minimum(np.searchsorted(nbr_eids, eids[far], sorter=order), max(len(order) - 1, 0))
    if len(order) == 0 or not np.array_equal(nbr_eids[order[hit]], eids[far]):
        raise DistGNNError(
            "a remote edge was not among its destination's in-edges: the partition breaks the format's "
            "CSC edge order (eids == arange(edge_map[p]))"
        )
    src[far] = nbr_src[order[hit]]
    if nbr_dst is not None:
        dst[far] = nbr_dst[order[hit]]
    return torch.from_numpy(src), torch.from_numpy(dst)


def _typed_candidates(book: RangePartitionBook, owners: np.ndarray, eids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(node ids, edge type ids)``: every node of each wanted (machine, edge type)'s destination type on that
    machine, paired with that edge type (the typed items whose in-edges hold the wanted edges)."""
    etypes, _ = book.map_to_per_etype(eids)
    items, item_etypes = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for owner, etype in np.unique(np.stack([owners, etypes], axis=1), axis=0).tolist():
        dst_type = book.ntypes[book.etype_dst[etype]]
        nodes = book.map_to_homo_nid(book.partid2nids(owner, dst_type), dst_type)
        items.append(np.asarray(nodes, dtype=np.int64))
        item_etypes.append(np.full(len(nodes), etype, dtype=np.int64))
    return np.concatenate(items), np.concatenate(item_etypes)
