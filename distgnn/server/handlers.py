"""The server's ops: validate one decoded request, act on the shared partition, build the reply.

Every handler takes ``(state, header, arrays)`` and returns ``(fields, arrays)``
for the reply, or raises ``InputError``/``ProtocolError`` naming what was
wrong; the server loop turns that into ``{ok: false, error}``. Ids are global
and must be owned by this partition; nothing a client sends can index outside
a tensor. ``barrier`` is not here: its reply is deferred, so the loop owns it.

Requests (header fields; arrays) -> reply arrays:

* ``meta`` () -> header ``machine_id, server_id, num_nodes, num_edges, node_range, edge_range``
* ``pull`` (``policy, name``; ids int64) -> rows
* ``neighbor_sum`` (``policy, name`` of a float32 ``(N, F)`` table; indptr int64 ``(S + 1,)``, ids int64) ->
  ``(S, F)`` float32 sums, row ``s`` the sum of the rows ``ids[indptr[s]:indptr[s + 1]]`` (a mean-aggregating
  first layer's partial sums over the neighbours this partition holds: ``DistTensor.self_and_mean``)
* ``push`` (``policy, name, mode`` "assign"|"add"; ids int64, rows of the tensor's dtype) -> (); main server only
* ``adam_step`` (``policy, name`` of a float32 ``(N, D)`` table, ``state`` its ``(N, 2D + 1)`` float32
  ``[m | v | t]`` rows, ``lr, beta1, beta2, eps``; unique ids int64, summed gradient rows float32 ``(n, D)``)
  -> (); main server only: one sparse Adam step of those rows, state and weights (``distgnn.client.embedding``)
* ``init_data`` (``policy, name, dtype, shape, init, low, high, seed``) -> (); main server only, idempotent
* ``sample`` (``fanout, replace, seed, prob`` edge tensor name or None, ``edge_dir`` "in"; seeds int64)
  -> counts int64, neighbour global ids int64, global edge ids int64. On a typed partition the request
  samples items instead: ``fanouts`` (one per edge type) and arrays seeds int64, edge type per seed int64;
  each (seed, edge type) item is a row of the typed CSC, all sampled in one kernel call.
* ``degrees`` (``etype`` id or None; ids int64) -> in-degrees int64 (of that edge type only, when given)
* ``find_edges`` (edge ids int64, owned by this partition) -> source global ids int64, destination global ids
  int64, any edge type (each id's CSC position: ``id - edge start`` with one edge type, else a lookup table
  built at the first request)
* ``barrier`` (``name, parties``) -> () once ``parties`` requests of that name arrived
* ``shutdown`` () -> (); the server then exits
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import distgnn.rpc.wire as wire
from distgnn.config import JobConfig
from distgnn.errors import InputError, ProtocolError
from distgnn.native.cpu import extension
from distgnn.server.optim import adam_rows
from distgnn.server.sampling import sample_neighbors
from distgnn.server.store import create_tensor
from distgnn.store import shm

MAX_FANOUT = 100_000
MAX_SAMPLED_EDGES = 200_000_000

_MISSING = object()


@dataclass
class ServerState:
    """What the handlers work on: the job, this server's partition, and the stop flag."""

    config: JobConfig
    partition: shm.SharedPartition
    stopping: bool = False
    # CSC position of each owned edge id (id - edge start), built at the first find_edges of a partition whose
    # eids are not in id order (typed partitions: CSC order is destination, type, id); None until then.
    edge_positions: np.ndarray | None = None

    def positions_of_edges(self, offsets: np.ndarray) -> np.ndarray:
        """CSC positions of owned edges given as ``id - edge start``."""
        eids = self.partition.graph["eids"]
        if self.edge_positions is None:
            start = self.partition.edge_range[0]
            if len(eids) == 0 or (
                eids[0] == start and eids[-1] == start + len(eids) - 1 and (np.diff(eids) == 1).all()
            ):
                self.edge_positions = np.zeros(0, np.int64)  # the identity: ids in CSC order
            else:
                self.edge_positions = np.empty(len(eids), np.int64)
                self.edge_positions[eids - start] = np.arange(len(eids), dtype=np.int64)
        return offsets if len(self.edge_positions) == 0 else self.edge_positions[offsets]

    @property
    def is_main(self) -> bool:
        return self.config.server_id == 0


