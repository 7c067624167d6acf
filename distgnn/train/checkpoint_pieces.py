"""What a checkpoint holds: named pieces, each with ``state_dict()`` / ``load_state_dict()``.

A model, an optimizer and a loader already speak that protocol. This module adds the pieces that need an
adapter: :class:`PerRank` (a piece every trainer saves for itself: a loader position, RNG states, a TGN memory
copy), :class:`ProcessRng` (torch, CUDA, numpy and python RNGs), :class:`GeneratorState` (one
``torch.Generator``) and :class:`DistState` (DistEmbeddings and their sparse optimizers' state: the rows stay on
the servers, which write and read them themselves; the piece's own state is the optimizers' scalars).
:func:`training_pieces` names the pieces of a static training loop.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from distgnn.client.context import DistContext
from distgnn.client.embedding import DistEmbedding
from distgnn.client.tensor import DistTensor
from distgnn.errors import CheckpointError, RpcError
from distgnn.store import shm
from distgnn.train.state_codec import rng_state, set_rng_state

# Servers write and hash their rows at disk speed; their RPC deadline grows with the bytes (at least this rate).
_MIN_SERVER_BYTES_PER_S = 20e6


@runtime_checkable
class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


class PerRank:
    """``piece`` as every trainer's own: each rank saves its state, and gets its own state back on resume."""

    def __init__(self, piece: Stateful):
        self.piece = piece

    def state_dict(self) -> Any:
        return self.piece.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.piece.load_state_dict(state)


class ProcessRng:
    """This process's torch, CUDA, numpy and python RNG states (JSON: no files)."""

    def state_dict(self) -> dict:
        return rng_state()

    def load_state_dict(self, state: dict) -> None:
        set_rng_state(state)


class GeneratorState:
    """One ``torch.Generator``'s state (a uint8 tensor)."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def state_dict(self) -> torch.Tensor:
        return self.generator.get_state()

    def load_state_dict(self, state: torch.Tensor) -> None:
        self.generator.set_state(state.cpu())


def sparse_state_tensors(optimizer: Any) -> dict[str, DistTensor]:
    """Every DistTensor a sparse optimizer holds (its per-row state), by name, found by walking its attributes
    (dicts, lists and tuples included), so a new optimizer needs no change here. Its embeddings' weights are
    left out (they are saved as embeddings)."""
    weights = {id(emb.weight) for emb in getattr(optimizer, "embeddings", ())}
    found: dict[str, DistTensor] = {}

    def walk(value: Any) -> None:
        if isinstance(value, DistTensor):
            if id(value) not in weights:
                found[value.name] = value
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    walk(vars(optimizer))
    return found


class DistState:
    """DistEmbeddings and sparse optimizers: their rows are written and read by the servers (the Checkpointer
    asks them, see :meth:`tensors`); :meth:`state_dict` is what the trainer holds, the optimizers' classes and
    plain number/str attributes (learning rate, step counters)."""

    def __init__(self, embeddings: Iterable[DistEmbedding] = (), sparse_optimizers: Iterable[Any] = ()):
        self.embeddings = list(embeddings)
        self.sparse_optimizers = list(sparse_optimizers)

    def tensors(self) -> list[DistTensor]:
        """Every DistTensor to save: the embeddings' weights and the optimizers' state, each once."""
        tensors: dict[tuple[str, str], DistTensor] = {}
        for emb in [*self.embeddings, *(e for opt in self.sparse_optimizers for e in opt.embeddings)]:
            tensors[(emb.weight.part_policy, emb.weight.name)] = emb.weight
        for opt in self.sparse_optimizers:
            for t in sparse_state_tensors(opt).values():
                tensors[(t.part_policy, t.name)] = t
        return list(tensors.values())

    def context(self) -> DistContext | None:
        tensors = self.tensors()
        return tensors[0].context if tensors else None

    def flush(self) -> None:
        """Wait for this trainer's pushes that did not wait for their acknowledgements."""
        for tensor in self.tensors():
            tensor.flush()

    def checkpoint_dir(self, root: str, directory: str, action: str) -> None:
        """Every machine's server: ``prepare``, ``commit`` or ``remove`` checkpoint ``directory`` under ``root``."""
        ctx = self.context()
        for m in range(ctx.config.num_machines) if ctx is not None else ():
            # One at a time: on a shared root, the first one does the work.
            ctx.client.call(m, "checkpoint_dir", {"root": root, "dir": directory, "action": action})

    def send_save(self, root: str, staging: str) -> list[tuple[DistTensor, int, str, int]]:
        """Ask every machine's server to write its rows of every tensor into ``staging``; returns the requests
        for :meth:`wait_saved` (the servers write while the trainer goes on)."""
        ctx = self.context()
        pending = []
        for t in self.tensors():
            for m in range(ctx.config.num_machines):
                fields = {"policy": t.part_policy, "name": t.name, "root": root, "dir": staging}
                fields["file"] = _tensor_file(t.part_policy, t.name, m)
                pending.append((t, m, fields["file"], ctx.client.send(m, "save_tensor", fields)))
        return pending

    def wait_saved(self, pending: list[tuple[DistTensor, int, str, int]]) -> dict[str, dict]:
        """The manifest entries of the files :meth:`send_save` asked for, once written."""
        if not pending:
            return {}
        replies = self._wait([rid for *_, rid in pending], "save_tensor")
        files = {}
        for (t, m, file, _), reply in zip(pending, replies, strict=True):
            entry = {k: reply.header[k] for k in ("bytes", "sha256", "rows")}
            files[file] = {**entry, "machine": m, "policy": t.part_policy, "name": t.name}
        return files

    def load_rows(self, path: Path, dist_files: dict) -> None:
        """Every server loads its rows from checkpoint ``path``: first all check their files (size, sha256,
        shape), then they load, so a bad file changes nothing."""
        ctx = self.context()
        if ctx is None:
            return
        for verify in (True, False):
            rids = []
            for t in self.tensors():
                for m in range(ctx.config.num_machines):
                    file = _tensor_file(t.part_policy, t.name, m)
                    entry = dist_files.get(file)
                    if entry is None:
                        raise CheckpointError(f"{path / 'manifest.json'} lists no file {file}")
                    fields = {"policy": t.part_policy, "name": t.name, "root": str(path.parent), "dir": path.name}
                    fields.update(file=file, bytes=entry["bytes"], sha256=entry["sha256"], rows=entry["rows"])
                    rids.append(ctx.client.send(m, "load_tensor", {**fields, "verify": verify}))
            self._wait(rids, "load_tensor")

    def _wait(self, rids: list[int], op: str) -> list:
        client = self.context().client
        total = sum(nbytes(t) for t in self.tensors())
        try:
            return client.wait(rids, timeout_s=max(client.timeout_s, total / _MIN_SERVER_BYTES_PER_S))
        except RpcError as exc:
            raise CheckpointError(f"'{op}' failed: {exc}") from None

    def state_dict(self) -> dict:
        return {
            "sparse_optimizers": [
                {
                    "class": type(opt).__name__,
                    "scalars": {k: v for k, v in vars(opt).items() if isinstance(v, (bool, int, float, str))},
                    "tensors": sorted(sparse_state_tensors(opt)),
                }
                for opt in self.sparse_optimizers
            ],
        }

    def check(self, state: dict, saved_tensors: list[dict]) -> str | None:
        """Why ``state`` (and the DistTensors described in ``saved_tensors``) cannot be loaded here, or None."""
        here = [describe_tensor(t) for t in self.tensors()]
        if sorted(here, key=str) != sorted(saved_tensors, key=str):
            return (
                f"holds distributed tensors {[t['name'] for t in saved_tensors]}, this job has "
                f"{[t['name'] for t in here]} (or their shapes differ)"
            )
        saved_classes = [s["class"] for s in state["sparse_optimizers"]]
        if saved_classes != [type(opt).__name__ for opt in self.sparse_optimizers]:
            return f"holds sparse optimizers {saved_classes}, this job has others"
        return None

    def load_state_dict(self, state: dict) -> None:
        for opt, saved in zip(self.sparse_optimizers, state["sparse_optimizers"], strict=True):
            for key, value in saved["scalars"].items():
                setattr(opt, key, value)


