"""``CachedFeature``: a node feature ``DistTensor`` read through the tiered gather on the trainer's device.

``cf[ids]`` equals ``dist_tensor[ids]`` but lands on ``device`` and reads each row from the cheapest tier:
hot rows from the GPU cache, rows of this machine's partition zero-copy from the shared-memory mapping
(registered with ``cudaHostRegister`` on a GPU), and only the remaining remote rows are pulled over RPC into a
staging tier. One :func:`distgnn.cache.gather` call then fills the batch. On a CPU device (or without the CUDA
extension) the same code runs the torch reference path, with identical rows.
"""

from __future__ import annotations

import collections
import datetime
import warnings
from typing import TYPE_CHECKING, Any

import torch

from distgnn.cache.feature_cache import FeatureCache
from distgnn.cache.gather import cache_slots, gather, remote_misses
from distgnn.cache.host_memory import HostRegistration
from distgnn.cache.hot_set import Samples, access_frequency, choose_hot_set
from distgnn.cache.ipc import clique_over_processes
from distgnn.cache.tiers import FEATURE_DTYPES, HostTier, StagingTier
from distgnn.errors import ConfigError, InputError
from distgnn.native.cuda import gather_available

if TYPE_CHECKING:
    from distgnn.client.tensor import DistTensor

POLICIES = ("replicate", "clique")
# How long close() waits for the clique's other trainers (they read this process's shard until then).
CLOSE_BARRIER_TIMEOUT_S = 600.0


def _as_id_tensor(ids: Any, bound: int, what: str) -> torch.Tensor:
    """``ids`` as a 1-D int64 CPU tensor; InputError unless every id is in ``[0, bound)``."""
    ids = ids.detach().cpu() if isinstance(ids, torch.Tensor) else torch.as_tensor(ids)
    if ids.dim() != 1 or (
        ids.numel() and (ids.dtype.is_floating_point or ids.dtype in (torch.bool, torch.complex64, torch.complex128))
    ):
        raise InputError(f"{what} ids must be a 1-d integer tensor, got {ids.dtype}{list(ids.shape)}")
    ids = ids.to(torch.int64)
    if ids.numel():
        low, high = (int(v) for v in torch.aminmax(ids))
        if low < 0 or high >= bound:
            raise InputError(f"{what} id {low if low < 0 else high} out of range [0, {bound})")
    return ids


def _checked_ids(ids: torch.Tensor, what: str) -> torch.Tensor:
    """A device id tensor's shape and dtype checked (no values: that needs a sync), as int64."""
    if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
        raise InputError(f"{what} ids must be a 1-d integer tensor, got {ids.dtype}{list(ids.shape)}")
    return ids.to(torch.int64)