Reply = tuple[dict[str, Any], list[np.ndarray]]


def header_field(header: dict, key: str, kind: type | tuple[type, ...], default: Any = _MISSING) -> Any:
    value = header.get(key, default)
    if value is _MISSING:
        raise ProtocolError(f"request field {key!r} is missing")
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int subclass in Python; a flag must not pass as a count or the other way round.
    if value is not default and type(value) not in kinds and not (float in kinds and type(value) is int):
        names = "/".join(k.__name__ for k in kinds)
        raise ProtocolError(f"request field {key!r} must be {names}, got {type(value).__name__}")
    return value


def check_arrays(arrays: list[np.ndarray], count: int, op: str) -> None:
    if len(arrays) != count:
        raise ProtocolError(f"'{op}' takes {count} arrays, got {len(arrays)}")


def _local_ids(ids: np.ndarray, owned: tuple[int, int], what: str) -> np.ndarray:
    if ids.ndim != 1 or ids.dtype != np.int64:
        raise ProtocolError(f"{what} must be a 1-d int64 array, got {ids.dtype}{list(ids.shape)}")
    start, end = owned
    if ids.size and (ids.min() < start or ids.max() >= end):
        bad = ids[(ids < start) | (ids >= end)][0]
        raise InputError(f"{what}: id {int(bad)} is not owned by this partition (owns [{start}, {end}))")
    return ids - start


def named_tensor(state: ServerState, header: dict) -> tuple[str, str, np.ndarray]:
    policy = header_field(header, "policy", str)
    name = shm.check_name(header_field(header, "name", str))
    table = state.partition.tensor(policy, name)  # refuses an unknown policy
    if table is None:
        raise InputError(f"no {policy} tensor named {name!r} on partition {state.partition.part_id}")
    return policy, name, table


def require_main(state: ServerState, op: str) -> None:
    if not state.is_main:
        raise InputError(
            f"'{op}' must go to the main server (server 0) of machine {state.config.machine_id}, "
            f"this is server {state.config.server_id}: one writer per partition"
        )


def handle_meta(state: ServerState, header: dict, arrays: list[np.ndarray]) -> Reply:
    check_arrays(arrays, 0, "meta")
    part = state.partition
    return {
        "machine_id": state.config.machine_id,
        "server_id": state.config.server_id,
        "num_nodes": part.num_nodes,
        "num_edges": part.num_edges,
        "node_range": list(part.node_range),
        "edge_range": list(part.edge_range),
        "ranges": {policy: list(r) for policy, r in part.ranges.items()},
    }, []


def handle_pull(state: ServerState, header: dict, arrays: list[np.ndarray]) -> Reply:
    check_arrays(arrays, 1, "pull")
    policy, name, table = named_tensor(state, header)
    local = _local_ids(arrays[0], state.partition.owned_range(policy), "pull ids")
    reply_bytes = len(local) * table.itemsize * math.prod(table.shape[1:])
    if reply_bytes > wire.MAX_MESSAGE_BYTES:
        raise InputError(
            f"pulling {len(local)} rows of {policy} tensor {name!r} makes a {reply_bytes}-byte reply; "
            f"the limit is {wire.MAX_MESSAGE_BYTES}: split the request"
        )
    return {}, [np.take(table, local, axis=0)]


