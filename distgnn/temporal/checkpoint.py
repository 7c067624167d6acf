"""The TGN job's checkpoint pieces: memory copies, the batch in flight, the loop's position.

They plug into the one checkpoint system (:class:`distgnn.train.checkpoint.Checkpointer`): rank 0 saves the
weights and the optimizer; every trainer saves its own pieces (:class:`~distgnn.train.checkpoint_pieces.PerRank`):
the memory copies it owns (node memory and mailbox), its negative sampler's generator, where the loop stands
(epoch, and batches (epoch parallelism: steps) done in it) and, under epoch parallelism, its batch in flight.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch

from distgnn.errors import CheckpointError, ConfigError
from distgnn.nn.temporal import NodeMemory
from distgnn.temporal.epoch_parallel import StaggeredMemory
from distgnn.train.checkpoint import Checkpointer
from distgnn.train.checkpoint_pieces import GeneratorState, PerRank, Stateful


class LoopPosition:
    """Where the loop stands: ``batch`` batches (epoch parallelism: steps) of epoch ``epoch`` are done."""

    def __init__(self) -> None:
        self.epoch = 0
        self.batch = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])


class MemoryCopies:
    """The memory copies a trainer owns (node memory and mailbox), by copy index."""

    def __init__(self, owned: dict[int, NodeMemory]):
        self.owned = owned

    def state_dict(self) -> dict[str, dict[str, np.ndarray]]:
        return {str(copy): memory.state() for copy, memory in self.owned.items()}

    def load_state_dict(self, state: dict[str, dict[str, np.ndarray]]) -> None:
        for copy, memory in self.owned.items():
            if str(copy) not in state:
                raise CheckpointError(f"the checkpoint holds no memory copy {copy}: it was taken with fewer copies")
            memory.load_state(state[str(copy)])


class HeldBatch:
    """Under epoch parallelism, the batch a trainer holds in flight (nothing between epochs)."""

    def __init__(self, memory: StaggeredMemory, device: torch.device):
        self.memory, self.device = memory, device

    def state_dict(self) -> dict[str, np.ndarray]:
        return self.memory.state()

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.memory.load_state(state, self.device)


def temporal_pieces(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    owned: dict[int, NodeMemory],
    position: LoopPosition,
    held: HeldBatch | None = None,
) -> dict[str, Stateful]:
    """The pieces of a TGN trainer's checkpoint (``held``: its batch in flight, under epoch parallelism)."""
    pieces: dict[str, Stateful] = {
        "model": model,
        "optimizer": optimizer,
        "position": PerRank(position),
        "rng": PerRank(GeneratorState(generator)),
        "memory": PerRank(MemoryCopies(owned)),
    }
    if held is not None:
        pieces["held"] = PerRank(held)
    return pieces


def checkpointer_from_args(args: argparse.Namespace, facts: dict) -> Checkpointer | None:
    """The Checkpointer of ``--checkpoint-dir --checkpoint-every --checkpoint-keep --resume`` (None without
    either directory; ``--resume PATH`` alone resumes without saving). ``facts``: what a checkpoint must have been
    taken for (the stream's size, the parallelism, the model's kind)."""
    if args.resume == "auto" and not args.checkpoint_dir:
        raise ConfigError("--resume auto needs --checkpoint-dir")
    root = args.checkpoint_dir or (os.path.dirname(os.path.abspath(args.resume)) if args.resume else None)
    if root is None:
        return None
    return Checkpointer(root, args.checkpoint_every, args.checkpoint_keep, facts=facts)
