"""``DistTensor``: a tensor whose rows are spread over the machines by the partition book.

Machine ``i`` holds the rows of the node (or edge) ids it owns. ``t[ids]``
copies local rows straight from shared memory and pulls the others, one
request per remote machine, all sent before the first wait. ``t[ids] = rows``
and ``t.push(ids, rows, "add")`` send the rows to each owner's main server,
the one writer of its partition.

``push(..., wait=False)`` does not wait for the servers' acknowledgements: they
are collected (and a failed push raised) when the same thread next reads rows
that another path than the push's connection would serve (local rows from
shared memory, remote rows from a backup server), at ``flush``, at
``DistContext.barrier``, at a checkpoint and when the client closes. Remote rows
pulled from the main server come after the push on the same connection and see
it without waiting.
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np
import torch

import distgnn.rpc.wire as wire
from distgnn.client.context import DistContext, get_context
from distgnn.client.rows import copy_rows
from distgnn.errors import InputError
from distgnn.native.cpu import extension
from distgnn.store import shm

# Remote pulls travel in requests of about this many bytes (see DistTensor.__getitem__).
PULL_CHUNK_BYTES = 4 << 20


def _sub(positions: np.ndarray | slice, begin: int, end: int) -> np.ndarray | slice:
    """Positions ``begin:end`` of a group: a slice stays a slice, so indexing with it copies nothing."""
    if isinstance(positions, slice):
        return slice(begin, end)
    return positions[begin:end]


def positions_by_owner(range_ends: np.ndarray, ids: np.ndarray) -> dict[int, np.ndarray | slice]:
    """Positions into ``ids`` per owning machine (only machines with ids); ``slice(None)`` when one owns all.

    ``range_ends`` is the ``(num_machines,)`` end of each machine's id range (``DistContext.range_ends``).
    """
    if ids.size == 0:
        return {}
    if len(range_ends) <= 8:  # a compare per range end: cheaper than a binary search per id for a few machines
        owners = np.zeros(len(ids), dtype=np.intp)
        for end in range_ends[:-1]:
            owners += ids >= end
    else:
        owners = np.searchsorted(range_ends, ids, side="right")
    counts = np.bincount(owners, minlength=len(range_ends))  # O(n): no sort of the owners
    present = np.flatnonzero(counts)
    if len(present) == 1:
        return {int(present[0]): slice(None)}
    return {int(m): np.flatnonzero(owners == m) for m in present}


def _owner_csr(
    src_ids: np.ndarray, dst_of_edge: np.ndarray, positions: np.ndarray, num_dst: int, dense: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One owner's share of a CSR: ``(ids, slots, indptr)``, the neighbour ids at ``positions`` (rising, so
    still grouped by destination), the destinations that have any (all ``num_dst`` when ``dense``) and the
    CSR over those destinations."""
    counts = np.bincount(dst_of_edge[positions], minlength=num_dst)
    slots = np.arange(num_dst) if dense else np.flatnonzero(counts)
    indptr = np.zeros(len(slots) + 1, dtype=np.int64)
    np.cumsum(counts[slots], out=indptr[1:])
    return src_ids[positions], slots, indptr


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype that can live in a DistTensor."""
    try:
        np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError:
        raise InputError(f"dtype {dtype} has no numpy equivalent and cannot be a DistTensor") from None
    if np_dtype.name not in wire.DTYPES:
        raise InputError(f"dtype {dtype} cannot be a DistTensor (allowed: {sorted(wire.DTYPES)})")
    return np_dtype


def as_ids(ids: Any, bound: int, what: str) -> np.ndarray:
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    ids = np.asarray(ids)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise InputError(f"{what} ids must be a 1-d integer tensor, got {ids.dtype}{list(ids.shape)}")
    ids = ids.astype(np.int64, copy=False)
    if ids.size and (ids.min() < 0 or ids.max() >= bound):
        bad = ids[(ids < 0) | (ids >= bound)][0]
        raise InputError(f"{what} id {int(bad)} out of range [0, {bound})")
    return ids


class DistTensor:
    """A distributed tensor of shape ``(num_nodes or num_edges, ...)``.

    Args:
        shape: global shape; ``shape[0]`` must be the graph's node count (``part_policy="node"``)
            or edge count (``"edge"``).
        dtype: torch dtype.
        name: shared by every trainer that means the same tensor; a fresh name if None.
        init: ``"zeros"``, ``"ones"``, ``"uniform"`` (in ``[low, high)``) or ``"normal"``
            (mean ``low``, std ``high``), applied once by each main server; a tensor that
            already exists (a graph feature, or one another trainer created) is mapped as is.
        persistent: accepted for DistDGL compatibility; tensors live until the job ends.
        part_policy: ``"node"`` or ``"edge"``.
        seed: seeds ``uniform``/``normal`` (combined with the partition id).
        context: defaults to ``distgnn.initialize``'s.
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        name: str | None = None,
        init: str = "zeros",
        persistent: bool = False,
        part_policy: str = "node",
        low: float = 0.0,
        high: float = 1.0,
        seed: int = 0,
        context: DistContext | None = None,
    ):
        ctx = context or get_context()
        name = shm.check_name(name if name is not None else f"anon-{secrets.token_hex(6)}")
        np_dtype = numpy_dtype(dtype)
        fields = {
            "policy": part_policy,
            "name": name,
            "dtype": np_dtype.name,
            "shape": [int(d) for d in shape],
            "init": init,
            "low": float(low),
            "high": float(high),
            "seed": int(seed),
        }
        client = ctx.client
        client.wait([client.send(m, "init_data", fields) for m in range(ctx.config.num_machines)])
        self._setup(ctx, tuple(int(d) for d in shape), dtype, name, part_policy, persistent)

    @classmethod
    def attach(
        cls, shape: tuple[int, ...], dtype: torch.dtype, name: str, part_policy: str, context: DistContext
    ) -> DistTensor:
        """A tensor the servers already hold (a graph feature), without any RPC."""
        self = cls.__new__(cls)
        self._setup(context, tuple(shape), dtype, name, part_policy, True)
        return self

    def _setup(
        self, ctx: DistContext, shape: tuple[int, ...], dtype: torch.dtype, name: str, policy: str, persistent: bool
    ) -> None:
        self.context = ctx
        self.shape = shape
        self.dtype = dtype
        self.name = name
        self.part_policy = policy
        self.persistent = persistent
        self._np_dtype = numpy_dtype(dtype)
        part = ctx.local_partition()
        total = part.total(policy)
        if not shape or shape[0] != total:
            raise InputError(f"a {policy} tensor needs {total} rows, got shape {shape}")
        local = part.tensor(policy, name)
        if local is None:
            raise InputError(f"machine {ctx.machine_id} holds no {policy} tensor named {name!r}")
        if local.dtype != self._np_dtype or local.shape[1:] != shape[1:]:
            raise InputError(
                f"{policy} tensor {name!r} is {local.dtype}{list(local.shape)} locally, expected {self._np_dtype} rows of {list(shape[1:])}"
            )
        self._local = local
        self._local_start = part.owned_range(policy)[0]
        self._push_tags = [f"write to {policy} tensor {name!r} on machine {m}" for m in range(ctx.config.num_machines)]

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return (
            f"DistTensor(name={self.name!r}, shape={self.shape}, dtype={self.dtype}, part_policy={self.part_policy!r})"
        )

    def _by_owner(self, ids: np.ndarray) -> dict[int, np.ndarray | slice]:
        return positions_by_owner(self.context.range_ends(self.part_policy), ids)

    # A CachedFeature that reads go through (see use_cache); class default so every constructor has it.
    _cache: Any = None

    def use_cache(self, cache: Any) -> None:
        """Route ``self[ids]`` through ``cache``, a :class:`distgnn.cache.dist_feature.CachedFeature` of this
        tensor (None stops it): reads then return rows on the cache's device, hot rows from GPU memory.

        The cache holds a snapshot of its hot rows, so writes are refused while one is in use.
        """
        if cache is not None and cache.tensor is not self:
            raise InputError(f"that cache reads {cache.tensor!r}, not {self!r}")
        self._cache = cache

    def __getitem__(self, ids: Any) -> torch.Tensor:
        """Rows ``ids`` (1-d int ids, any order, repeats allowed) as a new ``(len(ids), ...)`` tensor (on the
        cache's device when :meth:`use_cache` set one, else a CPU tensor)."""
        if self._cache is not None:
            return self._cache[ids]
        return self.read(ids)

    def read(self, ids: Any) -> torch.Tensor:
        """Rows ``ids`` as a CPU tensor: local rows from shared memory, the others pulled from their owners."""
        return self._read_started(ids).result()

    def read_async(self, ids: Any) -> PendingRead:
        """Starts reading rows ``ids``: sends the pulls of remote rows and copies the local ones while they are
        in flight; the returned read's ``result()`` waits for the pulls and gives the ``(len(ids), ...)`` CPU
        tensor. Start the reads of several tensors before the first ``result()`` (as a typed input layer reads
        every node type's rows) and their round trips overlap. Through a cache (:meth:`use_cache`) the rows
        are read at once, on the cache's device, as ``self[ids]`` reads them."""
        if self._cache is not None:
            return PendingRead(self, self._cache[ids], [])
        return self._read_started(ids)

    def _read_started(self, ids: Any) -> PendingRead:
        ids = as_ids(ids, self.shape[0], f"{self.name}")
        local_start, local_end = self._local_start, self._local_start + len(self._local)
        ctx, client = self.context, self.context.client
        if ids.size == 0 or (ids.min() >= local_start and ids.max() < local_end):
            client.settle([self._push_tags[ctx.machine_id]])
            return PendingRead(self, torch.from_numpy(np.take(self._local, ids - local_start, axis=0)), [])
        groups = self._by_owner(ids)
        pending = self._send_pulls(ids, groups)
        out = np.empty((len(ids), *self.shape[1:]), dtype=self._np_dtype)
        # Rows scattered to their places are copied once each (numpy's out[positions] = ... takes two passes).
        local = groups.get(ctx.machine_id)
        if isinstance(local, slice):
            np.take(self._local, ids[local] - local_start, axis=0, out=out[local])
        elif local is not None:
            copy_rows(self._local, ids[local] - local_start, out, local)
        return PendingRead(self, out, pending)

    def _send_pulls(self, ids: np.ndarray, groups: dict[int, np.ndarray | slice]) -> list:
        """Sends the pulls of the rows of ``ids`` (checked) that other machines own (``groups``: positions by
        owner) after settling the pushes they must see; returns ``[(positions, request id)]``."""
        ctx, client = self.context, self.context.client
        if ctx.config.num_servers == 1:
            # Remote rows come from the main server over the connection the pushes took, so after them.
            client.settle([self._push_tags[ctx.machine_id]] if ctx.machine_id in groups else [])
        else:
            client.settle([self._push_tags[m] for m in groups])
        fields = {"policy": self.part_policy, "name": self.name}
        row_bytes = max(1, self._local.itemsize * int(np.prod(self.shape[1:])))
        chunk = max(1, PULL_CHUNK_BYTES // row_bytes)
        pending = []
        for m, positions in groups.items():
            if m == ctx.machine_id:
                continue
            count = len(ids) if isinstance(positions, slice) else len(positions)
            # Chunks pipeline: a server gathers the next chunk while the previous one is on the wire,
            # and on machines with backups the chunks spread over all servers.
            for i, begin in enumerate(range(0, count, chunk)):
                part = _sub(positions, begin, begin + chunk)
                server = (ctx.read_server(m) + i) % ctx.config.num_servers
                pending.append((part, client.send(m, "pull", fields, [ids[part]], server_id=server)))
        return pending

    def read_self_and_mean(self, src_ids: Any, indptr: Any, indices: Any) -> torch.Tensor:
        """``(M, 2F)`` float32 ``[x_dst | mean of in-neighbours' x]`` of a block over ``src_ids``, summed on this
        trainer from where the rows are: this machine's from shared memory, the others' from the pulled replies.
        It equals ``distgnn.nn.aggregate.self_and_mean(block, self[src_ids])`` without the ``(len(src_ids), F)``
        copy of the rows in between (hundreds of thousands of rows in a 1M-node GraphSAGE batch).

        Args:
            src_ids: ``(n,)`` int ids of the block's sources, its ``M`` destinations first.
            indptr: ``(M + 1,)`` int64 CSR of the destinations' in-edges.
            indices: ``(E,)`` int64 positions into ``src_ids`` of each edge's source.
        """
        self._check_mean_input("read_self_and_mean")
        ids = as_ids(src_ids, self.shape[0], f"{self.name}")
        indptr = np.ascontiguousarray(np.asarray(indptr), dtype=np.int64)
        indices = np.ascontiguousarray(np.asarray(indices), dtype=np.int64)
        if indptr.ndim != 1 or not 1 <= len(indptr) <= len(ids) + 1:
            raise InputError(
                f"{self.name}: read_self_and_mean needs an indptr over at most {len(ids)} destinations, got "
                f"shape {indptr.shape}"
            )
        ctx, client = self.context, self.context.client
        groups = self._by_owner(ids)
        pending = self._send_pulls(ids, groups)
        # One pass once the replies are in, in edge order: the same adds in the same order as the layer's mean
        # over gathered rows ('rows'), so the result is bitwise the same whichever path a run takes.
        tables, row_table = [self._local], np.zeros(len(ids), dtype=np.int64)
        row_index = np.empty(len(ids), dtype=np.int64)
        local = groups.get(ctx.machine_id)
        if local is not None:  # read from shared memory (their pushes settled by _send_pulls)
            row_index[local] = ids[local] - self._local_start
        width = self.shape[1]
        for (part, _), reply in zip(pending, client.wait([rid for _, rid in pending]), strict=True):
            rows = reply.arrays[0]
            count = len(ids[part])
            if rows.shape != (count, width) or rows.dtype != np.float32:
                raise InputError(
                    f"{self.name}: a pull came back as {rows.dtype}{list(rows.shape)}, expected float32{[count, width]}"
                )
            row_table[part] = len(tables)
            row_index[part] = np.arange(count)
            tables.append(np.ascontiguousarray(rows))
        out = np.empty((len(indptr) - 1, 2 * width), dtype=np.float32)
        try:
            extension().mean_aggregate_tables(
                indptr, indices, tables, row_table, row_index, out, width, 0, torch.get_num_threads()
            )
        except (IndexError, ValueError) as exc:  # a broken indptr or a source position outside src_ids
            raise InputError(f"{self.name}: read_self_and_mean: {exc}") from None
        return torch.from_numpy(out)

    def _check_mean_input(self, what: str) -> None:
        if self._cache is not None:
            raise InputError(f"{self.name}: {what} reads rows where they are; this tensor reads through a cache")
        if self.dtype != torch.float32 or len(self.shape) != 2:
            raise InputError(f"{self.name}: {what} needs a float32 (N, F) tensor, got {self.dtype}{self.shape}")

    def self_and_mean(self, dst_ids: Any, indptr: Any, src_ids: Any) -> torch.Tensor:
        """``(M, 2F)`` float32 rows ``[self[dst_ids[d]] | mean of self[src_ids[indptr[d]:indptr[d + 1]]]]`` (a
        zero mean where ``d`` has no neighbours), computed where the rows are.

        The input of a mean-aggregating first layer (:class:`distgnn.sampling.block.SelfAndMean`): instead of
        pulling every neighbour's row and averaging on the trainer, each owner sums the rows it holds per
        destination (``neighbor_sum``), this machine's from shared memory, and only ``M`` sums per owner travel.
        A 1M-node GraphSAGE batch needs 56k destinations' rows and sums, not 473k sources' rows.

        Args:
            dst_ids: ``(M,)`` int ids of the destinations (any order).
            indptr: ``(M + 1,)`` int64 CSR over ``src_ids`` (rising from 0 to ``len(src_ids)``).
            src_ids: ``(E,)`` int ids of each destination's neighbours (repeats allowed).
        """
        self._check_mean_input("self_and_mean")
        dst_ids = as_ids(dst_ids, self.shape[0], f"{self.name} destinations")
        src_ids = as_ids(src_ids, self.shape[0], f"{self.name} neighbours")
        indptr = np.ascontiguousarray(np.asarray(indptr), dtype=np.int64)
        num_dst, width = len(dst_ids), self.shape[1]
        if (
            indptr.shape != (num_dst + 1,)
            or indptr[0] != 0
            or indptr[-1] != len(src_ids)
            or (np.diff(indptr) < 0).any()
        ):
            raise InputError(
                f"{self.name}: self_and_mean needs an indptr of {num_dst + 1} entries rising from 0 to "
                f"{len(src_ids)}, got shape {indptr.shape}"
            )
        ctx, client = self.context, self.context.client
        groups = self._by_owner(src_ids)
        client.settle([self._push_tags[m] for m in groups])
        degrees = np.diff(indptr)
        dst_of_edge = np.repeat(np.arange(num_dst), degrees)
        fields = {"policy": self.part_policy, "name": self.name}
        chunk = max(1, PULL_CHUNK_BYTES // (4 * width))
        pending = []  # (destination slots, request id): the remote owners' sums, requested first
        for m, positions in groups.items():
            if m == ctx.machine_id:
                continue
            ids, slots, sub_indptr = _owner_csr(src_ids, dst_of_edge, positions, num_dst)
            for i, begin in enumerate(range(0, len(slots), chunk)):
                end = min(begin + chunk, len(slots))
                part = sub_indptr[begin : end + 1]
                request = [part - part[0], ids[part[0] : part[-1]]]
                server = (ctx.read_server(m) + i) % ctx.config.num_servers
                pending.append((slots[begin:end], client.send(m, "neighbor_sum", fields, request, server_id=server)))
        own_rows = self._read_started(dst_ids)  # the destinations' own rows: local copies, remote pulls in flight
        out = np.empty((num_dst, 2 * width), dtype=np.float32)
        local = groups.get(ctx.machine_id)
        if local is None:
            out[:, width:] = 0.0
        else:
            if isinstance(local, slice):
                ids, sub_indptr = src_ids - self._local_start, indptr
            else:
                ids, _, sub_indptr = _owner_csr(src_ids, dst_of_edge, local, num_dst, dense=True)
                ids = ids - self._local_start
            threads = torch.get_num_threads()
            extension().mean_aggregate(sub_indptr, ids, self._local, out, width, -1, threads, average=False)
        means = torch.from_numpy(out)[:, width:]  # a view: the remote sums are added in place
        replies = client.wait([rid for _, rid in pending])
        for (slots, _), reply in zip(pending, replies, strict=True):
            sums = reply.arrays[0]
            if sums.shape != (len(slots), width) or sums.dtype != np.float32:
                raise InputError(
                    f"{self.name}: neighbor_sum came back as {sums.dtype}{list(sums.shape)}, expected float32"
                    f"{[len(slots), width]}"
                )
            means.index_add_(0, torch.from_numpy(slots), torch.from_numpy(sums))
        out[:, :width] = own_rows.result().numpy()
        inverse = np.where(degrees > 0, 1.0 / np.maximum(degrees, 1), 0.0).astype(np.float32)
        out[:, width:] *= inverse[:, None]
        return torch.from_numpy(out)

    def __setitem__(self, ids: Any, rows: Any) -> None:
        self.push(ids, rows, mode="assign")

    def push(self, ids: Any, rows: Any, mode: str = "assign", wait: bool = True) -> None:
        """Write (``"assign"``) or accumulate (``"add"``) ``rows`` into rows ``ids`` on their owners.

        With repeated ids, ``"add"`` adds every row; ``"assign"`` keeps one of them. With ``wait=False`` the
        call returns once the requests are queued (see the module docstring for when they are settled); it
        may then send ``ids`` and ``rows`` without copying them, so do not modify them afterwards.
        """
        if mode not in ("assign", "add"):
            raise InputError(f"push mode must be 'assign' or 'add', got {mode!r}")
        if self._cache is not None:
            raise InputError(f"{self.name!r} is read through a cache of its rows; use_cache(None) before writing it")
        ids = as_ids(ids, self.shape[0], f"{self.name}")
        if ids.size == 0:
            return
        rows = torch.as_tensor(rows).detach().cpu().to(self.dtype).expand(len(ids), *self.shape[1:])
        self.send_rows("push", {"mode": mode}, ids, np.ascontiguousarray(rows.numpy()), wait)

    def send_rows(self, op: str, fields: dict[str, Any], ids: np.ndarray, rows: np.ndarray, wait: bool = True) -> None:
        """Send request ``op`` (a write: ``push``, ``adam_step``) with ``fields`` to the main server of every
        owner of ``ids`` (checked int64 ids, ``(n,)``) with its ids and their ``rows`` (``(n, ...)``); ``wait``
        as in ``push``."""
        client = self.context.client
        fields = {**fields, "policy": self.part_policy, "name": self.name}
        if not wait:
            for m, pos in self._by_owner(ids).items():
                client.post(m, op, fields, [ids[pos], rows[pos]], tag=self._push_tags[m])
            return
        client.wait([client.send(m, op, fields, [ids[pos], rows[pos]]) for m, pos in self._by_owner(ids).items()])

    def flush(self) -> None:
        """Wait until this thread's pushes made with ``wait=False`` are applied; raises the first that failed."""
        self.context.client.settle(self._push_tags)


class PendingRead:
    """A :meth:`DistTensor.read_async` under way: the local rows are in place, the remote ones in flight."""

    def __init__(self, tensor: DistTensor, out: np.ndarray | torch.Tensor, pending: list) -> None:
        self._tensor, self._out, self._pending = tensor, out, pending

    def result(self) -> torch.Tensor:
        """Waits for the pulls and returns the rows (a CPU tensor); call once."""
        out = self._out
        if isinstance(out, torch.Tensor):
            return out
        tensor = self._tensor
        replies = tensor.context.client.wait([rid for _, rid in self._pending])
        for (part, _), reply in zip(self._pending, replies, strict=True):
            rows = reply.arrays[0]
            expected = (*out[part].shape,) if isinstance(part, slice) else (len(part), *tensor.shape[1:])
            if rows.shape != expected or rows.dtype != tensor._np_dtype:
                raise InputError(
                    f"{tensor.name}: a pull came back as {rows.dtype}{list(rows.shape)}, "
                    f"expected {tensor._np_dtype}{list(expected)}"
                )
            if isinstance(part, slice):
                out[part] = rows
            else:
                copy_rows(np.ascontiguousarray(rows), None, out, part)
        return torch.from_numpy(out)
