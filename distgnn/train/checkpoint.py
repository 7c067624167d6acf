"""Checkpoint and resume a training job: model, optimizers, distributed embeddings, loader position, RNGs.

A checkpoint ``<dir>/step-<n>/`` holds

* ``model.<param>.npy`` and ``optim.<i>.npy``: the dense model's state dict and the dense optimizer's
  tensors, written by rank 0 (DDP keeps them equal on every rank);
* ``dist.<policy>.<tensor>.p<m>.npy``: machine ``m``'s rows of every DistEmbedding and of every state
  DistTensor of its sparse optimizer (found generically: any DistTensor the optimizer object holds), written
  by machine ``m``'s main server, all machines in parallel (:mod:`distgnn.server.checkpoint_ops`);
* ``state.json``: step, epoch, every rank's loader position and RNG states (torch, numpy, python, CUDA),
  the optimizers' structure, the graph's identity and the model's parameter shapes;
* ``manifest.json`` (written last): size and sha256 of every file.

No pickle anywhere. The directory is assembled as ``.staging-step-<n>`` and renamed when complete (see
:mod:`distgnn.store.checkpoint_files`), the last ``keep`` checkpoints are kept. A resumed run continues the same
sequence of batches, dropout masks and updates: with one trainer on CPU it ends bit-identical to a run that
was never interrupted (tests/train/test_checkpoint_resume.py).

Every rank calls :meth:`Checkpointer.maybe_save` after each optimizer step and :meth:`Checkpointer.resume`
once before training; both are collective (torch.distributed when initialized).
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import math
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from distgnn.client.context import DistContext
from distgnn.client.embedding import DistEmbedding
from distgnn.client.tensor import DistTensor
from distgnn.errors import CheckpointError, ConfigError, RpcError
from distgnn.store import checkpoint_files as cio
from distgnn.store import shm
from distgnn.train import collective

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STATE = "state.json"
# Servers write and hash their rows at disk speed; their RPC deadline grows with the bytes (at least this rate).
_MIN_SERVER_BYTES_PER_S = 20e6


@dataclass(frozen=True)
class Position:
    """Where a (resumed) run continues: ``step`` optimizer steps are done, and ``batch`` batches of ``epoch``.

    ``path`` is the checkpoint it came from (None for a fresh start).
    """

    step: int = 0
    epoch: int = 0
    batch: int = 0
    path: Path | None = None


# -- collectives (identity in one process) ----------------------------------------------------------------


def _agree_on_step(step: int) -> None:
    """Every rank is at ``step`` (also a barrier: each rank's pushes of that step are applied)."""
    if collective.world()[1] == 1:
        return
    both = torch.tensor([step, -step], dtype=torch.int64, device=collective.collective_device())
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    if int(both[0]) != step or int(-both[1]) != step:
        raise CheckpointError(
            f"ranks disagree on the step to checkpoint (this rank: {step}, others between {int(-both[1])} and "
            f"{int(both[0])}): call maybe_save with the global step count, after every optimizer step, on every rank"
        )


# -- a nested state (optimizer state dicts) as JSON plus a list of tensors --------------------------------


def _encode(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj.detach())
        return {"__tensor__": len(tensors) - 1}
    if isinstance(obj, dict):
        return {"__dict__": [[_encode(k, tensors), _encode(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, tensors) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise CheckpointError(f"cannot store a {type(obj).__name__} in a checkpoint (tensors, numbers, str, containers)")


def _decode(obj: Any, tensors: Sequence[torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__tuple__" in obj:
            return tuple(_decode(v, tensors) for v in obj["__tuple__"])
        return {_decode(k, tensors): _decode(v, tensors) for k, v in obj["__dict__"]}
    return obj


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: keep the bits
        t = t.view(torch.int16)
    return t.numpy()


def _from_numpy(arr: np.ndarray, dtype: str) -> torch.Tensor:
    t = torch.from_numpy(np.array(arr))
    return t.view(torch.bfloat16) if dtype == "torch.bfloat16" else t


def _describe(tensors: Sequence[torch.Tensor]) -> list[dict]:
    return [{"dtype": str(t.dtype), "shape": list(t.shape), "device": str(t.device)} for t in tensors]


# -- RNG states ------------------------------------------------------------------------------------------


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode()


def _unb64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def rng_state() -> dict:
    """This process's torch, CUDA, numpy and python RNG states as JSON-able values."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    cuda = [_b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_initialized() else None
    return {
        "torch": _b64(torch.get_rng_state()),
        "cuda": cuda,
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "python": [version, list(internal), gauss_next],
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(_unb64(state["torch"]))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


# -- what a job holds in DistTensors ---------------------------------------------------------------------


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


def _sparse_scalars(optimizer: Any) -> dict[str, Any]:
    """The optimizer's plain number/str attributes (learning rate, step counters)."""
    return {k: v for k, v in vars(optimizer).items() if isinstance(v, (bool, int, float, str))}


def _dist_tensors(embeddings: Iterable[DistEmbedding], sparse_optimizers: Iterable[Any]) -> list[DistTensor]:
    tensors: dict[tuple[str, str], DistTensor] = {}
    for emb in [*embeddings, *(e for opt in sparse_optimizers for e in opt.embeddings)]:
        tensors[(emb.weight.part_policy, emb.weight.name)] = emb.weight
    for opt in sparse_optimizers:
        for t in sparse_state_tensors(opt).values():
            tensors[(t.part_policy, t.name)] = t
    return list(tensors.values())


def _graph_identity(ctx: DistContext) -> dict:
    manifest = shm.read_manifest(ctx.config.job_id, ctx.machine_id)
    return {
        "graph_name": manifest["graph_name"],
        "num_nodes": int(manifest["num_nodes"]),
        "num_edges": int(manifest["num_edges"]),
        "num_parts": ctx.config.num_machines,
        # Every id space's ranges (node, edge, and typed ones such as "node:paper").
        "range_ends": {policy: ends.tolist() for policy, ends in sorted(ctx.id_range_ends.items())},
    }


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DistributedDataParallel (its state dict has no ``module.`` prefix)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def _nbytes(t: DistTensor) -> int:
    return torch.empty((), dtype=t.dtype).element_size() * math.prod(t.shape)


def _tensor_file(policy: str, name: str, machine: int) -> str:
    return f"dist.{policy}.{name}.p{machine}.npy"


# -- the checkpointer ------------------------------------------------------------------------------------


class Checkpointer:
    """Saves a job's state every ``every_n_steps`` optimizer steps into ``directory``, keeping the last ``keep``.

    Args:
        directory: the checkpoint root: a path on a shared filesystem, or the same path on every machine
            (each machine's main server writes its rows there; rank 0 writes the rest).
        every_n_steps: save when the global step count is a multiple of it (0: never; ``save`` still works).
        keep: how many checkpoints to keep (the oldest are removed after a new one is complete).
        context: the job's DistContext; by default the one of the first DistTensor saved.
    """

    def __init__(
        self, directory: str | Path, every_n_steps: int, keep: int = 2, context: DistContext | None = None
    ) -> None:
        if every_n_steps < 0 or keep < 1:
            raise ConfigError(f"need every_n_steps >= 0 and keep >= 1, got {every_n_steps} and {keep}")
        self.root = Path(directory).absolute()
        self.every_n_steps = every_n_steps
        self.keep = keep
        self.context = context
        self.last_save_s = 0.0

    # -- listing

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints (with a manifest), oldest first."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.glob("step-*") if (p / MANIFEST).is_file()]
        return sorted(found, key=lambda p: int(p.name.split("-")[1]))

    def latest(self) -> Path | None:
        found = self.checkpoints()
        return found[-1] if found else None

    # -- saving

    def maybe_save(
        self,
        step: int,
        epoch: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        loader: Any = None,
        sparse_optimizers: Sequence[Any] = (),
        embeddings: Sequence[DistEmbedding] = (),
    ) -> Path | None:
        """Save when ``step`` (optimizer steps done so far, counted over all epochs) is a multiple of
        ``every_n_steps``; returns the checkpoint's path then, else None. Call it on every rank after
        the optimizer steps (dense and sparse) of a batch."""
        if self.every_n_steps == 0 or step == 0 or step % self.every_n_steps:
            return None
        return self.save(step, epoch, model, optimizer, loader, sparse_optimizers, embeddings)

    def save(
        self,
        step: int,
        epoch: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        loader: Any = None,
        sparse_optimizers: Sequence[Any] = (),
        embeddings: Sequence[DistEmbedding] = (),
    ) -> Path:
        """Save now (collective); returns the checkpoint's path."""
        start = time.perf_counter()
        rank, world = collective.world()
        tensors = _dist_tensors(embeddings, sparse_optimizers)
        for tensor in tensors:  # this rank's pushes that did not wait for their acknowledgements
            tensor.flush()
        _agree_on_step(step)
        mine = {"rng": rng_state(), "loader": loader.state_dict() if loader is not None else None}
        ranks = collective.all_gather_objects(mine)
        ctx = self.context or (tensors[0].context if tensors else None)
        error = None
        path = None
        if rank == 0:
            try:
                path = self._write(step, epoch, model, optimizer, sparse_optimizers, tensors, ctx, ranks, world)
            except Exception as exc:  # every rank must hear of it, or the others would wait forever below
                error = f"{type(exc).__name__}: {exc}"
                log.exception("saving checkpoint of step %d failed", step)
        reply = collective.broadcast_object({"error": error, "path": str(path)})
        if reply["error"]:
            raise CheckpointError(f"saving the checkpoint of step {step} failed on rank 0: {reply['error']}")
        self.last_save_s = time.perf_counter() - start
        log.info("checkpoint of step %d written to %s in %.2fs", step, reply["path"], self.last_save_s)
        return Path(reply["path"])

    def _write(self, step, epoch, model, optimizer, sparse_optimizers, tensors, ctx, ranks, world) -> Path:
        final = cio.checkpoint_name(step)
        staging = cio.STAGING_PREFIX + final
        root = str(self.root)
        for stale in self.root.glob(cio.STAGING_PREFIX + "step-*"):  # left by a save that crashed
            log.warning("removing %s, an incomplete checkpoint", stale)
            cio.remove_checkpoint(root, stale.name)
        staged = cio.prepare_staging(root, staging)
        client = ctx.client if ctx is not None else None
        machines = range(ctx.config.num_machines) if ctx is not None else range(0)
        if tensors:
            self._server_op(client, machines, "checkpoint_dir", {"root": root, "dir": staging, "action": "prepare"})
        # The servers write their rows while this rank writes the dense state.
        pending = []
        total_bytes = 0
        for t in tensors:
            total_bytes += _nbytes(t)
            for m in machines:
                fields = {"policy": t.part_policy, "name": t.name, "root": root, "dir": staging}
                fields["file"] = _tensor_file(t.part_policy, t.name, m)
                pending.append((t, m, fields["file"], client.send(m, "save_tensor", fields)))
        files: dict[str, dict] = {}
        model_state = _unwrap(model).state_dict()
        for name, value in model_state.items():
            files[f"model.{name}.npy"] = cio.write_new_file(staged / f"model.{name}.npy", _to_numpy(value))
        optim_tensors: list[torch.Tensor] = []
        optim_tree = _encode(optimizer.state_dict(), optim_tensors) if optimizer is not None else None
        for i, value in enumerate(optim_tensors):
            files[f"optim.{i}.npy"] = cio.write_new_file(staged / f"optim.{i}.npy", _to_numpy(value))
        dist_files = {}
        if pending:
            replies = self._wait(client, [rid for *_, rid in pending], total_bytes, "save_tensor")
            for (t, m, file, _), reply in zip(pending, replies, strict=True):
                entry = {k: reply.header[k] for k in ("bytes", "sha256", "rows")}
                dist_files[file] = {**entry, "machine": m, "policy": t.part_policy, "name": t.name}
        state = {
            "format": FORMAT_VERSION,
            "step": step,
            "epoch": epoch,
            "world_size": world,
            "ranks": ranks,
            "graph": _graph_identity(ctx) if ctx is not None else None,
            "model": {name: {"dtype": str(v.dtype), "shape": list(v.shape)} for name, v in model_state.items()},
            "optimizer": {"tree": optim_tree, "tensors": _describe(optim_tensors)} if optimizer is not None else None,
            "dist_tensors": [
                {"policy": t.part_policy, "name": t.name, "shape": list(t.shape), "dtype": str(t.dtype)}
                for t in tensors
            ],
            "sparse_optimizers": [
                {
                    "class": type(opt).__name__,
                    "scalars": _sparse_scalars(opt),
                    "tensors": sorted(sparse_state_tensors(opt)),
                }
                for opt in sparse_optimizers
            ],
        }
        files[STATE] = cio.write_new_file(staged / STATE, data=json.dumps(state).encode())
        manifest = {"format": FORMAT_VERSION, "step": step, "files": files, "dist_files": dist_files}
        cio.write_new_file(staged / MANIFEST, data=json.dumps(manifest, indent=1).encode())
        cio.fsync_dir(staged)
        path = cio.commit_staging(root, staging)
        if tensors:  # machines whose root is their own disk rename their staging directory too
            self._server_op(client, machines, "checkpoint_dir", {"root": root, "dir": staging, "action": "commit"})
        for old in self.checkpoints()[: -self.keep]:
            cio.remove_checkpoint(root, old.name)
            if tensors:
                self._server_op(client, machines, "checkpoint_dir", {"root": root, "dir": old.name, "action": "remove"})
        return path

    @staticmethod
    def _server_op(client, machines: Iterable[int], op: str, fields: dict) -> None:
        for m in machines:  # one at a time: on a shared root, the first one does the work
            client.call(m, op, fields)

    @staticmethod
    def _wait(client, rids: list[int], total_bytes: int, op: str) -> list:
        timeout = max(client.timeout_s, total_bytes / _MIN_SERVER_BYTES_PER_S)
        try:
            return client.wait(rids, timeout_s=timeout)
        except RpcError as exc:
            raise CheckpointError(f"'{op}' failed: {exc}") from None

    # -- resuming

    def resume(
        self,
        spec: str | Path | None,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        loader: Any = None,
        sparse_optimizers: Sequence[Any] = (),
        embeddings: Sequence[DistEmbedding] = (),
        batches_per_epoch: int | None = None,
    ) -> Position:
        """Restore the state saved in checkpoint ``spec`` (collective) and return where to continue.

        ``spec``: None (start fresh), ``"auto"`` (the latest checkpoint under the root, or a fresh start when
        there is none), or the path of a checkpoint directory. Everything is checked first (checksums, graph,
        partition count, trainer count, parameter names and shapes, tensor shapes); a mismatch raises
        CheckpointError on every rank and changes nothing. Build the model, optimizers, embeddings and loader
        exactly as for a fresh run before calling it. ``batches_per_epoch``: where the loop takes fewer
        batches per epoch than the loader has (a cap), a checkpoint taken at the cap continues with the next
        epoch (the loader too).
        """
        if spec is None:
            return Position()
        rank, world = collective.world()
        tensors = _dist_tensors(embeddings, sparse_optimizers)
        ctx = self.context or (tensors[0].context if tensors else None)
        reply: dict = {"error": None}
        arrays: list[np.ndarray] = []
        if rank == 0:
            try:
                reply, arrays = self._read(spec, model, optimizer, sparse_optimizers, tensors, ctx, world)
            except Exception as exc:
                reply = {"error": f"{type(exc).__name__}: {exc}" if not isinstance(exc, CheckpointError) else str(exc)}
        reply = collective.broadcast_object(reply)
        if reply["error"]:
            raise CheckpointError(reply["error"])
        if reply.get("path") is None:
            log.info("no checkpoint under %s: starting fresh", self.root)
            return Position()
        state = reply["state"]
        model_state = self._broadcast_tensors(arrays[: len(state["model"])], list(state["model"].values()))
        _unwrap(model).load_state_dict(dict(zip(state["model"], model_state, strict=True)))
        if optimizer is not None:
            described = state["optimizer"]["tensors"]
            optim_tensors = self._broadcast_tensors(arrays[len(state["model"]) :], described)
            optim_tensors = [t.to(d["device"]) for t, d in zip(optim_tensors, described, strict=True)]
            optimizer.load_state_dict(_decode(state["optimizer"]["tree"], optim_tensors))
        for opt, saved in zip(sparse_optimizers, state["sparse_optimizers"], strict=True):
            for key, value in saved["scalars"].items():
                setattr(opt, key, value)
        mine = state["ranks"][rank]
        position = dict(mine["loader"] or {"epoch": state["epoch"], "batch": 0})
        if batches_per_epoch is not None and position["batch"] >= batches_per_epoch:
            position.update(epoch=position["epoch"] + 1, batch=0)
        if loader is not None:
            loader.load_state_dict({**mine["loader"], **position})
        set_rng_state(mine["rng"])
        log.info("resumed from %s (step %d)", reply["path"], state["step"])
        return Position(state["step"], position["epoch"], position["batch"], Path(reply["path"]))

    def _find(self, spec: str | Path) -> Path | None:
        if str(spec) == "auto":
            return self.latest()
        path = Path(spec).absolute()
        if not (path / MANIFEST).is_file():
            found = ", ".join(p.name for p in self.checkpoints()) or "none"
            raise CheckpointError(
                f"{path} is not a complete checkpoint (no {MANIFEST}); checkpoints under {self.root}: {found}"
            )
        return path

    def _read(self, spec, model, optimizer, sparse_optimizers, tensors, ctx, world) -> tuple[dict, list[np.ndarray]]:
        """Rank 0: find and check the checkpoint, load the servers' rows; returns the reply for every rank and
        the dense arrays (model tensors, then optimizer tensors)."""
        path = self._find(spec)
        if path is None:
            return {"error": None, "path": None}, []
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{path / MANIFEST} is unreadable: {exc}") from None
        if manifest.get("format") != FORMAT_VERSION:
            raise CheckpointError(f"{path} has format {manifest.get('format')}, this distgnn reads {FORMAT_VERSION}")
        files = manifest["files"]
        state_bytes = (path / STATE).read_bytes() if (path / STATE).is_file() else b""
        cio.verify_file(path / STATE, files.get(STATE, {}))
        state = json.loads(state_bytes)
        self._check_compatible(path, state, model, optimizer, sparse_optimizers, tensors, ctx, world)
        arrays = [
            cio.read_verified_npy(path / f"model.{name}.npy", files.get(f"model.{name}.npy", {}))
            for name in state["model"]
        ]
        if optimizer is not None:
            for i in range(len(state["optimizer"]["tensors"])):
                arrays.append(cio.read_verified_npy(path / f"optim.{i}.npy", files.get(f"optim.{i}.npy", {})))
        if tensors:
            self._load_dist_tensors(path, manifest["dist_files"], tensors, ctx)
        return {"error": None, "path": str(path), "state": state}, arrays

    def _check_compatible(self, path, state, model, optimizer, sparse_optimizers, tensors, ctx, world) -> None:
        if state["world_size"] != world:
            raise CheckpointError(f"{path} was made by {state['world_size']} trainers, this job has {world}")
        if ctx is not None and state["graph"] is not None:
            here, saved = _graph_identity(ctx), state["graph"]
            if saved["num_parts"] != here["num_parts"]:
                raise CheckpointError(
                    f"{path} was made with {saved['num_parts']} partitions, this job has {here['num_parts']}: "
                    "resume on the same partitioning"
                )
            if saved != here:
                raise CheckpointError(
                    f"{path} was made for graph {saved['graph_name']!r} ({saved['num_nodes']} nodes, "
                    f"{saved['num_edges']} edges), this job serves {here['graph_name']!r} ({here['num_nodes']} "
                    f"nodes, {here['num_edges']} edges) or partitions it differently"
                )
        own = {name: {"dtype": str(v.dtype), "shape": list(v.shape)} for name, v in _unwrap(model).state_dict().items()}
        if own != state["model"]:
            diff = sorted(_model_diff(own, state["model"]))
            raise CheckpointError(f"{path} holds another model: {'; '.join(diff[:3])}")
        if (optimizer is None) != (state["optimizer"] is None):
            raise CheckpointError(f"{path} {'has no' if optimizer is not None else 'has a'} dense optimizer state")
        here_tensors = [
            {"policy": t.part_policy, "name": t.name, "shape": list(t.shape), "dtype": str(t.dtype)} for t in tensors
        ]
        if sorted(here_tensors, key=str) != sorted(state["dist_tensors"], key=str):
            raise CheckpointError(
                f"{path} holds distributed tensors {[t['name'] for t in state['dist_tensors']]}, this job has "
                f"{[t['name'] for t in here_tensors]} (or their shapes differ)"
            )
        saved_classes = [s["class"] for s in state["sparse_optimizers"]]
        if saved_classes != [type(opt).__name__ for opt in sparse_optimizers]:
            raise CheckpointError(f"{path} holds sparse optimizers {saved_classes}, this job has others")

    def _load_dist_tensors(self, path: Path, dist_files: dict, tensors: list[DistTensor], ctx) -> None:
        client, root = ctx.client, str(path.parent)
        total = sum(_nbytes(t) for t in tensors)
        # First every server checks its files (size, sha256, shape), then they load: a bad file changes nothing.
        for verify in (True, False):
            rids = []
            for t in tensors:
                for m in range(ctx.config.num_machines):
                    file = _tensor_file(t.part_policy, t.name, m)
                    entry = dist_files.get(file)
                    if entry is None:
                        raise CheckpointError(f"{path / MANIFEST} lists no file {file}")
                    fields = {"policy": t.part_policy, "name": t.name, "root": root, "dir": path.name, "file": file}
                    fields.update(bytes=entry["bytes"], sha256=entry["sha256"], rows=entry["rows"], verify=verify)
                    rids.append(client.send(m, "load_tensor", fields))
            self._wait(client, rids, total, "load_tensor")

    @staticmethod
    def _broadcast_tensors(arrays: list[np.ndarray], described: list[dict]) -> list[torch.Tensor]:
        """Rank 0's arrays as tensors on every rank (their dtype and shape come from ``described``)."""
        rank, world = collective.world()
        out = []
        for i, d in enumerate(described):
            if rank == 0:
                t = _from_numpy(arrays[i], d["dtype"])
            else:
                t = torch.empty(d["shape"], dtype=_torch_dtype(d["dtype"]))
            if world > 1:
                moved = t.to(collective.collective_device())
                dist.broadcast(moved, 0)
                t = moved.cpu()
            out.append(t)
        return out


def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"unknown tensor dtype {name!r} in the checkpoint")
    return dtype


def _model_diff(own: dict, saved: dict) -> list[str]:
    diff = [f"parameter {k} missing from this model" for k in saved.keys() - own.keys()]
    diff += [f"this model's {k} is not in the checkpoint" for k in own.keys() - saved.keys()]
    diff += [
        f"{k} is {saved[k]['dtype']}{saved[k]['shape']} there, {own[k]['dtype']}{own[k]['shape']} here"
        for k in own.keys() & saved.keys()
        if own[k] != saved[k]
    ]
    return diff


# -- command line ----------------------------------------------------------------------------------------


def add_checkpoint_args(parser: argparse.ArgumentParser) -> None:
    """``--checkpoint-dir D --checkpoint-every N --checkpoint-keep K --resume [auto|PATH]``."""
    group = parser.add_argument_group("checkpoints")
    group.add_argument(
        "--checkpoint-dir", default=None, help="where checkpoints go (shared, or the same path on every machine)"
    )
    group.add_argument("--checkpoint-every", type=int, default=0, help="save every N optimizer steps (0: never)")
    group.add_argument("--checkpoint-keep", type=int, default=2, help="checkpoints kept (the oldest are removed)")
    group.add_argument(
        "--resume",
        nargs="?",
        const="auto",
        default=None,
        metavar="auto|PATH",
        help="continue from the latest checkpoint in --checkpoint-dir if there is one (alone or 'auto'), or from a\n"
        "checkpoint's path",
    )


def checkpointer_from_args(args: argparse.Namespace, context: DistContext | None = None) -> Checkpointer | None:
    """The Checkpointer the flags of :func:`add_checkpoint_args` ask for (None without ``--checkpoint-dir``)."""
    if args.checkpoint_dir is None:
        if args.resume is not None or args.checkpoint_every:
            raise ConfigError("--resume and --checkpoint-every need --checkpoint-dir")
        return None
    return Checkpointer(args.checkpoint_dir, args.checkpoint_every, args.checkpoint_keep, context)
