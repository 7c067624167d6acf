"""Neighbour sampling of the local partition on a torch device, and the merge and relabel steps in torch.

:class:`DeviceCSC` is the local partition's CSC placed once for a CUDA device: in GPU memory, or copied into
page-locked host memory and read zero-copy by :func:`distgnn.sampling.gpu.sample_neighbors`. :func:`merge` and :func:`to_block` are the
torch twins of :func:`distgnn.sampling.neighbor._merge` and :func:`distgnn.sampling.kernels.to_block`: same
results, on whatever device their inputs live, with host synchronisation only for output sizes (and, unless
skipped, one for validation).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np
import torch

from distgnn.errors import ConfigError
from distgnn.sampling import gpu
from distgnn.sampling.block import Block

if TYPE_CHECKING:
    from distgnn.sampling.csc import LocalCSC

GRAPH_MEMORY = ("gpu", "pinned")


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor over ``array``'s memory (no copy when it is contiguous)."""
    with warnings.catch_warnings():  # shared-memory arrays are read-only; nothing here writes them
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.ascontiguousarray(array))


class DeviceCSC:
    """A :class:`~distgnn.sampling.csc.LocalCSC` placed for sampling on one CUDA device.

    ``graph_memory="gpu"`` copies ``indptr`` and ``indices`` to the device; ``"pinned"`` copies them into
    page-locked host memory for zero-copy reads. They are not registered in place: registration covers whole
    pages, and on the heap those hold other arrays too, whose ordinary host-to-device copies CUDA then
    refused ("invalid argument", seen on an H100); and registering a DistGraph's partition mapping in place
    crashed the process inside ``cudaHostRegister`` (segmentation fault on an H100, in
    ``tests/sampling/test_device.py``'s cluster test), which is not understood yet. ``local2global`` (one
    entry per node) always goes to the device. ``eids`` is not held at all when it is the contiguous range
    the partition format guarantees (edge id = ``edge_start`` + CSC position), else it goes to the device.

    :meth:`close` (or garbage collection) releases the device and pinned memory.
    """

    def __init__(self, local: LocalCSC, device: torch.device, graph_memory: str = "gpu"):
        if graph_memory not in GRAPH_MEMORY:
            raise ConfigError(f"graph_memory must be one of {GRAPH_MEMORY}, got {graph_memory!r}")
        self.local = local
        self.device = device
        self.graph_memory = graph_memory
        self.part_id = local.part_id
        self.node_start = local.node_start
        self.edge_start = contiguous_start(local.eids)
        if graph_memory == "gpu" or device.type != "cuda":
            self.indptr = as_tensor(local.indptr).to(device)
            self.indices = as_tensor(local.indices).to(device)
        else:
            self.indptr = _pinned_copy(local.indptr, device)
            self.indices = _pinned_copy(local.indices, device)
        self.local2global = as_tensor(local.local2global).to(device)
        self.num_etypes = local.num_etypes
        self.eids = None if self.edge_start is not None else as_tensor(local.eids).to(device)

    def close(self) -> None:
        """Drops the placed arrays (device and pinned memory go with them). Safe to call twice."""
        self.indptr = self.indices = self.local2global = self.eids = None

    def sample(
        self,
        seeds: torch.Tensor,
        fanout: int | list[int],
        replace: bool,
        rng_seed: int,
        etypes: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Uniform picks for owned global ``seeds`` (int64, on the device).

        On a typed CSC, ``etypes`` names the edge type of each seed (one row of the typed CSC per
        (node, edge type) item) and ``fanout`` lists one fanout per edge type: every edge type of one
        fanout is sampled by one kernel launch (one launch in all when the fanouts agree).

        Returns:
            ``counts`` ``(len(seeds),)``, the neighbours' global ids and the picked edges' global ids, all
            int64 on the device, grouped by seed in seed order.
        """
        rows = seeds - self.node_start
        if etypes is None:
            return self._sample_rows(rows, int(fanout), replace, rng_seed)
        rows = rows * self.num_etypes + etypes
        values = sorted(set(fanout))
        if len(values) == 1:
            return self._sample_rows(rows, values[0], replace, rng_seed)
        table = torch.tensor(fanout, dtype=torch.int64, device=rows.device)[etypes]
        wheres, results = [], []
        for k, value in enumerate(values):
            where = torch.nonzero(table == value).flatten()
            wheres.append(where)
            results.append(self._sample_rows(rows[where], value, replace, rng_seed + k))
        return merge(len(rows), wheres, results, rows.device)

    def _sample_rows(
        self, rows: torch.Tensor, fanout: int, replace: bool, rng_seed: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        counts, positions, neighbors = gpu.sample_neighbors(
            self.indptr, self.indices, rows, fanout, replace, rng_seed, return_neighbors=True
        )
        src = self.local2global[neighbors]
        eids = positions + self.edge_start if self.eids is None else self.eids[positions]
        return counts, src, eids


def contiguous_start(eids: np.ndarray) -> int | None:
    """``eids[0]`` when ``eids`` is the range ``eids[0] + arange(len(eids))`` (0 when empty), else None."""
    if len(eids) == 0:
        return 0
    start = int(eids[0])
    return start if np.array_equal(eids, np.arange(start, start + len(eids), dtype=np.int64)) else None


def _pinned_copy(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A page-locked copy of ``array`` that ``device`` reads zero-copy (an empty array goes to the device:
    the sampler refuses unpinned host tensors and there is nothing to pin)."""
    tensor = as_tensor(array)
    return tensor.to(device) if tensor.numel() == 0 else tensor.pin_memory()


def merge(
    num_seeds: int,
    wheres: list[torch.Tensor | None],
    results: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scatter per-owner results into global seed order (torch twin of ``neighbor._merge``).

    Args:
        num_seeds: seeds of the layer.
        wheres: per owner, the int64 positions of its seeds among the layer's (ascending), or None for
            all of them (one owner).
        results: per owner, ``(counts, src, eids)`` grouped by seed in ``where`` order, on ``device``.
        device: where the layer is sampled.

    Returns:
        ``(counts, src, eids)`` int64 in seed order.
    """
    if len(wheres) == 1 and wheres[0] is None:
        return results[0]
    counts = torch.zeros(num_seeds, dtype=torch.int64, device=device)
    for where, (group_counts, _, _) in zip(wheres, results, strict=True):
        counts[where] = group_counts
    offsets = torch.zeros(num_seeds + 1, dtype=torch.int64, device=device)
    torch.cumsum(counts, 0, out=offsets[1:])
    total = sum(len(group_src) for _, group_src, _ in results)
    src = torch.empty(total, dtype=torch.int64, device=device)
    eids = torch.empty(total, dtype=torch.int64, device=device)
    for where, (group_counts, group_src, group_eids) in zip(wheres, results, strict=True):
        # Edge k of the group, the j-th pick of seed where[i], lands at offsets[where[i]] + j.
        starts = torch.cumsum(group_counts, 0) - group_counts
        shift = torch.repeat_interleave(offsets[where] - starts, group_counts, output_size=len(group_src))
        target = shift + torch.arange(len(group_src), dtype=torch.int64, device=device)
        src[target] = group_src
        eids[target] = group_eids
    return counts, src, eids


# How a layer is relabelled: "torch" (unique + first-appearance ranking, ~25 launches) or "kernel"
# (gpu.relabel's hash table, ~9 launches; 2.8-4.1x faster per layer on an H200, benchmarks/relabel_gpu.py).
RELABEL_IMPLS = ("torch", "kernel")


def to_block(
    dst_nids: torch.Tensor,
    counts: torch.Tensor,
    src_nids_per_edge: torch.Tensor,
    eids: torch.Tensor,
    validate: bool = True,
    relabel: str | None = None,
) -> Block:
    """Relabel one layer's sampled edges into a :class:`Block` on their device (torch twin of
    :func:`distgnn.sampling.kernels.to_block`: sources are ``dst_nids`` then the other sources in order of
    first appearance).

    Args:
        dst_nids: ``(num_dst,)`` int64 unique global ids of the destination nodes.
        counts: ``(num_dst,)`` int64 sampled in-edges per destination node.
        src_nids_per_edge: ``(num_edges,)`` int64 global source id of each edge, grouped by destination.
        eids: ``(num_edges,)`` int64 global edge ids (becomes ``block.eids`` as is).
        validate: check the values too (one host sync); the sampler, whose layers are unique and
            consistent by construction, skips it.
        relabel: ``"torch"`` or ``"kernel"`` (:func:`distgnn.sampling.gpu.relabel`, ids must be >= 0; used
            only without ``validate``); default ``"kernel"`` on a CUDA device, ``"torch"`` elsewhere.

    Raises:
        ValueError: shapes or dtypes disagree, counts are negative or do not sum to the edge count, or
            ``dst_nids`` has repeats.
    """
    named = (("dst_nids", dst_nids), ("counts", counts), ("src_nids_per_edge", src_nids_per_edge), ("eids", eids))
    for name, tensor in named:
        if tensor.dim() != 1 or tensor.dtype != torch.int64:
            raise ValueError(f"{name} must be a 1-D int64 tensor, got {tensor.dtype} of shape {tuple(tensor.shape)}")
    num_dst, num_edges = len(dst_nids), len(src_nids_per_edge)
    if len(counts) != num_dst:
        raise ValueError(f"counts must have one entry per dst node ({num_dst}), got {len(counts)}")
    if len(eids) != num_edges:
        raise ValueError(f"eids ({len(eids)}) and src_nids_per_edge ({num_edges}) must have equal length")
    device = dst_nids.device
    relabel = relabel or ("kernel" if device.type == "cuda" else "torch")
    if relabel not in RELABEL_IMPLS:
        raise ValueError(f"relabel must be one of {RELABEL_IMPLS}, got {relabel!r}")
    indptr = torch.zeros(num_dst + 1, dtype=torch.int64, device=device)
    torch.cumsum(counts, 0, out=indptr[1:])
    if relabel == "kernel" and not validate:
        src_nids, indices = gpu.relabel(dst_nids, src_nids_per_edge)
        return Block(src_nids=src_nids, num_dst=num_dst, indptr=indptr, indices=indices, eids=eids)
    everything = torch.cat([dst_nids, src_nids_per_edge])
    unique, inverse = torch.unique(everything, return_inverse=True)
    # First position of each unique id, then the ids ranked by it: first-appearance order.
    first = torch.full((len(unique),), len(everything), dtype=torch.int64, device=device)
    first.scatter_reduce_(0, inverse, torch.arange(len(everything), device=device), "amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=device)
    relabelled = rank[inverse]
    if not validate:
        return Block(src_nids=unique[order], num_dst=num_dst, indptr=indptr, indices=relabelled[num_dst:], eids=eids)
    # One host sync for all checks: dst ids unique (each its own first appearance), counts sum to the edges.
    dst_unique, counts_ok = torch.stack(
        [
            (relabelled[:num_dst] == torch.arange(num_dst, device=device)).all(),
            (counts >= 0).all() & (indptr[-1] == num_edges),
        ]
    ).tolist()
    if not dst_unique:
        raise ValueError("dst_nids must be unique")
    if not counts_ok:
        raise ValueError(f"counts must be non-negative and sum to the number of edges ({num_edges})")
    return Block(src_nids=unique[order], num_dst=num_dst, indptr=indptr, indices=relabelled[num_dst:], eids=eids)
