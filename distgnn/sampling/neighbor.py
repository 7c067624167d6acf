"""Distributed multi-layer neighbour sampling: seeds in, one Block per GNN layer out.

Per layer the frontier is split by owner (partition book). Seeds owned by
other machines go to their owner's servers as ``sample`` requests first; the
seeds this machine owns are sampled in-process from the shared-memory CSC
while those requests are in flight; the replies are then merged back into seed
order and relabelled into a Block. The next layer's frontier is the Block's
source nodes.

With a ``device``, the same steps run in torch on that device (:mod:`distgnn.sampling.device`): on a
CUDA device the local seeds are sampled by the GPU kernel from the partition's CSC placed there once, the
remote replies are copied over, and the blocks are merged and relabelled there.

On a heterogeneous graph a layer samples (node, edge type) *items*: every
frontier node with every edge type that ends at its node type and has a
non-zero fanout. An item is one row of the partition's typed CSC (see
docs/partition-format.md), so the kernel samples all edge types of a layer in
one call, and a remote machine gets one request for all its items. The Block
records each edge's type and each source node's type.

The sampler reads a graph through a small interface (:class:`GraphSource`):
a :class:`distgnn.DistGraph` in a job, or :class:`InProcessGraph` for
single-process training and tests, so both run the same code.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import replace as _replace_fields
from typing import Protocol

import numpy as np
import torch

from distgnn.data.graph import Graph
from distgnn.data.hetero import DEFAULT_NTYPE, HeteroGraph, materialize
from distgnn.errors import ConfigError, InputError
from distgnn.partition.book import RangePartitionBook
from distgnn.sampling import device as on_device
from distgnn.sampling import kernels
from distgnn.sampling.block import Block
from distgnn.sampling.csc import LocalCSC


class RemoteSampling(Protocol):
    """Sends ``sample`` requests to the servers of other machines and collects the replies."""

    def send_sample(
        self,
        machine_id: int,
        seeds: np.ndarray,
        fanout: int | list[int],
        replace: bool,
        prob: str | None,
        rng_seed: int,
        etypes: np.ndarray | None = None,
    ) -> object:
        """Sample ``seeds`` on ``machine_id``; with ``etypes`` (one edge type per seed: typed items),
        ``fanout`` lists one fanout per edge type."""
        ...

    def wait_sample(self, handles: Sequence[object]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``(counts, neighbour global ids, global edge ids)`` per handle, in order."""
        ...

    def find_edges(self, eids_by_machine: dict[int, np.ndarray]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """``(source, destination)`` global node ids of each machine's own edges (one request per machine)."""
        ...


class GraphSource(Protocol):
    """What the sampler needs from a graph (a DistGraph is adapted by :func:`sampling_view`)."""

    def get_partition_book(self) -> RangePartitionBook: ...

    def sampling_view(self) -> tuple[LocalCSC, RemoteSampling | None]: ...


class _RpcSampling:
    """``sample`` requests to other machines' servers through a DistGraph's RPC client."""

    def __init__(self, g):
        self.client = g.rpc
        self.context = g.context

    def send_sample(
        self,
        machine_id: int,
        seeds: np.ndarray,
        fanout: int | list[int],
        replace: bool,
        prob: str | None,
        rng_seed: int,
        etypes: np.ndarray | None = None,
    ) -> int:
        fields = {"replace": bool(replace), "seed": int(rng_seed), "prob": prob}
        arrays = [seeds]
        if etypes is None:
            fields["fanout"] = int(fanout)
        else:
            fields["fanouts"] = [int(f) for f in fanout]
            arrays.append(np.ascontiguousarray(etypes, dtype=np.int64))
        server = self.context.read_server(machine_id)
        return self.client.send(machine_id, "sample", fields, arrays, server_id=server)

    def wait_sample(self, handles: Sequence[object]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return [tuple(reply.arrays) for reply in self.client.wait(list(handles))]

    def find_edges(self, eids_by_machine: dict[int, np.ndarray]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        rids = {
            m: self.client.send(m, "find_edges", arrays=[eids], server_id=self.context.read_server(m))
            for m, eids in eids_by_machine.items()
        }
        replies = self.client.wait(list(rids.values()))
        return {m: (reply.arrays[0], reply.arrays[1]) for m, reply in zip(rids, replies, strict=True)}


def sampling_view(g) -> tuple[LocalCSC, RemoteSampling | None]:
    """The local CSC and remote access of ``g``: its own ``sampling_view`` or, for a DistGraph,
    this machine's shared-memory partition and the RPC client."""
    own = getattr(g, "sampling_view", None)
    if own is not None:
        return own()
    part = g.local_partition
    shared = g.context.local_partition()
    weights = {}
    for name in g.edata:
        arr = shared.tensor("edge", name)
        if arr is not None and arr.ndim == 1 and arr.dtype == np.float32:
            weights[name] = arr
    local = LocalCSC(
        part_id=part.part_id,
        node_start=part.node_range[0],
        indptr=part.indptr,
        indices=part.indices,
        eids=part.eids,
        local2global=part.local2global,
        edge_weights=weights,
        num_etypes=part.num_etypes,
    )
    return local, _RpcSampling(g)


def derive_seed(*parts: int) -> int:
    """A 63-bit random-stream seed from integers (base seed, epoch, batch, layer, ...)."""
    digest = hashlib.blake2b(np.asarray(parts, dtype=np.int64).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class NeighborSampler:
    """Uniform (or edge-weighted) neighbour sampling, one fanout per layer.

    Args:
        fanouts: neighbours per node for each layer, input layer first (as in
            DGL: ``[15, 10, 5]`` samples 5 neighbours of the output nodes, then
            10, then 15); ``-1`` takes all neighbours. On a heterogeneous graph an
            int samples that many neighbours per edge type, and a dict
            ``{etype: k}`` (canonical triple, ``"src:rel:dst"`` or a unique relation
            name) gives each edge type its own; edge types left out or at 0 are
            not sampled.
        replace: sample with replacement.
        prob: name of an edge array holding non-negative sampling weights;
            zero-weight edges are never picked. Not with a CUDA ``device``.
        device: None (numpy on the CPU, blocks of CPU tensors) or a torch device
            to sample on and return the blocks on. On a CUDA device the local
            partition is sampled by the GPU kernel (uniform only), remote seeds
            still by RPC (``"cuda"`` means the current CUDA device at construction);
            ``"cpu"`` runs the same torch merge and relabel on the CPU and gives
            the same blocks as None.
        graph_memory: with a CUDA device, where the local partition's CSC is
            read from: ``"gpu"`` (copied into GPU memory once) or ``"pinned"``
            (page-locked host memory read zero-copy, for partitions larger than
            the GPU). Placed on first use, kept until :meth:`close`.
    """

    def __init__(
        self,
        fanouts: Sequence[int],
        replace: bool = False,
        prob: str | None = None,
        device: torch.device | str | None = None,
        graph_memory: str = "gpu",
    ):
        fanouts = [_check_layer_fanout(f) for f in fanouts]
        if not fanouts:
            raise ConfigError("fanouts must be a non-empty list, one entry per layer")
        if graph_memory not in on_device.GRAPH_MEMORY:
            raise ConfigError(f"graph_memory must be one of {on_device.GRAPH_MEMORY}, got {graph_memory!r}")
        device = None if device is None else torch.device(device)
        if device is not None and device.type not in ("cpu", "cuda"):
            raise ConfigError(f"the sampler runs on the CPU or a CUDA device, got {device}")
        if device is not None and device.type == "cuda":
            if prob is not None:
                raise ConfigError(
                    f"prob={prob!r} needs weighted sampling, which the GPU kernel does not do (uniform only); "
                    "sample by weight with device=None"
                )
            if not torch.cuda.is_available():
                raise ConfigError(f"sampler device {device} asked for, but torch sees no CUDA device")
            if device.index is None:
                # Pinned now: the current device is per thread, and a prefetch thread starts on GPU 0.
                device = torch.device("cuda", torch.cuda.current_device())
        self.fanouts = fanouts
        self.replace = bool(replace)
        self.prob = prob
        self.device = device
        self.graph_memory = graph_memory
        self._placed: dict[tuple[int, ...], on_device.DeviceCSC] = {}
        self._placing = threading.Lock()
        self._range_ends: tuple[bytes, torch.Tensor] | None = None  # the book's node ranges on the device

    def spec(self) -> dict:
        """A small picklable description that :meth:`from_spec` turns back into a sampler."""
        return {
            "fanouts": list(self.fanouts),
            "replace": self.replace,
            "prob": self.prob,
            "device": None if self.device is None else str(self.device),
            "graph_memory": self.graph_memory,
        }

    @classmethod
    def from_spec(cls, spec: dict) -> NeighborSampler:
        return cls(spec["fanouts"], spec["replace"], spec["prob"], spec["device"], spec["graph_memory"])

    def __repr__(self) -> str:
        where = "" if self.device is None else f", device={str(self.device)!r}, graph_memory={self.graph_memory!r}"
        return f"NeighborSampler(fanouts={self.fanouts}, replace={self.replace}, prob={self.prob!r}{where})"

    def close(self) -> None:
        """Release the partitions placed on the device (again on the next sample); safe to call twice."""
        with self._placing:
            placed, self._placed = list(self._placed.values()), {}
        for csc in placed:
            csc.close()

    def sample_blocks(
        self, g: GraphSource, seeds: torch.Tensor | np.ndarray, rng_seed: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, list[Block]]:
        """Sample the message-flow graphs of ``seeds``.

        Args:
            g: a DistGraph or InProcessGraph.
            seeds: ``(B,)`` unique global ids of the output nodes.
            rng_seed: seed of this mini-batch's random streams (layers derive their own).

        Returns:
            ``(input_nodes, output_nodes, blocks)``: global ids of the first
            block's source nodes, the seeds, and one Block per layer, input
            layer first; on the sampler's device (CPU without one).
        """
        if self.device is not None:
            return self._sample_blocks_on_device(g, seeds, rng_seed)
        book = g.get_partition_book()
        local, remote = sampling_view(g)
        frontier = as_node_ids(seeds)
        output_nodes = frontier
        blocks: list[Block] = []
        for layer in reversed(range(len(self.fanouts))):
            layer_seed = derive_seed(rng_seed, layer)
            fanout = layer_fanouts(book, self.fanouts[layer])
            if book.is_homogeneous:
                counts, src, eids = sample_layer(
                    book, local, remote, frontier, fanout, self.replace, self.prob, layer_seed
                )
                block = kernels.to_block(frontier, counts, src, eids)
            else:
                item_pos, item_etype = typed_items(book, frontier, fanout)
                counts, src, eids = sample_layer(
                    book, local, remote, frontier[item_pos], fanout, self.replace, self.prob, layer_seed, item_etype
                )
                seed_counts = np.bincount(item_pos, weights=counts, minlength=len(frontier)).astype(np.int64)
                block = kernels.to_block(frontier, seed_counts, src, eids)
                block = _typed(block, book, torch.from_numpy(np.repeat(item_etype, counts)))
            blocks.insert(0, block)
            frontier = block.src_nids.numpy()
        return torch.from_numpy(frontier), torch.from_numpy(output_nodes), blocks

    def _sample_blocks_on_device(
        self, g: GraphSource, seeds: torch.Tensor | np.ndarray, rng_seed: int
    ) -> tuple[torch.Tensor, torch.Tensor, list[Block]]:
        book = g.get_partition_book()
        local, remote = sampling_view(g)
        host_seeds = as_node_ids(seeds)
        book.nid2partid(host_seeds)  # range check, with the CPU path's error
        # Checked here once, so that the layers (unique by construction) relabel without a host sync.
        if len(np.unique(host_seeds)) != len(host_seeds):
            raise InputError("seeds must be unique node ids, got repeats")
        placed = self._placed_csc(local) if self.device.type == "cuda" else None
        range_ends = self._device_range_ends(book)
        frontier = torch.from_numpy(host_seeds).to(self.device)
        output_nodes = frontier
        blocks: list[Block] = []
        for layer in reversed(range(len(self.fanouts))):
            layer_seed = derive_seed(rng_seed, layer)
            fanout = layer_fanouts(book, self.fanouts[layer])
            if book.is_homogeneous:
                counts, src, eids = sample_layer_on_device(
                    range_ends, local, placed, remote, frontier, fanout, self.replace, self.prob, layer_seed
                )
                block = on_device.to_block(frontier, counts, src, eids, validate=False)
            else:
                # Items are listed on the host (one copy of the frontier per layer); sampling stays on the device.
                item_pos, item_etype = typed_items(book, frontier.cpu().numpy(), fanout)
                item_pos_d = torch.from_numpy(item_pos).to(self.device)
                item_etype_d = torch.from_numpy(item_etype).to(self.device)
                counts, src, eids = sample_layer_on_device(
                    range_ends,
                    local,
                    placed,
                    remote,
                    frontier[item_pos_d],
                    fanout,
                    self.replace,
                    self.prob,
                    layer_seed,
                    item_etype_d,
                )
                seed_counts = torch.zeros(len(frontier), dtype=torch.int64, device=self.device)
                seed_counts.index_add_(0, item_pos_d, counts)
                block = on_device.to_block(frontier, seed_counts, src, eids, validate=False)
                block = _typed(block, book, torch.repeat_interleave(item_etype_d, counts))
            blocks.insert(0, block)
            frontier = block.src_nids
        return frontier, output_nodes, blocks

    def _device_range_ends(self, book: RangePartitionBook) -> torch.Tensor:
        """The end of each partition's node range on the device, copied there once per partition book."""
        key = book.node_map.tobytes()
        cached = self._range_ends
        if cached is None or cached[0] != key:
            cached = self._range_ends = (key, torch.from_numpy(book.node_map[:, 1].copy()).to(self.device))
        return cached[1]

    def _placed_csc(self, local: LocalCSC) -> on_device.DeviceCSC:
        # A DistGraph hands out a new LocalCSC per call over the same shared-memory arrays; the placed copy
        # holds those arrays, so their ids stay unique while it is cached.
        key = tuple(id(a) for a in (local.indptr, local.indices, local.eids, local.local2global))
        with self._placing:
            placed = self._placed.get(key)
            if placed is None:
                placed = on_device.DeviceCSC(local, self.device, self.graph_memory)
                self._placed[key] = placed
            return placed


def _check_layer_fanout(fanout: int | Mapping) -> int | dict:
    if isinstance(fanout, Mapping):
        checked = {}
        for etype, k in fanout.items():
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < -1:
                raise ConfigError(
                    f"fanouts: the fanout of edge type {etype!r} must be an int >= -1 (0 skips it), got {k!r}"
                )
            checked[etype] = int(k)
        if not any(checked.values()):
            raise ConfigError(f"fanouts: the layer {fanout} samples no edge type")
        return checked
    if isinstance(fanout, bool) or not isinstance(fanout, (int, np.integer)) or fanout < -1 or fanout == 0:
        raise ConfigError(
            f"fanouts: a layer's fanout must be a positive int, -1 for all, or a dict per edge type; got {fanout!r}"
        )
    return int(fanout)


def layer_fanouts(book: RangePartitionBook, fanout: int | dict) -> int | list[int]:
    """One layer's fanout for ``book``'s graph: an int on a homogeneous graph, else one per edge type."""
    if book.is_homogeneous:
        if isinstance(fanout, dict):
            (k,) = layer_fanouts_typed(book, fanout)
            return k
        return fanout
    if isinstance(fanout, dict):
        return layer_fanouts_typed(book, fanout)
    return [fanout] * len(book.canonical_etypes)


def layer_fanouts_typed(book: RangePartitionBook, fanout: dict) -> list[int]:
    out = [0] * len(book.canonical_etypes)
    for etype, k in fanout.items():
        try:
            out[book.etype_id(etype)] = k
        except InputError as exc:
            raise ConfigError(f"fanouts: {exc}") from None
    return out


def typed_items(book: RangePartitionBook, seeds: np.ndarray, fanouts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The (node, edge type) items of a typed layer, grouped by seed in seed order.

    Returns ``(item_pos, item_etype)``: per item the position of its node in ``seeds`` and the edge type,
    for every edge type that ends at the node's type and has a non-zero fanout.
    """
    ntypes, _ = book.map_to_per_ntype(seeds)
    wanted = (ntypes[:, None] == book.etype_dst[None, :]) & (np.asarray(fanouts)[None, :] != 0)
    item_pos, item_etype = np.nonzero(wanted)
    return item_pos.astype(np.int64), item_etype.astype(np.int64)


def _typed(block: Block, book: RangePartitionBook, etypes: torch.Tensor) -> Block:
    """``block`` with the edge type of each edge and the node type of each source node."""
    src_ntypes, _ = book.map_to_per_ntype(block.src_nids.cpu())
    return _replace_fields(block, etypes=etypes, src_ntypes=src_ntypes.to(block.src_nids.device))


def sample_layer(
    book: RangePartitionBook,
    local: LocalCSC,
    remote: RemoteSampling | None,
    seeds: np.ndarray,
    fanout: int | list[int],
    replace: bool,
    prob: str | None,
    rng_seed: int,
    etypes: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One layer over the whole cluster: ``(counts, src global ids, edge ids)`` in seed order.

    With ``etypes`` the seeds are typed items (a node may repeat, once per edge type) and ``fanout`` lists
    one fanout per edge type.
    """
    owners = book.nid2partid(seeds)
    local_where = None
    remote_wheres: list[np.ndarray] = []  # positions in `seeds` of each remote owner's seeds
    handles = []
    for part in np.unique(owners).tolist():
        where = np.flatnonzero(owners == part)
        if part == local.part_id:
            local_where = where
            continue
        if remote is None:
            raise InputError(f"seed owned by partition {part} but this graph has no remote access")
        # Each machine's stream is seeded apart so that results do not depend on the batching.
        part_etypes = None if etypes is None else etypes[where]
        handles.append(
            remote.send_sample(part, seeds[where], fanout, replace, prob, derive_seed(rng_seed, part), part_etypes)
        )
        remote_wheres.append(where)
    wheres, results = [], []
    if local_where is not None:
        wheres.append(local_where)
        local_seed = derive_seed(rng_seed, local.part_id)
        local_etypes = None if etypes is None else etypes[local_where]
        results.append(_sample_local(local, seeds[local_where], fanout, replace, prob, local_seed, local_etypes))
    if handles:
        wheres.extend(remote_wheres)
        results.extend(remote.wait_sample(handles))
    return _merge(len(seeds), wheres, results)


def sample_layer_on_device(
    range_ends: torch.Tensor,
    local: LocalCSC,
    placed: on_device.DeviceCSC | None,
    remote: RemoteSampling | None,
    seeds: torch.Tensor,
    fanout: int | list[int],
    replace: bool,
    prob: str | None,
    rng_seed: int,
    etypes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`sample_layer` on ``seeds``' device, with the same random streams.

    Args:
        range_ends: ``(num_parts,)`` int64 end of each partition's node range, on the device.
        placed: the local CSC on a CUDA device, or None to sample it with the CPU kernel.
        seeds: ``(B,)`` int64 valid global ids on the device.
    """
    device = seeds.device
    by_owner = _positions_by_owner(range_ends, seeds)
    remote_wheres, handles = [], []
    for part, where in by_owner.items():
        if part == local.part_id:
            continue
        if remote is None:
            raise InputError(f"seed owned by partition {part} but this graph has no remote access")
        part_seeds = (seeds if where is None else seeds[where]).cpu().numpy()
        part_etypes = None if etypes is None else (etypes if where is None else etypes[where]).cpu().numpy()
        handles.append(
            remote.send_sample(part, part_seeds, fanout, replace, prob, derive_seed(rng_seed, part), part_etypes)
        )
        remote_wheres.append(where)
    wheres, results = [], []
    if local.part_id in by_owner:
        where = by_owner[local.part_id]
        local_seeds = seeds if where is None else seeds[where]
        local_etypes = None if etypes is None else (etypes if where is None else etypes[where])
        local_seed = derive_seed(rng_seed, local.part_id)
        if placed is not None:
            results.append(placed.sample(local_seeds, fanout, replace, local_seed, local_etypes))
        else:
            host_etypes = None if local_etypes is None else local_etypes.cpu().numpy()
            picked = _sample_local(local, local_seeds.cpu().numpy(), fanout, replace, prob, local_seed, host_etypes)
            results.append(tuple(torch.from_numpy(a).to(device) for a in picked))
        wheres.append(where)
    if handles:
        wheres.extend(remote_wheres)
        for reply in remote.wait_sample(handles):
            results.append(tuple(on_device.as_tensor(a).to(device) for a in reply))
    return on_device.merge(len(seeds), wheres, results, device)


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


def _sample_local(
    local: LocalCSC,
    seeds: np.ndarray,
    fanout: int | list[int],
    replace: bool,
    prob: str | None,
    rng_seed: int,
    etypes: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    weights = None
    if prob is not None:
        if prob not in local.edge_weights:
            raise InputError(f"no edge array {prob!r} to sample by (have {sorted(local.edge_weights)})")
        weights = local.edge_weights[prob]
    # An explicit thread count matters beyond speed: with the default (None) the kernel turns on
    # OpenMP dynamic teams for the calling thread, and torch's parallel CPU kernels that split work
    # by the requested team size (the CSR product among them) then silently skip chunks.
    threads = torch.get_num_threads()
    if etypes is not None:
        fanout = np.asarray(fanout, dtype=np.int64)[etypes]
    counts, positions, neighbors = kernels.sample_neighbors(
        local.indptr,
        local.indices,
        local.rows(seeds, etypes),
        fanout,
        replace,
        weights,
        rng_seed,
        num_threads=threads,
        return_neighbors=True,
    )
    src = kernels.take(local.local2global, neighbors, num_threads=threads)
    return counts, src, kernels.take(local.eids, positions, num_threads=threads)


def _merge(
    num_seeds: int,
    wheres: list[np.ndarray],
    results: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scatter per-owner results (each grouped by seed in ``where`` order) into global seed order."""
    if len(wheres) == 1:
        return results[0]
    counts = np.zeros(num_seeds, dtype=np.int64)
    for where, (group_counts, _, _) in zip(wheres, results, strict=True):
        counts[where] = group_counts
    offsets = np.zeros(num_seeds + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    total = int(offsets[-1])
    src = np.empty(total, dtype=np.int64)
    eids = np.empty(total, dtype=np.int64)
    for where, (group_counts, group_src, group_eids) in zip(wheres, results, strict=True):
        # Edge k of the group, the j-th pick of seed where[i], lands at offsets[where[i]] + j.
        starts = np.zeros(len(group_counts), dtype=np.int64)
        np.cumsum(group_counts[:-1], out=starts[1:])
        target = np.repeat(offsets[where] - starts, group_counts) + np.arange(len(group_src), dtype=np.int64)
        src[target] = group_src
        eids[target] = group_eids
    return counts, src, eids


def as_node_ids(ids: torch.Tensor | np.ndarray, name: str = "seeds") -> np.ndarray:
    """``ids`` (a tensor on any device or an array) as a contiguous 1-D int64 numpy array."""
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if ids.ndim != 1:
        raise InputError(f"{name} must be a 1-D array of node ids, got shape {ids.shape}")
    return ids


class InProcessGraph:
    """A whole :class:`~distgnn.data.graph.Graph` held in this process, one partition.

    Behaves like a DistGraph for the sampler, the loader and the training
    script (``ndata`` maps names to torch tensors indexed by global id), so a
    single-process run goes through exactly the distributed code path. Node
    and edge ids are the Graph's own. A :class:`~distgnn.data.hetero.HeteroGraph`
    gives the typed view (``ntypes``, ``g.nodes[T].data``...) with homogeneous ids
    numbering the types one after the other.
    """

    def __init__(self, graph: Graph | HeteroGraph):
        if isinstance(graph, HeteroGraph) and not graph.is_homogeneous:
            self._init_typed(graph.validate())
            return
        if isinstance(graph, HeteroGraph):
            graph = _as_graph(graph)
        self.nodes = self.edges = None
        graph.validate()
        order = np.argsort(graph.dst, kind="stable")
        indptr = np.zeros(graph.num_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(graph.dst, minlength=graph.num_nodes), out=indptr[1:])
        self.graph_name = graph.name
        self._num_nodes = graph.num_nodes
        self._num_edges = graph.num_edges
        self.num_classes = graph.num_classes
        self.ndata = {name: torch.from_numpy(np.ascontiguousarray(arr)) for name, arr in graph.ndata.items()}
        self.edata = {name: torch.from_numpy(np.ascontiguousarray(arr)) for name, arr in graph.edata.items()}
        self._book = RangePartitionBook([[0, graph.num_nodes]], [[0, graph.num_edges]])
        self._local = LocalCSC(
            part_id=0,
            node_start=0,
            indptr=indptr,
            indices=np.ascontiguousarray(graph.src[order], dtype=np.int64),
            eids=order.astype(np.int64),
            local2global=np.arange(graph.num_nodes, dtype=np.int64),
            edge_weights={
                name: np.ascontiguousarray(arr[order], dtype=np.float32)
                for name, arr in graph.edata.items()
                if arr.ndim == 1 and arr.dtype.kind == "f"
            },
        )

    def _init_typed(self, graph: HeteroGraph) -> None:
        ntypes, etypes = graph.ntypes, graph.canonical_etypes
        counts = np.array([graph.num_nodes[t] for t in ntypes], dtype=np.int64)
        node_ends = np.cumsum(counts)
        offsets = dict(zip(ntypes, (node_ends - counts).tolist(), strict=True))
        edge_counts = np.array([graph.num_edges(e) for e in etypes], dtype=np.int64)
        edge_ends = np.cumsum(edge_counts)
        n, m, k = int(node_ends[-1]), int(edge_ends[-1]), len(etypes)
        src = np.concatenate([graph.edges[e][0] + offsets[e[0]] for e in etypes]).astype(np.int64)
        dst = np.concatenate([graph.edges[e][1] + offsets[e[2]] for e in etypes]).astype(np.int64)
        rows = dst * k + np.repeat(np.arange(k, dtype=np.int64), edge_counts)
        order = np.argsort(rows, kind="stable")
        indptr = np.zeros(n * k + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=n * k), out=indptr[1:])
        self.graph_name = graph.name
        self._num_nodes, self._num_edges = n, m
        self.num_classes = graph.num_classes
        self._book = RangePartitionBook(
            [[0, n]],
            [[0, m]],
            ntypes,
            etypes,
            np.stack([node_ends - counts, node_ends], axis=1)[None],
            np.stack([edge_ends - edge_counts, edge_ends], axis=1)[None],
        )
        self.ndata, self.edata = {}, {}
        self.nodes = {
            t: TypedTensors({k_: torch.from_numpy(np.ascontiguousarray(materialize(a))) for k_, a in arrays.items()})
            for t, arrays in ((t, graph.ndata.get(t, {})) for t in ntypes)
        }
        self._edge_data = {
            e: TypedTensors({k_: torch.from_numpy(np.ascontiguousarray(materialize(a))) for k_, a in arrays.items()})
            for e, arrays in ((e, graph.edata.get(e, {})) for e in etypes)
        }
        self.edges = _InProcessEdgeTypes(self)
        self._local = LocalCSC(0, 0, indptr, src[order], order.astype(np.int64), np.arange(n), {}, num_etypes=k)

    @property
    def ntypes(self) -> list[str]:
        return self._book.ntypes

    @property
    def canonical_etypes(self) -> list[tuple[str, str, str]]:
        return self._book.canonical_etypes

    @property
    def is_homogeneous(self) -> bool:
        return self._book.is_homogeneous

    def num_nodes(self, ntype: str | None = None) -> int:
        if ntype is None or self._book.is_homogeneous:
            return self._num_nodes
        return int(self._book.nodes.type_counts[self._book.ntype_id(ntype)])

    def num_edges(self, etype=None) -> int:
        if etype is None or self._book.is_homogeneous:
            return self._num_edges
        return int(self._book.edges.type_counts[self._book.etype_id(etype)])

    def get_partition_book(self) -> RangePartitionBook:
        return self._book

    def sampling_view(self) -> tuple[LocalCSC, RemoteSampling | None]:
        return self._local, None


@dataclass(frozen=True)
class TypedTensors:
    """``g.nodes[ntype]`` / ``g.edges[etype]`` of an in-process graph: ``data`` maps names to tensors."""

    data: dict[str, torch.Tensor]


class _InProcessEdgeTypes:
    def __init__(self, g: InProcessGraph):
        self._g = g

    def __getitem__(self, etype) -> TypedTensors:
        return self._g._edge_data[self._g.get_partition_book().to_canonical_etype(etype)]


def _as_graph(graph: HeteroGraph) -> Graph:
    """The one-type HeteroGraph as a Graph."""
    ((src, dst),) = graph.edges.values()
    ndata = {k: materialize(a) for k, a in graph.ndata.get(DEFAULT_NTYPE, {}).items()}
    edata = {k: materialize(a) for k, a in next(iter(graph.edata.values()), {}).items()}
    return Graph(graph.name, graph.total_nodes, src, dst, ndata, edata, graph.num_classes)


def split_by_type(book: RangePartitionBook, nids: torch.Tensor) -> dict[str, torch.Tensor]:
    """``{ntype: per-type ids}`` of homogeneous ``nids``, each type's ids in their order in ``nids``
    (types without nodes included, empty), on ``nids``' device."""
    types, per_type = book.map_to_per_ntype(nids.cpu())
    return {t: per_type[types == i].to(nids.device) for i, t in enumerate(book.ntypes)}