def handle_neighbor_sum(state: ServerState, header: dict, arrays: list[np.ndarray]) -> Reply:
    check_arrays(arrays, 2, "neighbor_sum")
    policy, name, table = named_tensor(state, header)
    if table.dtype != np.float32 or table.ndim != 2:
        raise InputError(
            f"neighbor_sum needs a float32 (N, F) tensor; {policy} tensor {name!r} is {table.dtype}{list(table.shape)}"
        )
    indptr = arrays[0]
    local = _local_ids(arrays[1], state.partition.owned_range(policy), "neighbor_sum ids")
    if indptr.ndim != 1 or indptr.dtype != np.int64 or len(indptr) < 1:
        raise ProtocolError(
            f"neighbor_sum indptr must be a 1-d int64 array of >= 1 entries, got {indptr.dtype}{list(indptr.shape)}"
        )
    if indptr[0] != 0 or indptr[-1] != len(local) or (np.diff(indptr) < 0).any():
        raise ProtocolError(f"neighbor_sum indptr must rise from 0 to the {len(local)} ids")
    reply_bytes = (len(indptr) - 1) * table.shape[1] * table.itemsize
    if reply_bytes > wire.MAX_MESSAGE_BYTES:
        raise InputError(f"neighbor_sum of {len(indptr) - 1} rows makes a {reply_bytes}-byte reply; split the request")
    sums = np.empty((len(indptr) - 1, table.shape[1]), dtype=np.float32)
    extension().mean_aggregate(indptr, local, table, sums, 0, -1, 1, average=False)
    return {}, [sums]


def handle_push(state: ServerState, header: dict, arrays: list[np.ndarray]) -> Reply:
    require_main(state, "push")
    check_arrays(arrays, 2, "push")
    mode = header_field(header, "mode", str)
    if mode not in ("assign", "add"):
        raise ProtocolError(f"push mode must be 'assign' or 'add', got {mode!r}")
    policy, name, table = named_tensor(state, header)
    local = _local_ids(arrays[0], state.partition.owned_range(policy), "push ids")
    rows = arrays[1]
    if rows.dtype != table.dtype or rows.shape != (len(local), *table.shape[1:]):
        raise ProtocolError(
            f"push rows for {policy} tensor {name!r} must be {table.dtype}{[len(local), *table.shape[1:]]}, "
            f"got {rows.dtype}{list(rows.shape)}"
        )
    if mode == "assign":
        table[local] = rows
    elif len(np.unique(local)) == len(local):
        table[local] += rows
    else:
        np.add.at(table, local, rows)
    return {}, []


def handle_adam_step(state: ServerState, header: dict, arrays: list[np.ndarray]) -> Reply:
    require_main(state, "adam_step")
    check_arrays(arrays, 2, "adam_step")
    policy, name, weight = named_tensor(state, header)
    moments = named_tensor(state, {"policy": policy, "name": header_field(header, "state", str)})[2]
    lr, beta1, beta2, eps = (float(header_field(header, key, float)) for key in ("lr", "beta1", "beta2", "eps"))
    if not (lr > 0 and 0 <= beta1 < 1 and 0 <= beta2 < 1 and eps > 0 and math.isfinite(lr + eps)):
        raise InputError(f"adam_step needs lr > 0, betas in [0, 1), eps > 0; got {lr}, {beta1}, {beta2}, {eps}")
    if weight.dtype != np.float32 or weight.ndim != 2:
        raise InputError(f"adam_step updates a 2-d float32 table; {name!r} is {weight.dtype}{list(weight.shape)}")
    dim = weight.shape[1]
    if moments.dtype != np.float32 or moments.shape[1:] != (2 * dim + 1,):
        raise InputError(
            f"adam_step state must be float32 rows of {2 * dim + 1} ([m | v | t] of {name!r}), "
            f"got {moments.dtype}{list(moments.shape)}"
        )
    local = _local_ids(arrays[0], state.partition.owned_range(policy), "adam_step ids")
    grad = arrays[1]
    if grad.dtype != np.float32 or grad.shape != (len(local), dim):
        raise ProtocolError(
            f"adam_step gradient must be float32{[len(local), dim]}, got {grad.dtype}{list(grad.shape)}"
        )
    adam_rows(weight, moments, local, grad, lr, beta1, beta2, eps)
    return {}, []


