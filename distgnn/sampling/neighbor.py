"""Distributed multi-layer neighbour sampling: seeds in, one Block per GNN layer out.

:class:`NeighborSampler` decides once, at construction, where it samples: the CPU backend
(:class:`distgnn.sampling.cpu.CpuSampling`: numpy and the C++ kernels) or a device backend
(:class:`distgnn.sampling.gpu.DeviceSampling`: torch on the device, the CUDA kernels on a GPU). Per layer it
makes one call to that backend, which splits the frontier by owner (partition book), sends the seeds other
machines own to their servers as ``sample`` requests, samples this machine's seeds from the shared-memory CSC
while those are in flight, merges the replies into seed order and relabels them into a Block; the next
layer's frontier is the Block's source nodes. A heterogeneous layer samples (node, edge type) items
(:mod:`distgnn.sampling.items`); a homogeneous one is the case of one edge type, on the same path.

The sampler reads a graph through :class:`~distgnn.sampling.source.GraphSource` (a DistGraph in a job, or
:class:`~distgnn.sampling.source.InProcessGraph` for single-process training and tests).
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Sequence

import numpy as np
import torch

from distgnn.errors import ConfigError
from distgnn.sampling.block import Block
from distgnn.sampling.cpu import CpuSampling
from distgnn.sampling.gpu import GRAPH_MEMORY, DeviceSampling
from distgnn.sampling.items import check_layer_fanout
from distgnn.sampling.source import GraphSource


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
        structure: ``"partitioned"`` (each machine samples its own partition's nodes; the others' go to
            their servers as ``sample`` requests) or ``"replicated"`` (the whole graph's structure is read once
            into this process, ``g.replicated_structure()``, and every layer is sampled here with no request:
            for a GPU sampler, the structure in ``graph_memory``). Features are not affected.
    """

    def __init__(
        self,
        fanouts: Sequence[int],
        replace: bool = False,
        prob: str | None = None,
        device: torch.device | str | None = None,
        graph_memory: str = "gpu",
        structure: str = "partitioned",
    ):
        fanouts = [check_layer_fanout(f) for f in fanouts]
        if not fanouts:
            raise ConfigError("fanouts must be a non-empty list, one entry per layer")
        if graph_memory not in GRAPH_MEMORY:
            raise ConfigError(f"graph_memory must be one of {GRAPH_MEMORY}, got {graph_memory!r}")
        if structure not in STRUCTURES:
            raise ConfigError(f"structure must be one of {STRUCTURES}, got {structure!r}")
        if structure == "replicated" and prob is not None:
            raise ConfigError(f"prob={prob!r} needs the partitions' edge arrays: sample the partitioned structure")
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
        self.structure = structure
        # The one dispatch point: where this sampler samples is decided here, once.
        self._backend = CpuSampling() if device is None else DeviceSampling(device, graph_memory)

    def spec(self) -> dict:
        """A small picklable description that :meth:`from_spec` turns back into a sampler."""
        return {
            "fanouts": list(self.fanouts),
            "replace": self.replace,
            "prob": self.prob,
            "device": None if self.device is None else str(self.device),
            "graph_memory": self.graph_memory,
            "structure": self.structure,
        }

    @classmethod
    def from_spec(cls, spec: dict) -> NeighborSampler:
        return cls(
            spec["fanouts"], spec["replace"], spec["prob"], spec["device"], spec["graph_memory"], spec["structure"]
        )

    def __repr__(self) -> str:
        where = "" if self.device is None else f", device={str(self.device)!r}, graph_memory={self.graph_memory!r}"
        if self.structure != "partitioned":
            where += f", structure={self.structure!r}"
        return f"NeighborSampler(fanouts={self.fanouts}, replace={self.replace}, prob={self.prob!r}{where})"

    def close(self) -> None:
        """Release the partitions placed on the device (again on the next sample); safe to call twice."""
        self._backend.close()

    def sample_blocks(
        self, g: GraphSource, seeds: torch.Tensor | np.ndarray, rng_seed: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor, list[Block]]:
        """Sample the message-flow graphs of ``seeds``.

        Args:
            g: a DistGraph or InProcessGraph.
            seeds: ``(B,)`` unique global ids of the output nodes.
            rng_seed: seed of this mini-batch's random streams (layers and machines derive their own).

        Returns:
            ``(input_nodes, output_nodes, blocks)``: global ids of the first
            block's source nodes, the seeds, and one Block per layer, input
            layer first; on the sampler's device (CPU without one).
        """
        book = g.get_partition_book()
        if self.structure == "replicated":
            local, remote = g.replicated_structure(), None
        else:
            local, remote = g.sampling_view()
        frontier = output_nodes = self._backend.frontier(book, seeds)
        layers = []  # output layer first: (fanout, one random-stream seed per partition)
        for layer in reversed(range(len(self.fanouts))):
            layer_seed = derive_seed(rng_seed, layer)
            layers.append((self.fanouts[layer], [derive_seed(layer_seed, part) for part in range(book.num_partitions)]))
        blocks, frontier = self._backend.layers(book, local, remote, frontier, layers, self.replace, self.prob)
        return torch.as_tensor(frontier), torch.as_tensor(output_nodes), blocks[::-1]


STRUCTURES = ("partitioned", "replicated")


def add_sampling_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Where a trainer samples: ``--sample-device`` and ``--structure`` (the flags every example shares)."""
    parser.add_argument(
        "--sample-device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="cuda (with --device cuda): sample this machine's partition on the trainer's GPU (remote seeds\n"
        "still go to their servers); needs --num-workers 0",
    )
    parser.add_argument(
        "--structure",
        default="partitioned",
        choices=STRUCTURES,
        help="partitioned: each machine samples its own nodes' neighbours and asks the other machines' servers\n"
        "for theirs; replicated: every trainer reads all partitions' structure (CSC) from the partition folder\n"
        "once and samples every layer itself, no sampling requests (features stay partitioned); refused with\n"
        "its size when it does not fit the host (or, with --sample-device cuda, the GPU)",
    )


def derive_seed(*parts: int) -> int:
    """A 63-bit random-stream seed from integers (base seed, epoch, batch, layer, ...)."""
    digest = hashlib.blake2b(np.asarray(parts, dtype=np.int64).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
