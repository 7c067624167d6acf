"""Temporal neighbour sampling: for (node, time) roots, neighbours from events strictly before that time.

:class:`TemporalSampler` is the one dispatch point: it picks the C++ kernel (``distgnn._cpu_kernels``,
threads over roots) or the CUDA kernel (``csrc/cuda/temporal_sample.cu``) once, at construction, from the
device; the CSR is moved to that device once. :mod:`distgnn.temporal.reference` holds the numpy reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from distgnn.errors import ConfigError
from distgnn.native.cpu import extension
from distgnn.temporal.graph import TemporalCSR
from distgnn.temporal.shared import host_tensor

STRATEGIES = ("recent", "uniform")


@dataclass
class TemporalHop:
    """One hop of a temporal sample: row r belongs to root r of the hop (the previous hop's flattened picks).

    Attributes:
        neighbors: int64 [R, k], -1 in unused slots.
        times: float64 [R, k], each pick's event time (0 in unused slots).
        eids: int64 [R, k], each pick's event id (-1 in unused slots).
        mask: bool [R, k], True where a slot holds a pick.
    """

    neighbors: torch.Tensor
    times: torch.Tensor
    eids: torch.Tensor
    mask: torch.Tensor


class TemporalSampler:
    """Samples ``k`` neighbours per root, ``hops`` times, never at or after the root's time.

    Args:
        csr: the time-sorted CSR (:func:`~distgnn.temporal.graph.build_temporal_csr`).
        k: picks per root.
        hops: 1 or 2; hop 2's roots are hop 1's picks at their event times.
        strategy: ``"recent"`` (the k most recent, oldest first) or ``"uniform"`` (k distinct uniform picks,
            in CSR order).
        device: where the kernel runs and the outputs live (``cpu`` or ``cuda[:i]``).
        num_threads: CPU threads (None: ``torch.get_num_threads()``).
        seed: base seed of the uniform picks; call ``i`` of the sampler uses ``seed + i``.
    """

    def __init__(
        self,
        csr: TemporalCSR,
        k: int,
        hops: int = 1,
        strategy: str = "recent",
        device: torch.device | str = "cpu",
        num_threads: int | None = None,
        seed: int = 0,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ConfigError(f"temporal sampling strategy must be one of {STRATEGIES}, got {strategy!r}")
        if hops not in (1, 2) or k < 1:
            raise ConfigError(f"temporal sampling takes hops 1 or 2 and k >= 1, got hops={hops}, k={k}")
        self.k, self.hops, self.uniform = k, hops, strategy == "uniform"
        self.device = torch.device(device)
        self.num_threads = num_threads
        self._calls = 0
        self._seed = seed
        if self.device.type == "cuda":
            from distgnn.native.cuda import temporal_kernels

            self._kernel = temporal_kernels().temporal_sample
            # The CSR may be a read-only shared-memory view: copied to the GPU without torch's warning about it.
            self._csr = tuple(host_tensor(a).to(self.device) for a in (csr.indptr, csr.neighbors, csr.times, csr.eids))
            self._run = self._run_cuda
        else:
            self._kernel = extension().temporal_sample
            self._csr = (csr.indptr, csr.neighbors, csr.times, csr.eids)
            self._run = self._run_cpu

    def sample(self, roots: torch.Tensor, root_times: torch.Tensor) -> list[TemporalHop]:
        """``hops`` hops for roots ``roots`` (int64 [R]) at ``root_times`` (float64 [R]).

        Raises:
            ValueError: a root is outside ``[0, num_nodes)``.
        """
        seed = self._seed + self._calls
        self._calls += 1
        out = []
        for _ in range(self.hops):
            hop = self._run(roots, root_times, seed)
            out.append(hop)
            # Unused slots become roots that see nothing: node 0 before any time.
            roots = torch.where(hop.mask, hop.neighbors, 0).flatten()
            root_times = torch.where(hop.mask, hop.times, -torch.inf).flatten()
            seed += 1 << 32
        return out

    def sample_valid(self, roots: torch.Tensor, root_times: torch.Tensor) -> TemporalHop:
        """One hop of the ``"recent"`` strategy for roots known to be node ids in range (a batch's endpoints and
        negatives): no host sync for the range check and no per-call seed, so a CUDA graph can capture it.

        Raises:
            ConfigError: the sampler is uniform or has two hops.
        """
        if self.uniform or self.hops != 1:
            raise ConfigError("sample_valid takes one hop of the 'recent' strategy (uniform picks change per call)")
        if self.device.type == "cuda":
            roots = roots.to(self.device, torch.int64).contiguous()
            root_times = root_times.to(self.device, torch.float64).contiguous()
            neighbors, times, eids, _, _ = self._kernel(*self._csr, roots, root_times, self.k, False, 0)
            return TemporalHop(neighbors, times, eids, neighbors >= 0)
        return self._run_cpu(roots, root_times, 0)

    def _run_cpu(self, roots: torch.Tensor, root_times: torch.Tensor, seed: int) -> TemporalHop:
        threads = self.num_threads or torch.get_num_threads()
        neighbors, times, eids, counts = self._kernel(
            *self._csr,
            np.ascontiguousarray(roots.numpy(), dtype=np.int64),
            np.ascontiguousarray(root_times.numpy(), dtype=np.float64),
            self.k,
            self.uniform,
            seed % 2**64,
            threads,
        )
        neighbors = torch.from_numpy(neighbors)
        return TemporalHop(neighbors, torch.from_numpy(times), torch.from_numpy(eids), neighbors >= 0)

    def _run_cuda(self, roots: torch.Tensor, root_times: torch.Tensor, seed: int) -> TemporalHop:
        roots = roots.to(self.device, torch.int64).contiguous()
        root_times = root_times.to(self.device, torch.float64).contiguous()
        neighbors, times, eids, _, first_bad = self._kernel(
            *self._csr, roots, root_times, self.k, self.uniform, seed % 2**63
        )
        bad = int(first_bad.item())
        if bad < len(roots):
            raise ValueError(
                f"root {bad} is node {int(roots[bad])}, outside [0, {self._csr[0].shape[0] - 1}) (or the CSR is corrupt)"
            )
        return TemporalHop(neighbors, times, eids, neighbors >= 0)
