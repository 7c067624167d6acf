"""Uniform neighbour sampling on the GPU, with the semantics of :func:`distgnn.sampling.kernels.sample_neighbors`.

The CSC graph (``indptr``, ``indices``) lives either in GPU memory or in pinned host memory that the kernel
reads zero-copy over PCIe (UVA), so a partition larger than the GPU can still be sampled there; each tensor
may sit in either tier. The kernel (``csrc/cuda/sample.cu``) counts each seed's picks and scans the counts
in one pass (a tile of seeds per block, decoupled look-back); for fanouts up to 32 the same kernel then
fills its tile's positions (and optionally the neighbour ids), groups of lanes per seed keeping their picks
in registers; larger fanouts and ``-1`` take a fill kernel of their own. A call makes one host sync: 16
bytes (total picks, error bits) copied into pinned memory. When ``num_seeds * fanout`` is at most 2^24, the
outputs are allocated at that size and the fill is queued before the sync, so the GPU never waits for the
host; ``positions`` and the neighbour ids are then views of the first ``counts.sum()`` entries of those
allocations. The kernels live in the graph extension (:func:`distgnn.native.cuda.graph_kernels`), built on
first use into ``~/.cache/distgnn/extensions/graph-<torch>-<cuda>-<sm>``.

Differences from the CPU kernel: the same counts and the same per-seed groups in seed order, but a
different random stream (splitmix64 keyed by ``(rng_seed, seed index, draw number)``, unchanged since the
first GPU version, so the same ``rng_seed`` gives the same picks as before), and within a group the picks come
in draw order (ascending only when every edge is taken). On a machine where torch has no CUDA,
:func:`sample_neighbors` runs the C++ CPU kernel instead (same results as
:func:`distgnn.sampling.kernels.sample_neighbors` for the same ``rng_seed``) and returns CPU tensors.
"""

from __future__ import annotations

import functools

import torch

from distgnn.native.cuda import graph_kernels


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

    if not _cuda_available():
        return _sample_on_cpu(indptr, indices, seeds, fanout, replace, rng_seed, return_neighbors)

    # Pinned-or-pageable is checked by the binding (error bits), which asks CUDA once per tensor anyway.
    if indptr.is_cuda:
        device = indptr.device
        if indices.is_cuda and indices.device != device:
            raise ValueError(f"indptr and indices are on different GPUs ({indptr.device}, {indices.device})")
    elif indices.is_cuda:
        device = indices.device
    elif seeds.is_cuda:
        device = seeds.device
    else:
        device = torch.device("cuda", torch.cuda.current_device())
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
    semantics of :func:`distgnn.sampling.kernels.to_block`).

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
        from distgnn.sampling import kernels

        src_nids, indices = kernels.extension().relabel(
            dst_nids.contiguous().numpy(), src_nids_per_edge.contiguous().numpy()
        )
        return torch.from_numpy(src_nids), torch.from_numpy(indices)
    return tuple(graph_kernels().relabel(dst_nids.contiguous(), src_nids_per_edge.contiguous()))


def _sample_on_cpu(indptr, indices, seeds, fanout, replace, rng_seed, return_neighbors):
    """The C++ CPU kernel on the same tensors (machines without CUDA)."""
    from distgnn.sampling import kernels

    result = kernels.sample_neighbors(
        indptr.contiguous().numpy(),
        indices.contiguous().numpy(),
        seeds.to(torch.int64).contiguous().numpy(),
        fanout,
        replace=replace,
        rng_seed=rng_seed,
        return_neighbors=return_neighbors,
    )
    return tuple(torch.from_numpy(array) for array in result)