def _tensor_file(policy: str, name: str, machine: int) -> str:
    return f"dist.{policy}.{name}.p{machine}.npy"


def module_mismatch(module: torch.nn.Module, tree: dict) -> str | None:
    """How ``module``'s parameters differ from those of its encoded state dict ``tree`` (up to three), or None."""
    own = {k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in module.state_dict().items()}
    saved = {k: {"dtype": v["dtype"], "shape": v["shape"]} for k, v in tree["__dict__"]}
    diff = [f"parameter {k} missing from this model" for k in saved.keys() - own.keys()]
    diff += [f"this model's {k} is not in the checkpoint" for k in own.keys() - saved.keys()]
    diff += [
        f"{k} is {saved[k]['dtype']}{saved[k]['shape']} there, {own[k]['dtype']}{own[k]['shape']} here"
        for k in own.keys() & saved.keys()
        if own[k] != saved[k]
    ]
    return "; ".join(sorted(diff)[:3]) or None


def graph_identity(ctx: DistContext) -> dict:
    """The served graph a checkpoint was taken for: name, sizes, partition count, every id space's ranges."""
    manifest = shm.read_manifest(ctx.config.job_id, ctx.machine_id)
    return {
        "graph_name": manifest["graph_name"],
        "num_nodes": int(manifest["num_nodes"]),
        "num_edges": int(manifest["num_edges"]),
        "num_parts": ctx.config.num_machines,
        # Every id space's ranges (node, edge, and typed ones such as "node:paper").
        "range_ends": {policy: ends.tolist() for policy, ends in sorted(ctx.id_range_ends.items())},
    }


def describe_tensor(t: DistTensor) -> dict:
    return {"policy": t.part_policy, "name": t.name, "shape": list(t.shape), "dtype": str(t.dtype)}


def nbytes(t: DistTensor) -> int:
    return torch.empty((), dtype=t.dtype).element_size() * math.prod(t.shape)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DistributedDataParallel (its state dict has no ``module.`` prefix)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def training_pieces(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    loader: Stateful | None = None,
    sparse_optimizers: Sequence[Any] = (),
    embeddings: Sequence[DistEmbedding] = (),
) -> dict[str, Stateful]:
    """The pieces of a training loop: ``model`` (DDP-unwrapped), ``optimizer``, every rank's loader
    ``position`` and ``rng``, and the ``dist`` state of embeddings and sparse optimizers."""
    if not isinstance(model, torch.nn.Module):
        raise CheckpointError(f"a checkpoint's model is a torch.nn.Module, got {type(model).__name__}")
    pieces: dict[str, Stateful] = {"model": unwrap(model)}
    if optimizer is not None:
        pieces["optimizer"] = optimizer
    if loader is not None:
        pieces["position"] = PerRank(loader)
    pieces["rng"] = PerRank(ProcessRng())
    if embeddings or sparse_optimizers:
        pieces["dist"] = DistState(embeddings, sparse_optimizers)
    return pieces