def handle_init_data(state: ServerState, header: dict, arrays: list[np.ndarray]) -> Reply:
    require_main(state, "init_data")
    check_arrays(arrays, 0, "init_data")
    policy = header_field(header, "policy", str)
    name = shm.check_name(header_field(header, "name", str))
    dtype = header_field(header, "dtype", str)
    if dtype not in wire.DTYPES:
        raise ProtocolError(f"dtype {dtype!r} not allowed (allowed: {sorted(wire.DTYPES)})")
    shape = header_field(header, "shape", list)
    if not 1 <= len(shape) <= wire.MAX_NDIM or not all(type(d) is int and 0 <= d < 2**40 for d in shape):
        raise ProtocolError(f"shape must be 1 to {wire.MAX_NDIM} non-negative ints, got {shape!r}")
    row_bytes = math.prod(shape[1:]) * np.dtype(dtype).itemsize
    if row_bytes > wire.MAX_MESSAGE_BYTES:
        raise InputError(
            f"a row of tensor {name!r} ({shape} {dtype}) is {row_bytes} bytes, more than one message carries "
            f"({wire.MAX_MESSAGE_BYTES}); use narrower rows"
        )
    start, end = state.partition.owned_range(policy)
    need = row_bytes * (end - start)
    stat = os.statvfs(shm.SHM_DIR)
    if need > stat.f_bavail * stat.f_frsize:
        raise InputError(
            f"tensor {name!r} of shape {shape} {dtype} needs {need} bytes of shared memory on partition "
            f"{state.partition.part_id}; {stat.f_bavail * stat.f_frsize} are free"
        )
    create_tensor(
        state.partition,
        policy,
        name,
        dtype,
        tuple(shape),
        header_field(header, "init", str, "zeros"),
        float(header_field(header, "low", float, 0.0)),
        float(header_field(header, "high", float, 1.0)),
        header_field(header, "seed", int, 0),
    )
    return {}, []


def _typed_rows(state: ServerState, header: dict, arrays: list[np.ndarray], local: np.ndarray):
    """``(CSC rows, per-row fanouts)`` of a typed ``sample`` request's items."""
    num_etypes = state.partition.num_etypes
    fanouts = header_field(header, "fanouts", list)
    if len(fanouts) != num_etypes or not all(type(f) is int and -1 <= f <= MAX_FANOUT for f in fanouts):
        raise InputError(
            f"fanouts must list {num_etypes} ints in [-1, {MAX_FANOUT}] (one per edge type), got {fanouts!r}"
        )
    etypes = arrays[1]
    if etypes.dtype != np.int64 or etypes.shape != local.shape:
        raise ProtocolError(f"sample edge types must be int64 [{len(local)}], got {etypes.dtype}{list(etypes.shape)}")
    if etypes.size and (etypes.min() < 0 or etypes.max() >= num_etypes):
        raise InputError(f"sample edge type ids must be in [0, {num_etypes})")
    return local * num_etypes + etypes, np.asarray(fanouts, dtype=np.int64)[etypes]


