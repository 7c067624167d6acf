"""Checkpoint and resume a training job: one manifest of named pieces, each with ``state_dict()``.

:meth:`Checkpointer.save` takes a mapping of pieces (:mod:`distgnn.train.checkpoint_pieces`: a model, an
optimizer, a loader position, RNG states, DistEmbeddings with their sparse optimizers, a TGN memory copy...).
A checkpoint ``<dir>/step-<n>/`` holds

* ``<piece>.<path>.npy``: the tensors of the pieces every trainer has alike (model, optimizer), written by rank 0
  (``model.layers.0.weight.npy``);
* ``rank<r>.<piece>.<path>.npy``: the tensors of the pieces each trainer holds for itself
  (:class:`~distgnn.train.checkpoint_pieces.PerRank`), written by that trainer;
* ``dist.<policy>.<tensor>.p<m>.npy``: machine ``m``'s rows of every DistEmbedding and of every state
  DistTensor of its sparse optimizer, written by machine ``m``'s main server, all machines in parallel
  (:mod:`distgnn.server.checkpoint_ops`);
* ``state.json``: step, epoch, every piece's state with its tensors replaced by references to their files
  (:mod:`distgnn.train.state_codec`), per rank for per-rank pieces, the graph's identity and the job's facts;
* ``manifest.json`` (written last): size and sha256 of every file.

No pickle anywhere. The directory is assembled as ``.staging-step-<n>`` and renamed when complete
(:mod:`distgnn.store.checkpoint_files`); the last ``keep`` are kept. With one trainer on CPU a resumed run ends
bit-identical to one never interrupted (tests/train/test_checkpoint_resume.py).

Every rank calls :meth:`Checkpointer.maybe_save` (or :meth:`Checkpointer.save`) with the same piece names and
:meth:`Checkpointer.resume` once before training; both are collective (torch.distributed when initialized).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from distgnn.client.context import DistContext
from distgnn.errors import CheckpointError, ConfigError
from distgnn.store import checkpoint_files as cio
from distgnn.train import collective
from distgnn.train.checkpoint_pieces import (
    DistState,
    PerRank,
    Stateful,
    describe_tensor,
    graph_identity,
    module_mismatch,
)
from distgnn.train.state_codec import decode, encode, from_numpy, references, torch_dtype

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
MANIFEST = "manifest.json"
STATE = "state.json"
POSITION = "position"  # the per-rank piece whose state says where a resumed run continues ({"epoch", "batch"})


@dataclass(frozen=True)
class Position:
    """Where a (resumed) run continues: ``step`` optimizer steps are done, and ``batch`` batches of ``epoch``.

    ``path`` is the checkpoint it came from (None for a fresh start).
    """

    step: int = 0
    epoch: int = 0
    batch: int = 0
    path: Path | None = None


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


def _on_every_rank(action, what: str) -> Any:
    """Runs ``action`` (None: nothing to do on this rank) and returns its result; raises CheckpointError on every
    rank when it failed on any (the others would otherwise wait for it forever)."""
    result, error = None, None
    if action is not None:
        try:
            result = action()
        except Exception as exc:
            error = str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
            log.exception("%s failed", what)
    failed = [(r, e) for r, e in enumerate(collective.all_gather_objects(error)) if e]
    if failed:
        raise CheckpointError(f"{what} failed on rank {failed[0][0]}: {failed[0][1]}")
    return result


def _split(pieces: dict[str, Stateful]) -> tuple[dict[str, Stateful], dict[str, Stateful], DistState | None]:
    """``(shared, per_rank, dist)``: the pieces rank 0 saves, those every rank saves, the server-side one."""
    for name, piece in pieces.items():
        if not isinstance(piece, Stateful):
            raise CheckpointError(f"checkpoint piece {name!r} ({type(piece).__name__}) has no state_dict()")
    shared = {k: v for k, v in pieces.items() if not isinstance(v, PerRank)}
    own = {k: v for k, v in pieces.items() if isinstance(v, PerRank)}
    found = [v for v in shared.values() if isinstance(v, DistState)]
    if len(found) > 1:
        raise CheckpointError("a checkpoint takes one DistState piece (all embeddings and sparse optimizers)")
    return shared, own, found[0] if found else None


class Checkpointer:
    """Saves a job's pieces every ``every_n_steps`` optimizer steps into ``directory``, keeping the last ``keep``.

    Args:
        directory: the checkpoint root: a path on a shared filesystem, or the same path on every machine
            (each machine's main server writes its rows there; rank 0 writes the rest; a trainer whose
            per-rank pieces hold tensors writes them there too, so such jobs need a shared root).
        every_n_steps: save when the global step count is a multiple of it (0: never; ``save`` still works).
        keep: how many checkpoints to keep (the oldest are removed after a new one is complete).
        context: the job's DistContext; by default the one of the first DistTensor saved.
        facts: JSON-able facts about the job a checkpoint must have been taken for (the stream's size, the
            parallelism): resuming under other facts is refused.
    """

    def __init__(
        self,
        directory: str | Path,
        every_n_steps: int,
        keep: int = 2,
        context: DistContext | None = None,
        facts: dict | None = None,
    ) -> None:
        if every_n_steps < 0 or keep < 1:
            raise ConfigError(f"need every_n_steps >= 0 and keep >= 1, got {every_n_steps} and {keep}")
        self.root = Path(directory).absolute()
        self.every_n_steps = every_n_steps
        self.keep = keep
        self.context = context
        self.facts = json.loads(json.dumps(facts)) if facts is not None else None
        self.last_save_s = 0.0

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

    def maybe_save(self, step: int, epoch: int, pieces: dict[str, Stateful]) -> Path | None:
        """Save when ``step`` (optimizer steps done so far, counted over all epochs) is a multiple of
        ``every_n_steps``; returns the checkpoint's path then, else None. Call it on every rank after
        the optimizer steps (dense and sparse) of a batch."""
        if self.every_n_steps == 0 or step == 0 or step % self.every_n_steps:
            return None
        return self.save(step, epoch, pieces)

    def save(self, step: int, epoch: int, pieces: dict[str, Stateful]) -> Path:
        """Save ``pieces`` now (collective: the same names on every rank); returns the checkpoint's path."""
        start = time.perf_counter()
        rank, world = collective.world()
        shared, own, dist_state = _split(pieces)
        if dist_state is not None:
            dist_state.flush()
        _agree_on_step(step)
        what = f"saving the checkpoint of step {step}"
        staging = cio.STAGING_PREFIX + cio.checkpoint_name(step)
        _on_every_rank((lambda: self._prepare_staging(staging)) if rank == 0 else None, what)
        mine = _on_every_rank(lambda: self._write_own(staging, rank, own), what)
        ranks = collective.all_gather_objects(mine)
        ctx = self.context or (dist_state.context() if dist_state is not None else None)

        def write() -> str:
            return str(self._write(step, epoch, staging, shared, dist_state, ctx, ranks, world))

        path = Path(collective.broadcast_object(_on_every_rank(write if rank == 0 else None, what)))
        self.last_save_s = time.perf_counter() - start
        log.info("checkpoint of step %d written to %s in %.2fs", step, path, self.last_save_s)
        return path

    def _prepare_staging(self, staging: str) -> None:
        for stale in self.root.glob(cio.STAGING_PREFIX + "step-*"):  # left by a save that crashed
            log.warning("removing %s, an incomplete checkpoint", stale)
            cio.remove_checkpoint(str(self.root), stale.name)
        cio.prepare_staging(str(self.root), staging)

    def _write_own(self, staging: str, rank: int, own: dict[str, Stateful]) -> dict:
        """This rank's per-rank pieces: their tensors written into ``staging``; returns their trees and files."""
        states, files = {}, {}
        for name, piece in own.items():
            states[name], arrays = encode(piece.state_dict(), f"rank{rank}.{name}")
            for stem, array in arrays.items():
                files[f"{stem}.npy"] = cio.write_new_file(cio.confined(str(self.root), staging, f"{stem}.npy"), array)
        return {"state": states, "files": files}

    def _write(self, step, epoch, staging, shared, dist_state, ctx, ranks, world) -> Path:
        root = str(self.root)
        staged = cio.confined(root, staging)
        if dist_state is not None:  # the servers write their rows while this rank writes the rest
            dist_state.checkpoint_dir(root, staging, "prepare")
            pending = dist_state.send_save(root, staging)
        files: dict[str, dict] = {}
        states = {}
        for name, piece in shared.items():
            states[name], arrays = encode(piece.state_dict(), name)
            for stem, array in arrays.items():
                files[f"{stem}.npy"] = cio.write_new_file(staged / f"{stem}.npy", array)
        for mine in ranks:
            files.update(mine["files"])
        dist_files = dist_state.wait_saved(pending) if dist_state is not None else {}
        state = {
            "format": FORMAT_VERSION,
            "step": step,
            "epoch": epoch,
            "world_size": world,
            "graph": graph_identity(ctx) if ctx is not None else None,
            "facts": self.facts,
            "pieces": states,
            "ranks": [mine["state"] for mine in ranks],
            "dist_tensors": [describe_tensor(t) for t in dist_state.tensors()] if dist_state is not None else [],
        }
        files[STATE] = cio.write_new_file(staged / STATE, data=json.dumps(state).encode())
        manifest = {"format": FORMAT_VERSION, "step": step, "files": files, "dist_files": dist_files}
        cio.write_new_file(staged / MANIFEST, data=json.dumps(manifest, indent=1).encode())
        cio.fsync_dir(staged)
        path = cio.commit_staging(root, staging)
        if dist_state is not None:  # machines whose root is their own disk rename their staging directory too
            dist_state.checkpoint_dir(root, staging, "commit")
        for old in self.checkpoints()[: -self.keep]:
            cio.remove_checkpoint(root, old.name)
            if dist_state is not None:
                dist_state.checkpoint_dir(root, old.name, "remove")
        return path

    # -- resuming

    def resume(
        self, spec: str | Path | None, pieces: dict[str, Stateful], batches_per_epoch: int | None = None
    ) -> Position:
        """Restore ``pieces`` from checkpoint ``spec`` (collective) and return where to continue.

        ``spec``: None (start fresh), ``"auto"`` (the latest checkpoint under the root, or a fresh start when
        there is none), or the path of a checkpoint directory. Everything is checked first (checksums, the job's
        facts, graph, partition count, trainer count, piece names, parameter names and shapes, tensor shapes); a
        mismatch raises CheckpointError on every rank and changes nothing. Build every piece exactly as for a
        fresh run before calling it. ``batches_per_epoch``: where the loop takes fewer batches per epoch than the
        loader has (a cap), a checkpoint taken at the cap continues with the next epoch (the loader too).
        """
        if spec is None:
            return Position()
        rank, world = collective.world()
        shared, own, dist_state = _split(pieces)
        reply: dict = {"error": None}
        arrays: dict[str, np.ndarray] = {}
        if rank == 0:
            try:
                reply, arrays = self._read(spec, shared, own, dist_state, world)
            except Exception as exc:
                reply = {"error": f"{type(exc).__name__}: {exc}" if not isinstance(exc, CheckpointError) else str(exc)}
        reply = collective.broadcast_object(reply)
        if reply["error"]:
            raise CheckpointError(reply["error"])
        if reply.get("path") is None:
            log.info("no checkpoint under %s: starting fresh", self.root)
            return Position()
        state, path = reply["state"], Path(reply["path"])
        for name, piece in shared.items():
            tree = state["pieces"][name]
            piece.load_state_dict(decode(tree, self._broadcast_arrays(tree, arrays)))
        mine = state["ranks"][rank]
        position = {"epoch": state["epoch"], "batch": 0}
        for name, piece in own.items():
            loaded = {
                _stem(r): np.load(path / f"{_stem(r)}.npy", mmap_mode="r", allow_pickle=False)
                for r in references(mine[name])
            }
            value = decode(mine[name], loaded)
            if name == POSITION:
                position = {"epoch": int(value["epoch"]), "batch": int(value["batch"])}
                if batches_per_epoch is not None and position["batch"] >= batches_per_epoch:
                    position.update(epoch=position["epoch"] + 1, batch=0)
                value = {**value, **position}
            piece.load_state_dict(value)
        log.info("resumed from %s (step %d)", path, state["step"])
        return Position(state["step"], position["epoch"], position["batch"], path)

    def _find(self, spec: str | Path) -> Path | None:
        if str(spec) == "auto":
            return self.latest()
        path = Path(spec).absolute()
        if not (path / MANIFEST).is_file():
            found = ", ".join(p.name for p in self.checkpoints()) or "none"
            raise CheckpointError(
                f"{path} is not a complete checkpoint (no {MANIFEST}); pass a step-<n> directory or 'auto' "
                f"(checkpoints under {self.root}: {found})"
            )
        return path

    def _read(self, spec, shared, own, dist_state, world) -> tuple[dict, dict[str, np.ndarray]]:
        """Rank 0: find and check the checkpoint (every file's checksum), load the servers' rows; returns the
        reply for every rank and the shared pieces' arrays by file stem."""
        path = self._find(spec)
        if path is None:
            return {"error": None, "path": None}, {}
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
        ctx = self.context or (dist_state.context() if dist_state is not None else None)
        self._check_compatible(path, state, shared, own, dist_state, ctx, world)
        arrays = {}
        for name in shared:
            for ref in references(state["pieces"][name]):
                stem = _stem(ref)
                arrays[stem] = cio.read_verified_npy(path / f"{stem}.npy", files.get(f"{stem}.npy", {}))
        for mine in state["ranks"]:  # every trainer's own files: each reads its own after this check
            for name in own:
                for ref in references(mine[name]):
                    stem = _stem(ref)
                    cio.verify_file(path / f"{stem}.npy", files.get(f"{stem}.npy", {}))
        if dist_state is not None:
            dist_state.load_rows(path, manifest["dist_files"])
        return {"error": None, "path": str(path), "state": state}, arrays

    def _check_compatible(self, path, state, shared, own, dist_state, ctx, world) -> None:
        if self.facts is not None and state.get("facts") != self.facts:
            raise CheckpointError(f"checkpoint {path} was taken for {state.get('facts')}, this job is {self.facts}")
        if state["world_size"] != world:
            raise CheckpointError(f"{path} was made by {state['world_size']} trainers, this job has {world}")
        if ctx is not None and state["graph"] is not None:
            here, saved = graph_identity(ctx), state["graph"]
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
        saved_names = sorted(state["pieces"]) + sorted(state["ranks"][0])
        if saved_names != sorted(shared) + sorted(own):
            raise CheckpointError(f"{path} holds pieces {saved_names}, this job has {sorted(shared) + sorted(own)}")
        for name, piece in shared.items():
            reason = module_mismatch(piece, state["pieces"][name]) if isinstance(piece, torch.nn.Module) else None
            if reason:
                raise CheckpointError(f"{path} holds another model: {reason}")
        if dist_state is not None:
            name = next(k for k, v in shared.items() if v is dist_state)
            reason = dist_state.check(decode(state["pieces"][name], {}), state["dist_tensors"])
            if reason:
                raise CheckpointError(f"{path} {reason}")

    @staticmethod
    def _broadcast_arrays(tree: Any, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Rank 0's arrays of ``tree`` as tensors on every rank (dtype and shape from the tree's references)."""
        rank, world = collective.world()
        out = {}
        for ref in references(tree):
            stem = _stem(ref)
            if rank == 0:
                t = (
                    from_numpy(arrays[stem], ref["dtype"])
                    if "__tensor__" in ref
                    else torch.from_numpy(np.array(arrays[stem]))
                )
            elif "__tensor__" in ref:
                t = torch.empty(ref["shape"], dtype=torch_dtype(ref["dtype"]))
            else:
                t = torch.from_numpy(np.empty(ref["shape"], dtype=np.dtype(ref["dtype"])))
            if world > 1:
                moved = t.to(collective.collective_device())
                dist.broadcast(moved, 0)
                t = moved.cpu()
            out[stem] = t
        return out


def _stem(ref: dict) -> str:
    """The file stem a tensor or array reference of :func:`~distgnn.train.state_codec.encode` names."""
    return ref["__tensor__"] if "__tensor__" in ref else ref["__array__"]
