"""The CUDA sampling backend: the CUDA kernels, the partition placed on a device, and one distributed layer
over torch tensors.

Ops. :func:`sample_neighbors` picks uniformly with the semantics of :func:`distgnn.sampling.cpu.sample_neighbors`.
The CSC graph (``indptr``, ``indices``) lives either in GPU memory or in pinned host memory that the kernel
reads zero-copy over PCIe (UVA), so a partition larger than the GPU can still be sampled there; each tensor
may sit in either tier. The kernel (``csrc/cuda/sample.cu``) counts each seed's picks and scans the counts
in one pass (a tile of seeds per block, decoupled look-back); for fanouts up to 32 the same kernel then
fills its tile's positions (and optionally the neighbour ids), groups of lanes per seed keeping their picks
in registers; larger fanouts and ``-1`` take a fill kernel of their own. A call makes one host sync: 16
bytes (total picks, error bits) copied into pinned memory. When ``num_seeds * fanout`` is at most 2^24, the
outputs are allocated at that size and the fill is queued before the sync, so the GPU never waits for the
host; ``positions`` and the neighbour ids are then views of the first ``counts.sum()`` entries of those
allocations. :func:`relabel` turns a layer into block-local ids with a hash table (``csrc/cuda/relabel.cu``).
The kernels live in the graph extension (:func:`distgnn.native.cuda.graph_kernels`), built on first use into
``~/.cache/distgnn/extensions/graph-<torch>-<cuda>-<sm>``.

Differences from the CPU kernel: the same counts and the same per-seed groups in seed order, but a
different random stream (splitmix64 keyed by ``(rng_seed, seed index, draw number)``, unchanged since the
first GPU version, so the same ``rng_seed`` gives the same picks as before), and within a group the picks come
in draw order (ascending only when every edge is taken). On a machine where torch has no CUDA,
:func:`sample_neighbors` runs the C++ CPU kernel instead (same results as the CPU backend for the same
``rng_seed``) and returns CPU tensors.

Layers. :class:`DeviceSampling` is the backend :class:`~distgnn.sampling.neighbor.NeighborSampler` picks for
a device: :class:`DeviceCSC` places the local partition's CSC on a CUDA device once; per layer the remote
replies are copied over, and the blocks are merged (:func:`merge`) and relabelled (:func:`to_block`) there,
with host synchronisation only for output sizes. Where the local CSC samples every layer alone (the replicated
structure, or a graph of one partition) with bounded fanouts, the whole batch is one call,
:meth:`DeviceCSC.sample_blocks`: per layer the picks, their relabel over the bound ``seeds * fanout`` and the
block's arrays, each layer's seeds the previous block's sources with their count kept on the device (every launch
covers the layer's bound), and one host sync for the batch where sampling and relabelling layer by layer take two
a layer. A single such layer takes the same call. On a CPU device the same torch steps run over the C++ kernel's
picks (the same blocks as the CPU backend).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import warnings
from collections.abc import Sequence

import numpy as np
import torch

from distgnn.errors import ConfigError, InputError
from distgnn.native.cuda import graph_kernels
from distgnn.partition.book import RangePartitionBook
from distgnn.sampling import cpu
from distgnn.sampling.block import Block
from distgnn.sampling.items import layer_fanouts, layer_items, sample_layers
from distgnn.sampling.source import LocalCSC, RemoteSampling, SampleRequest, as_node_ids


class DeviceSampling:
    """The device backend of :class:`~distgnn.sampling.neighbor.NeighborSampler`: frontiers and blocks on
    ``device``; on CUDA the local partition sampled by the GPU kernel from ``graph_memory`` ("gpu" or
    "pinned"), placed on first use and kept until :meth:`close`."""

    def __init__(self, device: torch.device, graph_memory: str = "gpu"):
        if graph_memory not in GRAPH_MEMORY:
            raise ConfigError(f"graph_memory must be one of {GRAPH_MEMORY}, got {graph_memory!r}")
        self.device = device
        self.graph_memory = graph_memory
        self._placed: dict[tuple, DeviceCSC] = {}
        self._placing = threading.Lock()
        self._range_ends: tuple[bytes, torch.Tensor] | None = None  # the book's node ranges on the device

    def frontier(self, book: RangePartitionBook, seeds: torch.Tensor | np.ndarray) -> torch.Tensor:
        """The output nodes on the device, checked once here (in range, unique) so that the layers, unique by
        construction, relabel without a host sync."""
        host_seeds = as_node_ids(seeds)
        book.nid2partid(host_seeds)  # range check, with the CPU path's error
        ordered = np.sort(host_seeds)  # sorting and comparing neighbours: cheaper than np.unique's hash here
        if (ordered[1:] == ordered[:-1]).any():
            raise InputError("seeds must be unique node ids, got repeats")
        frontier = torch.from_numpy(host_seeds)
        if self.device.type != "cuda":
            return frontier.to(self.device)
        # From pinned memory the copy is queued: the host does not wait for the stream (a pageable one syncs it).
        return frontier.pin_memory().to(self.device, non_blocking=True)

    def layers(
        self,
        book: RangePartitionBook,
        local: LocalCSC,
        remote: RemoteSampling | None,
        frontier: torch.Tensor,
        layers: Sequence[tuple[int | dict, Sequence[int]]],
        replace: bool,
        prob: str | None,
    ) -> tuple[list[Block], torch.Tensor]:
        """The Blocks of ``layers`` (``(fanout, part_seeds)`` each, output layer first) over ``frontier``, and the
        last one's source nodes, on the device: every layer in one call with one host sync
        (:meth:`DeviceCSC.sample_blocks`) where the local CSC samples them all alone with bounded fanouts, else
        layer by layer (:meth:`layer`)."""
        if self.device.type == "cuda" and book.is_homogeneous and len(layers) > 1:
            placed = self._placed_csc(local)
            fanouts = [layer_fanouts(book, fanout) for fanout, _ in layers]
            alone = _local_alone(local, self._device_range_ends(book))
            if alone and placed.node_start == 0 and bounded_batch(len(frontier), fanouts):
                rng_seeds = [part_seeds[local.part_id] for _, part_seeds in layers]
                blocks = placed.sample_blocks(frontier, fanouts, replace, rng_seeds)
                return blocks, blocks[-1].src_nids
        return sample_layers(
            lambda front, fanout, part_seeds: self.layer(book, local, remote, front, fanout, replace, prob, part_seeds),
            frontier,
            layers,
        )

    def layer(
        self,
        book: RangePartitionBook,
        local: LocalCSC,
        remote: RemoteSampling | None,
        frontier: torch.Tensor,
        fanout: int | dict,
        replace: bool,
        prob: str | None,
        part_seeds: Sequence[int],
    ) -> tuple[Block, torch.Tensor]:
        """One layer's Block over ``frontier`` and the next frontier (its source nodes), on the device."""
        placed = self._placed_csc(local) if self.device.type == "cuda" else None
        range_ends = self._device_range_ends(book)
        items = layer_items(book, fanout, frontier)  # typed items are listed on the host (one frontier copy)
        if items.pos is None and placed is not None and _samples_all_here(local, range_ends, items.fanout, frontier):
            (block,) = placed.sample_blocks(frontier, [items.fanout], replace, [part_seeds[local.part_id]])
            return block, block.src_nids
        if items.pos is None:
            counts, src, eids = sample_layer_on_device(
                range_ends, local, placed, remote, frontier, items.fanout, replace, prob, part_seeds
            )
            block = to_block(frontier, counts, src, eids, validate=False)
            return block, block.src_nids
        pos = torch.from_numpy(items.pos).to(self.device)
        etype = torch.from_numpy(items.etype).to(self.device)
        counts, src, eids = sample_layer_on_device(
            range_ends, local, placed, remote, frontier[pos], items.fanout, replace, prob, part_seeds, etype
        )
        seed_counts = torch.zeros(len(frontier), dtype=torch.int64, device=self.device)
        seed_counts.index_add_(0, pos, counts)
        block = to_block(frontier, seed_counts, src, eids, validate=False)
        src_ntypes, _ = book.map_to_per_ntype(block.src_nids.cpu())
        block = dataclasses.replace(
            block, etypes=torch.repeat_interleave(etype, counts), src_ntypes=src_ntypes.to(self.device)
        )
        return block, block.src_nids

    def close(self) -> None:
        """Release the partitions placed on the device (again on the next sample); safe to call twice."""
        with self._placing:
            placed, self._placed = list(self._placed.values()), {}
        for csc in placed:
            csc.close()

    def _device_range_ends(self, book: RangePartitionBook) -> torch.Tensor:
        """The end of each partition's node range on the device, copied there once per partition book."""
        key = book.node_map.tobytes()
        cached = self._range_ends
        if cached is None or cached[0] != key:
            cached = self._range_ends = (key, torch.from_numpy(book.node_map[:, 1].copy()).to(self.device))
        return cached[1]

    def _placed_csc(self, local: LocalCSC) -> DeviceCSC:
        # A DistGraph hands out a new LocalCSC per call over the same shared-memory arrays; the placed copy
        # holds those arrays, so their ids stay unique while it is cached.
        key = (local.replicated, *(id(a) for a in (local.indptr, local.indices, local.eids, local.local2global)))
        with self._placing:
            placed = self._placed.get(key)
            if placed is None:
                placed = DeviceCSC(local, self.device, self.graph_memory)
                self._placed[key] = placed
            return placed