def handle_sample(state: ServerState, header: dict, arrays: list[np.ndarray]) -> Reply:
    typed = "fanouts" in header
    check_arrays(arrays, 2 if typed else 1, "sample")
    fanout = -2 if typed else header_field(header, "fanout", int)
    replace = header_field(header, "replace", bool, False)
    seed = header_field(header, "seed", int, 0)
    edge_dir = header_field(header, "edge_dir", str, "in")
    prob_name = header_field(header, "prob", (str, type(None)), None)
    if edge_dir != "in":
        raise InputError(f"only edge_dir='in' is supported (partitions store in-edges), got {edge_dir!r}")
    if not typed and not -1 <= fanout <= MAX_FANOUT:
        raise InputError(f"fanout must be -1 (all) or in [0, {MAX_FANOUT}], got {fanout}")
    if not 0 <= seed < 2**63:
        raise InputError(f"seed must be in [0, 2**63), got {seed}")
    part = state.partition
    seeds = _local_ids(arrays[0], part.node_range, "sample seeds")
    if typed:
        if prob_name is not None:
            raise InputError("weighted sampling (prob) is not supported on heterogeneous graphs")
        seeds, fanout = _typed_rows(state, header, arrays, seeds)
    elif part.num_etypes != 1:
        raise InputError(f"this partition has {part.num_etypes} edge types: send 'fanouts' and an edge type per seed")
    indptr = part.graph["indptr"]
    degrees = indptr[seeds + 1] - indptr[seeds]
    fanouts = np.broadcast_to(np.asarray(fanout, dtype=np.int64), degrees.shape)
    if replace:
        most = int(np.where(fanouts < 0, degrees, fanouts).sum())
    else:
        most = int(np.where(fanouts < 0, degrees, np.minimum(degrees, fanouts)).sum())
    if most > MAX_SAMPLED_EDGES:
        raise InputError(f"this request may sample {most} edges, more than {MAX_SAMPLED_EDGES}: split the seeds")
    prob = None
    if prob_name is not None:
        prob = part.tensor("edge", shm.check_name(prob_name))
        if prob is None:
            raise InputError(f"no edge tensor named {prob_name!r} to use as sampling probability")
        if prob.dtype != np.float32 or prob.ndim != 1:
            # The kernel reads float32; converting here would copy every edge weight on every request.
            raise InputError(
                f"prob tensor {prob_name!r} must be 1-d float32 (one weight per edge), got "
                f"{prob.dtype}{list(prob.shape)}; store sampling weights as float32"
            )
    return {}, list(sample_neighbors(part.graph, seeds, fanout, replace, prob, seed))


def handle_degrees(state: ServerState, header: dict, arrays: list[np.ndarray]) -> Reply:
    check_arrays(arrays, 1, "degrees")
    local = _local_ids(arrays[0], state.partition.node_range, "degree ids")
    indptr, k = state.partition.graph["indptr"], state.partition.num_etypes  # a node's edge types are adjacent rows
    etype = header_field(header, "etype", (int, type(None)), None)
    if etype is None:
        return {}, [(indptr[(local + 1) * k] - indptr[local * k]).astype(np.int64, copy=False)]
    if not 0 <= etype < k:
        raise InputError(f"degrees: edge type id {etype} is not in [0, {k})")
    return {}, [(indptr[local * k + etype + 1] - indptr[local * k + etype]).astype(np.int64, copy=False)]


def handle_find_edges(state: ServerState, header: dict, arrays: list[np.ndarray]) -> Reply:
    check_arrays(arrays, 1, "find_edges")
    part = state.partition
    graph = part.graph
    positions = state.positions_of_edges(_local_ids(arrays[0], part.edge_range, "find_edges ids"))
    # A CSC row is a node (times the edge-type count on a typed partition, its types' rows adjacent).
    rows = np.searchsorted(graph["indptr"], positions, side="right") - 1
    dst = rows // part.num_etypes + part.node_range[0]
    src = graph["local2global"][graph["indices"][positions]]
    return {}, [src.astype(np.int64, copy=False), dst.astype(np.int64, copy=False)]


def handle_shutdown(state: ServerState, header: dict, arrays: list[np.ndarray]) -> Reply:
    check_arrays(arrays, 0, "shutdown")
    state.stopping = True
    return {}, []


HANDLERS: dict[str, Callable[[ServerState, dict, list[np.ndarray]], Reply]] = {
    "meta": handle_meta,
    "pull": handle_pull,
    "neighbor_sum": handle_neighbor_sum,
    "push": handle_push,
    "adam_step": handle_adam_step,
    "init_data": handle_init_data,
    "sample": handle_sample,
    "degrees": handle_degrees,
    "find_edges": handle_find_edges,
    "shutdown": handle_shutdown,
}