class CachedFeature:
    """Reads rows of a node ``DistTensor`` onto ``device`` through a hot-row cache.

    Args:
        tensor: a 2-D float32/float16/bfloat16 node tensor (for instance ``g.ndata["feat"]``).
        device: where ``__getitem__`` puts the rows (and the cache lives).
        budget_bytes: cache bytes on ``device``; 0 caches nothing (local and remote tiers only).
        hot_ids: ids to cache, hottest first (cut to the budget); None ranks the nodes by ``hot_samples``'
            access counts, then in-degree (the fallback, alone without ``hot_samples``).
        graph: the ``DistGraph`` whose in-degrees rank the nodes when ``hot_ids`` is None.
        policy: ``"replicate"`` (each trainer's GPU holds its own copy of the hot rows) or ``"clique"`` (the
            trainers of ``group``, one per GPU of one NVLink-connected machine, shard one cache of
            ``budget_bytes`` per GPU times the group size: GPU ``r`` holds the hot rows ``r, r + size, ...``
            and reads the others from its peers' memory through CUDA IPC). Clique construction and
            :meth:`close` are collective over ``group``.
        impl: passed to :func:`distgnn.cache.gather` (``"auto"``, ``"cuda"`` or ``"torch"``).
        group: the ``torch.distributed`` process group of the clique (policy ``"clique"``); a gloo group is
            best (handles travel as CPU tensors, and :meth:`close` can wait with a deadline).
        cpu_share: passed to :func:`distgnn.cache.gather`: the fraction of this machine's uncached rows that
            CPU threads gather and DMA to the GPU beside the zero-copy reads.
        hot_samples: pre-sampled batches of this trainer's seeds (input-node id tensors, or a callable
            returning one per call, called ``num_samples`` times), see :func:`distgnn.cache.access_frequency`;
            with the clique policy the counts are summed over ``group`` (every member must pass samples), so
            the trainers agree on one hot set.

    ``tensor.use_cache(cf)`` makes plain ``tensor[ids]`` reads go through it (what the example trainer does on
    a GPU). Counters (since construction or :meth:`reset_stats`): ``lookups`` ids asked for, ``cache_hits``,
    ``local_rows`` read from this machine's partition, ``remote_rows`` ids answered by the staging tier and
    ``remote_fetched`` distinct rows pulled over RPC. Call :meth:`close` (or use ``with``) to unregister the
    host memory.
    """

    def __init__(
        self,
        tensor: DistTensor,
        device: torch.device | str,
        budget_bytes: int,
        *,
        hot_ids: torch.Tensor | None = None,
        graph: Any = None,
        policy: str = "replicate",
        impl: str = "auto",
        group: Any = None,
        cpu_share: float = 0.0,
        hot_samples: Samples | None = None,
        num_samples: int = 200,
    ) -> None:
        _check_options(tensor, policy, cpu_share, budget_bytes)
        self.tensor = tensor
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            # "cuda" names the current GPU; with its index, ids already there are recognised as such.
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.impl = impl
        self.policy = policy
        self.cpu_share = cpu_share
        self._group = group
        self._closed = False
        clique_size = self._clique_size() if policy == "clique" else 1
        num_nodes, width = tensor.shape
        row_bytes = width * tensor.dtype.itemsize

        with warnings.catch_warnings():  # the shared-memory rows are read-only; nothing here writes them
            warnings.simplefilter("ignore", UserWarning)
            local_rows = torch.from_numpy(tensor._local)
        self.host = HostTier(local_rows, tensor._local_start)
        self._in_flight: collections.deque = collections.deque()  # (event, staging tier) still being read
        self._registration: HostRegistration | None = None
        self._pin = self.device.type == "cuda" and gather_available() and impl != "torch"
        if self._pin:
            self._registration = HostRegistration(local_rows)

        self.cache: FeatureCache | None = None
        capacity = min(num_nodes, budget_bytes // row_bytes * clique_size)
        if capacity > 0:
            if hot_ids is None:
                hot_ids = self._hot_set(graph, capacity, row_bytes, hot_samples, num_samples)
            self.cache = self._fill(torch.as_tensor(hot_ids, dtype=torch.int64).cpu()[:capacity], clique_size)
        self.reset_stats()

    def _clique_size(self) -> int:
        import torch.distributed as dist

        if self.device.type != "cuda" or self.impl == "torch" or not gather_available():
            raise ConfigError(
                "the clique cache policy shares GPU memory through CUDA IPC: it needs a CUDA device and the "
                f"gather extension (device {self.device}, impl {self.impl!r}); use policy='replicate'"
            )
        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError("the clique cache policy needs torch.distributed initialised (its group of trainers)")
        return dist.get_world_size(self._group)

    def _hot_set(
        self, graph: Any, capacity: int, row_bytes: int, hot_samples: Samples | None, num_samples: int
    ) -> torch.Tensor:
        """The ``capacity`` rows to cache: by sampled access frequency where samples are given (one set for the
        whole clique), else by in-degree."""
        num_nodes = self.tensor.shape[0]
        if graph is None:
            raise ConfigError("CachedFeature needs hot_ids or a graph (to rank nodes by in-degree)")
        in_degree = graph.in_degrees(torch.arange(num_nodes))
        frequency = None
        if hot_samples is not None:
            frequency = access_frequency(hot_samples, num_nodes, num_samples).cpu()
            if self.policy == "clique":
                import torch.distributed as dist

                dist.all_reduce(frequency, group=self._group)
        return choose_hot_set(capacity * row_bytes, row_bytes, num_nodes, in_degree=in_degree, frequency=frequency)

    def _fill(self, hot_ids: torch.Tensor, clique_size: int) -> FeatureCache:
        num_nodes = self.tensor.shape[0]
        if self.policy == "clique":
            import torch.distributed as dist

            rank = dist.get_rank(self._group)
            return clique_over_processes(
                hot_ids, self.tensor.read, num_nodes, rank, clique_size, self.device, self._group
            )
        return FeatureCache.replicate(hot_ids, self.tensor.read(hot_ids), num_nodes, self.device)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.tensor.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.tensor.dtype

    def __len__(self) -> int:
        return self.tensor.shape[0]

    def __getitem__(self, ids: Any) -> torch.Tensor:
        """Rows ``ids`` (1-D integer ids, any order, repeats allowed, any device) as a ``(len(ids), F)`` tensor on the device.

        With a cache that holds every row and ids on the device, nothing waits for the GPU: an id out of range
        zero-fills its row and raises InputError at the next read (or at ``self.cache.check()``).
        """
        return self.fetch(ids)

    def fetch(self, ids: Any, out: torch.Tensor | None = None) -> torch.Tensor:
        """``self[ids]``, written into ``out`` when given (a contiguous ``(len(ids), F)`` tensor of this table's
        dtype on its device, such as the leading rows of a CUDA graph's input buffer) and returned.

        Raises:
            InputError: ``out`` has another shape, dtype or device.
        """
        on_device = isinstance(ids, torch.Tensor) and ids.is_cuda and ids.device == self.device
        if on_device and self.cache is not None and self.cache.covers_all and self.impl != "torch":
            # Every row is a hit: the gather's all-hit path checks the ids on the GPU, without a host sync.
            device_ids, misses, staged_ids = _checked_ids(ids, self.tensor.name), torch.empty(0, dtype=torch.int64), 0
        elif on_device:
            device_ids, misses, staged_ids = self._misses_on_device(ids)
        else:
            ids_cpu = _as_id_tensor(ids, len(self), self.tensor.name)
            misses = remote_misses(ids_cpu, cache=self.cache, host=self.host)
            device_ids = ids if isinstance(ids, torch.Tensor) and ids.device == self.device else ids_cpu.to(self.device)
            staged_ids = torch.isin(ids_cpu, misses).sum() if misses.numel() else 0
        staging = None
        if misses.numel():
            rows = self.tensor.read(misses)
            staging = StagingTier(misses, rows.pin_memory() if self._pin else rows)
        shape = (device_ids.shape[0], self.shape[1])
        if out is None:
            out = torch.empty(shape, dtype=self.dtype, device=self.device)
        elif (
            tuple(out.shape) != shape or out.dtype != self.dtype or out.device != self.device or not out.is_contiguous()
        ):
            raise InputError(
                f"out must be a contiguous {shape} {self.dtype} tensor on {self.device} for {shape[0]} ids, got "
                f"{tuple(out.shape)} {out.dtype} on {out.device}"
            )
        gather(
            out, device_ids, cache=self.cache, host=self.host, staging=staging, impl=self.impl, cpu_share=self.cpu_share
        )
        if staging is not None and self._pin:
            # The kernel reads the pinned rows zero-copy, after this returns: keep them alive (out of the
            # pinned allocator's reach) until the stream passes this point.
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(self.device))
            self._in_flight.append((done, staging))
        while self._in_flight and self._in_flight[0][0].query():
            self._in_flight.popleft()
        self.lookups += device_ids.shape[0]
        self.remote_fetched += misses.numel()
        self._remote_rows += staged_ids
        return out

    def _misses_on_device(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """For ids already on the cache's GPU (a GPU sampler's): the ids as int64, the sorted unique ids no tier
        holds (CPU, to fetch) and how many ids they account for; checked and looked up on the GPU with one
        host sync instead of a trip of every id through host memory."""
        ids = _checked_ids(ids, self.tensor.name)
        if ids.numel() == 0:
            return ids, torch.empty(0, dtype=torch.int64), 0
        missing = (ids < self.host.start) | (ids >= self.host.end)
        if self.cache is not None:
            missing &= cache_slots(self.cache, ids) < 0
        low, high = torch.aminmax(ids)
        low, high, count = torch.stack([low, high, missing.sum()]).tolist()
        if low < 0 or high >= len(self):
            raise InputError(f"{self.tensor.name} id {low if low < 0 else high} out of range [0, {len(self)})")
        misses = torch.unique(ids[missing]).cpu() if count else torch.empty(0, dtype=torch.int64)
        return ids, misses, count

    @property
    def cache_hits(self) -> int:
        return self.cache.stats.hits if self.cache is not None else 0

    @property
    def peer_hits(self) -> int:
        """Hits read from another GPU's shard (clique policy)."""
        return self.cache.stats.peer_hits if self.cache is not None else 0

    @property
    def remote_rows(self) -> int:
        return int(self._remote_rows)

    @property
    def local_rows(self) -> int:
        return self.lookups - self.cache_hits - self.remote_rows

    def hit_rate(self) -> float:
        """Fraction of looked-up ids served by the GPU cache (0.0 before any lookup)."""
        return self.cache_hits / self.lookups if self.lookups else 0.0

    def stats(self) -> dict[str, float]:
        return {
            "lookups": self.lookups,
            "cache_hits": self.cache_hits,
            "peer_hits": self.peer_hits,
            "local_rows": self.local_rows,
            "remote_rows": self.remote_rows,
            "remote_fetched": self.remote_fetched,
            "hit_rate": self.hit_rate(),
        }

    def reset_stats(self) -> None:
        self.lookups = 0
        self.remote_fetched = 0
        self._remote_rows = torch.zeros((), dtype=torch.int64)
        if self.cache is not None:
            self.cache.stats.reset()

    def close(self) -> None:
        """Unregisters the host rows; safe to call twice. With the clique policy, first waits (collectively, up
        to ``CLOSE_BARRIER_TIMEOUT_S`` on a gloo group) until every trainer of the group is done reading the
        shards, then frees this process's shard."""
        if self._closed:
            return
        self._closed = True
        if self.tensor._cache is self:
            self.tensor.use_cache(None)
        if self.policy == "clique" and self.cache is not None:
            import torch.distributed as dist

            torch.cuda.synchronize(self.device)
            if dist.is_initialized():
                if dist.get_backend(self._group) == "gloo":
                    timeout = datetime.timedelta(seconds=CLOSE_BARRIER_TIMEOUT_S)
                    dist.monitored_barrier(self._group, timeout=timeout)
                else:
                    dist.barrier(self._group)
        if self._registration is not None:
            self._registration.close()
            self._registration = None

    def __enter__(self) -> CachedFeature:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        rows = self.cache.capacity if self.cache is not None else 0
        return f"CachedFeature({self.tensor.name!r}, device={self.device}, cached_rows={rows}, policy={self.policy})"


def _check_options(tensor: DistTensor, policy: str, cpu_share: float, budget_bytes: int) -> None:
    if policy not in POLICIES:
        raise ConfigError(f"CachedFeature policy must be one of {POLICIES}, got {policy!r}")
    if not 0.0 <= cpu_share <= 1.0:
        raise ConfigError(f"cpu_share must be a fraction in [0, 1], got {cpu_share!r}")
    if tensor.part_policy != "node" or len(tensor.shape) != 2 or tensor.dtype not in FEATURE_DTYPES:
        raise InputError(f"CachedFeature needs a 2-D float32/float16/bfloat16 node tensor, got {tensor!r}")
    if budget_bytes < 0:
        raise ConfigError(f"budget_bytes must be >= 0, got {budget_bytes}")