def sample_layer_on_device(
    range_ends: torch.Tensor,
    local: LocalCSC,
    placed: DeviceCSC | None,
    remote: RemoteSampling | None,
    seeds: torch.Tensor,
    fanout: int | list[int],
    replace: bool,
    prob: str | None,
    part_seeds: Sequence[int],
    etypes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`distgnn.sampling.cpu.sample_layer` on ``seeds``' device, with the same random streams.

    Args:
        range_ends: ``(num_parts,)`` int64 end of each partition's node range, on the device.
        placed: the local CSC on a CUDA device, or None to sample it with the CPU kernel.
        seeds: ``(B,)`` int64 valid global ids on the device.
    """
    device = seeds.device
    if local.replicated:  # the whole structure is here: every seed is sampled locally
        by_owner = {local.part_id: None} if len(seeds) else {}
    else:
        by_owner = _positions_by_owner(range_ends, seeds)
    remote_wheres, handles = [], []
    for part, where in by_owner.items():
        if part == local.part_id:
            continue
        if remote is None:
            raise InputError(f"seed owned by partition {part} but this graph has no remote access")
        host_seeds = (seeds if where is None else seeds[where]).cpu().numpy()
        part_etypes = None if etypes is None else (etypes if where is None else etypes[where]).cpu().numpy()
        handles.append(
            remote.send_sample(part, SampleRequest(host_seeds, fanout, replace, prob, part_seeds[part], part_etypes))
        )
        remote_wheres.append(where)
    wheres, results = [], []
    if local.part_id in by_owner:
        where = by_owner[local.part_id]
        local_seeds = seeds if where is None else seeds[where]
        local_etypes = None if etypes is None else (etypes if where is None else etypes[where])
        local_seed = part_seeds[local.part_id]
        if placed is not None:
            results.append(placed.sample(local_seeds, fanout, replace, local_seed, local_etypes))
        else:
            host_etypes = None if local_etypes is None else local_etypes.cpu().numpy()
            request = SampleRequest(local_seeds.cpu().numpy(), fanout, replace, prob, local_seed, host_etypes)
            picked = cpu.sample_local(local, request)
            results.append(tuple(torch.from_numpy(a).to(device) for a in picked))
        wheres.append(where)
    if handles:
        wheres.extend(remote_wheres)
        for reply in remote.wait_sample(handles):
            results.append(tuple(as_tensor(a).to(device) for a in reply))
    return merge(len(seeds), wheres, results, device)


def _samples_all_here(local: LocalCSC, range_ends: torch.Tensor, fanout: int, frontier: torch.Tensor) -> bool:
    """Whether one layer over ``frontier`` is the local CSC's alone (replicated, or the only partition) with a
    bounded size: then :meth:`DeviceCSC.sample_blocks` makes its block in one call with one host sync."""
    return _local_alone(local, range_ends) and fanout >= 0 and len(frontier) * fanout <= MAX_BOUND_PICKS


def _local_alone(local: LocalCSC, range_ends: torch.Tensor) -> bool:
    """Whether the local CSC samples every seed (replicated, or the only partition)."""
    return local.replicated or (len(range_ends) == 1 and local.part_id == 0)


def bounded_batch(num_seeds: int, fanouts: Sequence[int]) -> bool:
    """Whether layers with ``fanouts`` (output layer first) over ``num_seeds`` seeds fit
    :meth:`DeviceCSC.sample_blocks`: at most :data:`MAX_BATCH_LAYERS` layers, each bounded (its seeds are at most
    the previous layer's times ``1 + fanout``, their picks at most :data:`MAX_BOUND_PICKS`)."""
    if len(fanouts) > MAX_BATCH_LAYERS:
        return False
    bound = num_seeds
    for fanout in fanouts:
        if not isinstance(fanout, int) or fanout < 0 or bound * fanout > MAX_BOUND_PICKS:
            return False
        bound += bound * fanout
    return True


def _positions_by_owner(range_ends: torch.Tensor, seeds: torch.Tensor) -> dict[int, torch.Tensor | None]:
    """Positions of each owner's seeds (ascending, on the device), None where one owner has them all."""
    if len(seeds) == 0:
        return {}
    if len(range_ends) == 1:
        return {0: None}
    owners = torch.searchsorted(range_ends, seeds, right=True)
    # Not torch.bincount: on CUDA it syncs twice more for the ids' min and max.
    sizes = torch.zeros(len(range_ends), dtype=torch.int64, device=seeds.device)
    sizes = sizes.index_add_(0, owners, torch.ones_like(owners)).tolist()  # the layer's one sync to split it
    if max(sizes) == len(seeds):
        return {sizes.index(len(seeds)): None}
    order = torch.argsort(owners, stable=True)  # within an owner, positions stay ascending
    return {part: where for part, where in enumerate(torch.split(order, sizes)) if len(where)}


GRAPH_MEMORY = ("gpu", "pinned")
# The binding sizes a layer's outputs ahead (no sync between its launches) up to this many picks, and takes at
# most this many layers in one call (graph_binding.cpp: kMaxBoundPicks, kMaxLayers).
MAX_BOUND_PICKS = 1 << 24
MAX_BATCH_LAYERS = 10


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor over ``array``'s memory (no copy when it is contiguous)."""
    with warnings.catch_warnings():  # shared-memory arrays are read-only; nothing here writes them
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.ascontiguousarray(array))


class DeviceCSC:
    """A :class:`~distgnn.sampling.source.LocalCSC` placed for sampling on one CUDA device.

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
        self.edge_start = local.eid_offset if local.eid_offset is not None else contiguous_start(local.eids)
        if local.replicated and device.type == "cuda":
            check_device_fits(local, device, graph_memory)
        if graph_memory == "gpu" or device.type != "cuda":
            self.indptr = as_tensor(local.indptr).to(device)
            self.indices = as_tensor(local.indices).to(device)
        else:
            self.indptr = _pinned_copy(local.indptr, device)
            self.indices = _pinned_copy(local.indices, device)
        # A replicated CSC's indices are global ids already (its local2global is the identity).
        self.local2global = None if local.replicated else as_tensor(local.local2global).to(device)
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

    def sample_blocks(
        self, seeds: torch.Tensor, fanouts: Sequence[int], replace: bool, rng_seeds: Sequence[int]
    ) -> list[Block]:
        """Untyped layers' :class:`Block` s over owned global ``seeds`` (unique int64 on the device), output layer
        first, by one binding call with one host sync: layer ``l`` the picks of :meth:`sample` with
        ``fanouts[l]`` and ``rng_seeds[l]`` over the previous block's sources (the first: ``seeds``), relabelled
        as :func:`to_block` does. Each layer's launches cover its bound and read the counts on the device, so no
        layer waits for the host (:func:`bounded_batch` says which fanouts fit). The same blocks as
        :meth:`sample` then :func:`to_block`, layer by layer.

        Raises:
            ValueError: a seed is out of range, the CSC is corrupt or in pageable host memory, or there is more
                than one layer and the CSC's rows are not the global ids (``node_start`` != 0).
        """
        if len(fanouts) > 1 and self.node_start != 0:
            raise ValueError(
                f"layers after the first need a CSC whose rows are global ids; it starts at {self.node_start}"
            )
        rows = seeds if self.node_start == 0 else seeds - self.node_start
        arrays, bits = graph_kernels().sample_blocks(
            self.indptr,
            self.indices,
            rows,
            seeds,
            [int(fanout) for fanout in fanouts],
            bool(replace),
            [int(rng_seed) % 2**64 for rng_seed in rng_seeds],
            self.local2global,
            -1 if self.edge_start is None else int(self.edge_start),
            self.eids,
            seeds.device.index,
        )
        if bits:
            _raise_for(bits, len(self.indptr) - 1, len(self.indices))
        blocks, num_dst = [], len(seeds)
        for layer in range(len(fanouts)):
            indptr, src_nids, indices, eids = arrays[4 * layer : 4 * layer + 4]
            blocks.append(Block(src_nids=src_nids, num_dst=num_dst, indptr=indptr, indices=indices, eids=eids))
            num_dst = len(src_nids)
        return blocks

    def _sample_rows(
        self, rows: torch.Tensor, fanout: int, replace: bool, rng_seed: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        counts, positions, neighbors = sample_neighbors(
            self.indptr, self.indices, rows, fanout, replace, rng_seed, return_neighbors=True
        )
        src = neighbors if self.local2global is None else self.local2global[neighbors]
        eids = positions + self.edge_start if self.eids is None else self.eids[positions]
        return counts, src, eids


# GPU memory left free beside a replicated structure placed there (the batches' working set).
_DEVICE_HEADROOM = 2 << 30


def check_device_fits(local: LocalCSC, device: torch.device, graph_memory: str) -> None:
    """Refuse to place a replicated CSC in GPU memory that cannot hold it beside the batches' working set.

    Raises:
        ConfigError: with the structure's size and the device's free memory.
    """
    if graph_memory != "gpu":
        return
    needed = local.indptr.nbytes + local.indices.nbytes
    if local.eid_offset is None and contiguous_start(local.eids) is None:
        needed += local.eids.nbytes
    free, _ = torch.cuda.mem_get_info(device)
    if needed + _DEVICE_HEADROOM > free:
        raise ConfigError(
            f"the replicated graph structure needs {needed / 2**30:.2f} GiB on {device} (plus "
            f"{_DEVICE_HEADROOM / 2**30:.0f} GiB for the batches), {free / 2**30:.2f} GiB free; read it from pinned "
            "host memory (--graph-memory pinned) or sample the partitioned structure (--structure partitioned)"
        )


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
    """Scatter per-owner results into global seed order (torch twin of :func:`distgnn.sampling.cpu.merge`).

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
# (relabel's hash table, ~9 launches; faster per layer, benchmarks/relabel_gpu.py).
RELABEL_IMPLS = ("torch", "kernel")


def to_block(
    dst_nids: torch.Tensor,
    counts: torch.Tensor,
    src_nids_per_edge: torch.Tensor,
    eids: torch.Tensor,
    validate: bool = True,
    impl: str | None = None,
) -> Block:
    """Relabel one layer's sampled edges into a :class:`Block` on their device (torch twin of
    :func:`distgnn.sampling.cpu.to_block`: sources are ``dst_nids`` then the other sources in order of
    first appearance).

    Args:
        dst_nids: ``(num_dst,)`` int64 unique global ids of the destination nodes.
        counts: ``(num_dst,)`` int64 sampled in-edges per destination node.
        src_nids_per_edge: ``(num_edges,)`` int64 global source id of each edge, grouped by destination.
        eids: ``(num_edges,)`` int64 global edge ids (becomes ``block.eids`` as is).
        validate: check the values too (one host sync); the sampler, whose layers are unique and
            consistent by construction, skips it.
        impl: how to relabel, ``"torch"`` or ``"kernel"`` (:func:`relabel`, ids must be >= 0; used
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
    impl = impl or ("kernel" if device.type == "cuda" else "torch")
    if impl not in RELABEL_IMPLS:
        raise ValueError(f"impl must be one of {RELABEL_IMPLS}, got {impl!r}")
    indptr = torch.zeros(num_dst + 1, dtype=torch.int64, device=device)
    torch.cumsum(counts, 0, out=indptr[1:])
    if impl == "kernel" and not validate:
        src_nids, indices = relabel(dst_nids, src_nids_per_edge)
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


def _check_sample_args(indptr: torch.Tensor, indices: torch.Tensor, seeds: torch.Tensor, fanout: int) -> None:
    for name, tensor in (("indptr", indptr), ("indices", indices), ("seeds", seeds)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(tensor.shape)}")
    if indptr.dtype != torch.int64 or len(indptr) < 1:
        raise ValueError(f"indptr must be int64 with num_nodes + 1 >= 1 entries, got {indptr.dtype} of {len(indptr)}")
    if indices.dtype not in _INDEX_DTYPES:
        raise ValueError(f"indices must be int32 or int64, got {indices.dtype}")
    if seeds.dtype not in _SEED_DTYPES:
        raise ValueError(f"seeds must be an integer tensor, got {seeds.dtype}")
    if isinstance(fanout, bool) or not isinstance(fanout, int) or fanout < -1:
        raise ValueError(f"fanout must be an int >= -1 (-1 = all neighbours), got {fanout!r}")


def _sampling_device(indptr: torch.Tensor, indices: torch.Tensor, seeds: torch.Tensor) -> torch.device:
    """``indptr``'s GPU, else ``indices``', else ``seeds``', else the current one."""
    if indptr.is_cuda:
        if indices.is_cuda and indices.device != indptr.device:
            raise ValueError(f"indptr and indices are on different GPUs ({indptr.device}, {indices.device})")
        return indptr.device
    if indices.is_cuda:
        return indices.device
    if seeds.is_cuda:
        return seeds.device
    return torch.device("cuda", torch.cuda.current_device())


def sample_neighbors(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    seeds: torch.Tensor,
    fanout: int,
    replace: bool = False,
    rng_seed: int = 0,
    return_neighbors: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Pick up to ``fanout`` in-neighbours of each seed, uniformly, on the GPU.

    Args:
        indptr: ``(num_nodes + 1,)`` int64 CSC row pointer, on the GPU or in pinned host memory.
        indices: ``(num_edges,)`` int32 or int64 source node per edge position, on the GPU or pinned.
        seeds: ``(num_seeds,)`` integer node ids (``0 <= seed < num_nodes``), repeats allowed, anywhere
            (copied to the sampling GPU when elsewhere).
        fanout: picks per seed, ``-1`` for all.
        replace: draw with replacement.
        rng_seed: seed of the random streams; seed ``i`` draws from a stream keyed by ``(rng_seed, i)``.
        return_neighbors: also return ``indices[positions]`` as int64 (read in the fill pass, so
            zero-copy ``indices`` need not be copied to the GPU).

    Returns:
        ``counts`` ``(num_seeds,)`` int64 and ``positions`` ``(counts.sum(),)`` int64 on the sampling GPU:
        ``min(fanout, degree)`` picks without replacement, ``fanout`` with replacement when the degree is
        positive, every edge for ``fanout=-1``; positions grouped by seed in seed order (order inside a
        group: see the module docstring); with ``return_neighbors`` a third tensor, the neighbour ids.
        ``positions`` and the neighbour ids may be views of larger allocations (module docstring).
        The sampling GPU is ``indptr``'s, else ``indices``', else ``seeds``', else the current device.
        Without CUDA: the CPU kernel's result, as CPU tensors.

    Raises:
        TypeError: an argument is not a tensor.
        ValueError: a dtype or shape is wrong, a seed is out of range, ``indptr`` is corrupt, or a CPU
            tensor is not pinned while CUDA is available.
        ExtensionBuildError: CUDA is available but the extension could not be built.
    """
    _check_sample_args(indptr, indices, seeds, fanout)
    if not _cuda_available():
        return _sample_on_cpu(indptr, indices, seeds, fanout, replace, rng_seed, return_neighbors)

    # Pinned-or-pageable is checked by the binding (error bits), which asks CUDA once per tensor anyway.
    device = _sampling_device(indptr, indices, seeds)
    if not indptr.is_contiguous():
        raise ValueError("indptr must be contiguous")
    if not indices.is_contiguous():
        raise ValueError("indices must be contiguous")
    if seeds.device != device or seeds.dtype != torch.int64:
        seeds = seeds.to(device=device, dtype=torch.int64)
    if not seeds.is_contiguous():
        seeds = seeds.contiguous()
    counts, positions, neighbors, bits = graph_kernels().sample_neighbors(
        indptr, indices, seeds, int(fanout), bool(replace), int(rng_seed) % 2**64, bool(return_neighbors), device.index
    )
    if bits:
        _raise_for(bits, len(indptr) - 1, len(indices))
    if return_neighbors:
        return counts, positions, neighbors
    return counts, positions


_cuda_available = functools.cache(torch.cuda.is_available)
_INDEX_DTYPES = (torch.int32, torch.int64)
_SEED_DTYPES = frozenset(
    (torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.int64, torch.uint64)
)

# Error bits of the binding (SampleFlag in csrc/cuda/sample.h).
_SEED_OUT_OF_RANGE, _CORRUPT_INDPTR, _INDPTR_END, _INDPTR_PAGEABLE, _INDICES_PAGEABLE = 1, 2, 4, 8, 16


def _raise_for(bits: int, num_nodes: int, num_edges: int) -> None:
    for flag, name in ((_INDPTR_PAGEABLE, "indptr"), (_INDICES_PAGEABLE, "indices")):
        if bits & flag:
            raise ValueError(f"{name} is in pageable host memory: move it to the GPU or pin it (tensor.pin_memory())")
    if bits & _INDPTR_END:
        raise ValueError(f"indptr[-1] must equal len(indices) = {num_edges}")
    if bits & _SEED_OUT_OF_RANGE:
        raise ValueError(f"seeds must be node ids in [0, {num_nodes})")
    if bits & _CORRUPT_INDPTR:
        raise ValueError("indptr is corrupt: a seed's range is decreasing or leaves [0, len(indices)]")


def relabel(dst_nids: torch.Tensor, src_nids_per_edge: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's relabel: ``(src_nids, indices)`` with ``src_nids`` = ``dst_nids`` then the other sources in
    order of first appearance, and ``indices[k]`` the position of edge ``k``'s source in ``src_nids`` (the
    semantics of :func:`distgnn.sampling.cpu.to_block`).

    On a CUDA device a hash-table kernel (``csrc/cuda/relabel.cu``: insert, flag, scan, assign, relabel; one host
    sync to size ``src_nids``) does it without sorting; CPU tensors go to the C++ CPU kernel. Both take int64
    ids ``>= 0`` and unique ``dst_nids``, and check neither (the sampler's layers are so by construction).

    Raises:
        ValueError: a tensor is not 1-D int64, or the two are on different devices.
    """
    for name, tensor in (("dst_nids", dst_nids), ("src_nids_per_edge", src_nids_per_edge)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 1 or tensor.dtype != torch.int64:
            raise ValueError(f"{name} must be a 1-D int64 tensor, got {getattr(tensor, 'dtype', type(tensor))}")
    if dst_nids.device != src_nids_per_edge.device:
        raise ValueError(f"dst_nids is on {dst_nids.device} but src_nids_per_edge on {src_nids_per_edge.device}")
    if not dst_nids.is_cuda:
        src_nids, indices = cpu.extension().relabel(
            dst_nids.contiguous().numpy(), src_nids_per_edge.contiguous().numpy()
        )
        return torch.from_numpy(src_nids), torch.from_numpy(indices)
    return tuple(graph_kernels().relabel(dst_nids.contiguous(), src_nids_per_edge.contiguous()))


def _sample_on_cpu(indptr, indices, seeds, fanout, replace, rng_seed, return_neighbors):
    """The C++ CPU kernel on the same tensors (machines without CUDA)."""
    result = cpu.sample_neighbors(
        indptr.contiguous().numpy(),
        indices.contiguous().numpy(),
        seeds.to(torch.int64).contiguous().numpy(),
        fanout,
        replace=replace,
        rng_seed=rng_seed,
        return_neighbors=return_neighbors,
    )
    return tuple(torch.from_numpy(array) for array in result)
