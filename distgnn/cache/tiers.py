"""The host-side tiers a gather reads from: the local partition's rows and the staging rows of remote fetches.

On a GPU both must be device-readable host memory: pinned tensors, or memory registered with
:class:`distgnn.cache.HostRegistration` (for instance the partition's ``/dev/shm`` mapping).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distgnn.errors import InputError

FEATURE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_rows(rows: torch.Tensor, what: str) -> None:
    """Raises InputError unless ``rows`` is a 2-D feature matrix with contiguous rows of a supported dtype."""
    if not isinstance(rows, torch.Tensor) or rows.dim() != 2:
        raise InputError(f"{what} must be a 2-D tensor (rows, width), got {getattr(rows, 'shape', type(rows))}")
    if rows.dtype not in FEATURE_DTYPES:
        raise InputError(f"{what} must be float32, float16 or bfloat16, got {rows.dtype}")
    if rows.numel() > 0 and not rows.is_contiguous():
        raise InputError(f"{what} must be contiguous (call .contiguous() once when building the tier)")


@dataclass(frozen=True)
class HostTier:
    """Rows of the contiguous global id range ``[start, start + len(rows))`` (the local partition's owned nodes).

    Attributes:
        rows: ``(num_owned, F)`` feature rows in host memory (pinned or registered for a GPU gather).
        start: global id of ``rows[0]`` (``node_map[part][0]``).
    """

    rows: torch.Tensor
    start: int

    def __post_init__(self) -> None:
        check_rows(self.rows, "host rows")
        if self.start < 0:
            raise InputError(f"host tier start must be >= 0, got {self.start}")

    @property
    def end(self) -> int:
        return self.start + self.rows.shape[0]


@dataclass(frozen=True)
class StagingTier:
    """Rows fetched from remote servers: ``rows[k]`` holds the features of global id ``ids[k]``.

    Attributes:
        ids: ``(S,)`` int64 global ids, strictly increasing (as :func:`distgnn.cache.remote_misses` returns them).
        rows: ``(S, F)`` feature rows, pinned host memory for a GPU gather.
    """

    ids: torch.Tensor
    rows: torch.Tensor

    def __post_init__(self) -> None:
        check_rows(self.rows, "staging rows")
        if self.ids.dim() != 1 or self.ids.dtype != torch.int64:
            raise InputError(f"staging ids must be a 1-D int64 tensor, got {self.ids.dtype} {tuple(self.ids.shape)}")
        if self.ids.shape[0] != self.rows.shape[0]:
            raise InputError(f"staging has {self.ids.shape[0]} ids but {self.rows.shape[0]} rows; they must match")
        if self.ids.numel() and int(self.ids[0]) < 0:
            raise InputError(f"staging ids must be >= 0, got {int(self.ids[0])}")
        if self.ids.numel() > 1 and not bool((self.ids[1:] > self.ids[:-1]).all()):
            raise InputError("staging ids must be strictly increasing (sorted, no repeats)")
