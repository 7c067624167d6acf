"""Collectives the job's pieces share, over torch.distributed: arrays whose first dimension differs between
ranks (the counts go first, then one padded exchange), and small JSON-able objects (JSON bytes in a uint8
tensor, no pickle).

Each helper is collective over ``group`` (the default group if None): every member calls it, in the same
order. Outside a process group (a single process) each is the identity. Tensors travel on the device the
group's backend carries (:func:`collective_device`: the current GPU under NCCL, else the CPU) and come back
where they were.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from distgnn.errors import InputError

ArrayT = TypeVar("ArrayT", np.ndarray, torch.Tensor)


def in_process_group() -> bool:
    return dist.is_available() and dist.is_initialized()


def world() -> tuple[int, int]:
    """``(rank, world size)`` of the default group; ``(0, 1)`` outside one."""
    if in_process_group():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def collective_device(group=None) -> torch.device:
    """Where ``group``'s backend takes tensors: the current CUDA device under NCCL, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_arrays(array: ArrayT, group=None, counts: Sequence[int] | None = None) -> list[ArrayT]:
    """Every member's ``array`` on every member, in group rank order.

    Args:
        array: a numpy array or a tensor, ``(n_r, ...)``: the first dimension may differ between members, the
            other dimensions and the dtype may not.
        group: the process group (the default group if None).
        counts: every member's ``n_r``, where the caller knows them (then they are not exchanged).

    Returns:
        One array per member, of ``array``'s kind (numpy, or tensors on ``array``'s device).

    Raises:
        InputError: the members' arrays differ beyond their first dimension.
    """
    if not in_process_group():
        return [array]
    tensor = _as_tensor(array)
    device = collective_device(group)
    if counts is None:
        counts = _exchange_counts(tensor, group, device, "all_gather_arrays")
    padded = _padded(tensor.to(device), max(counts))
    parts = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(parts, padded, group=group)
    return [_like(array, part[:count]) for part, count in zip(parts, counts, strict=True)]


def gather_arrays(tensor: torch.Tensor, dst: int, group=None) -> list[torch.Tensor] | None:
    """Every member's ``tensor`` ``(n_r, ...)`` (as :func:`all_gather_arrays`) on global rank ``dst`` alone, in
    group order; None on the other members."""
    if not in_process_group():
        return [tensor]
    device = collective_device(group)
    counts = _exchange_counts(tensor, group, device, "gather_arrays")
    padded = _padded(tensor.to(device), max(counts))
    parts = [torch.empty_like(padded) for _ in counts] if dist.get_rank() == dst else None
    dist.gather(padded, parts, dst=dst, group=group)
    if parts is None:
        return None
    return [part[:count].to(tensor.device) for part, count in zip(parts, counts, strict=True)]


def scatter_arrays(tensors: Sequence[torch.Tensor] | None, like: torch.Tensor, src: int, group=None) -> torch.Tensor:
    """Global rank ``src``'s ``tensors[r]`` on member ``r`` of ``group``; ``like`` is this member's share's
    shape and dtype (its first dimension, the row count, may differ between members). ``tensors``: one per
    member, on ``src`` only (None elsewhere)."""
    if not in_process_group():
        return tensors[0]
    device = collective_device(group)
    counts = _exchange_counts(like, group, device, "scatter_arrays")
    out = _padded(like.new_empty((0, *like.shape[1:])).to(device), max(counts))
    padded = None
    if dist.get_rank() == src:
        padded = [_padded(t.to(device=device, dtype=like.dtype), max(counts)) for t in tensors]
    dist.scatter(out, padded, src=src, group=group)
    return out[: like.shape[0]].to(like.device)


def broadcast_object(obj: Any, src: int = 0, group=None) -> Any:
    """``src``'s JSON-able ``obj`` on every member (the others pass anything, e.g. None). Always as JSON reads it
    back (tuples come as lists), also in a single process."""
    if not in_process_group():
        return json.loads(json.dumps(obj))
    device = collective_device(group)
    data = json.dumps(obj).encode() if dist.get_rank() == src else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, src, group=group)
    buf = torch.zeros(int(size.item()), dtype=torch.uint8, device=device)
    if dist.get_rank() == src:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(buf, src, group=group)
    return json.loads(bytes(buf.cpu().numpy()))


def all_gather_objects(obj: Any, group=None) -> list[Any]:
    """Every member's JSON-able ``obj``, in group order, on every member."""
    data = np.frombuffer(bytearray(json.dumps(obj).encode()), dtype=np.uint8)
    return [json.loads(part.tobytes()) for part in all_gather_arrays(data, group)]


def broadcast_tensors(tensors: Sequence[torch.Tensor], src: int = 0, group=None) -> None:
    """Overwrites ``tensors`` on every rank of ``group`` with rank ``src``'s values: one broadcast per
    (dtype, device), the tensors flattened into one buffer for it. Collective; every rank passes tensors of
    the same shapes, dtypes and devices in the same order."""
    by_kind: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in tensors:
        by_kind.setdefault((t.dtype, t.device), []).append(t)
    with torch.no_grad():
        for group_tensors in by_kind.values():
            flat = torch.cat([t.detach().reshape(-1) for t in group_tensors])
            dist.broadcast(flat, src, group=group)
            offset = 0
            for t in group_tensors:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()


def _exchange_counts(tensor: torch.Tensor, group, device: torch.device, what: str) -> list[int]:
    """Every member's row count, after checking that the rows have one shape."""
    if tensor.dim() == 0:
        raise InputError(f"{what} takes arrays of rows, got a 0-d array")
    mine = torch.tensor([tensor.shape[0], tensor.dim(), math.prod(tensor.shape[1:])], dtype=torch.int64, device=device)
    headers = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(headers, mine, group=group)
    headers = [h.tolist() for h in headers]
    if len({tuple(h[1:]) for h in headers}) != 1:
        raise InputError(
            f"{what}: every member must send rows of one shape (ndim, row size): got {[tuple(h[1:]) for h in headers]}"
        )
    return [h[0] for h in headers]


def _padded(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """``tensor`` with zero rows after it up to ``rows``."""
    out = tensor.new_zeros((rows, *tensor.shape[1:]))
    out[: tensor.shape[0]] = tensor
    return out


def _as_tensor(array: np.ndarray | torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)) if isinstance(array, np.ndarray) else array


def _like(array: ArrayT, tensor: torch.Tensor) -> ArrayT:
    if isinstance(array, np.ndarray):
        return tensor.cpu().numpy()
    return tensor.to(array.device)
