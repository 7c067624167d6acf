"""Checkpoints of temporal training: weights, optimizer, every memory copy's memory and mailbox, the position.

A checkpoint is a ``step-<n>`` directory of plain ``.npy`` files and a ``manifest.json`` listing each file's
size and sha256 (the files layer of :mod:`distgnn.store.checkpoint_files`: staged, then renamed into place, nothing
pickled). Rank 0 writes the weights, the optimizer state and the manifest; each memory copy's owner writes its
copy (``memory<c>.<field>.npy``); every trainer writes its negative sampler's random state
(``rng<rank>.npy``) and what else it holds (``trainer<rank>.<name>.npy``: under epoch parallelism, the batch in
flight). The position says where training stopped: epoch, and batches (epoch parallelism: steps) done in it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from distgnn.errors import CheckpointError
from distgnn.nn.temporal import NodeMemory
from distgnn.store.checkpoint_files import (
    checkpoint_name,
    commit_staging,
    prepare_staging,
    read_verified_npy,
    remove_checkpoint,
    write_new_file,
)

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Position:
    """Where a checkpoint was taken: after ``batch`` batches of epoch ``epoch`` (global ``step`` steps)."""

    step: int
    epoch: int
    batch: int


def _sha256(path: Path) -> dict:
    digest = hashlib.sha256(path.read_bytes())
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def save(
    root: str,
    position: Position,
    rank: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    owned: dict[int, NodeMemory],
    barrier: Callable[[], None],
    keep: int = 2,
    meta: dict | None = None,
    held: dict[str, np.ndarray] | None = None,
) -> Path:
    """Collective: every trainer calls it at the same position; returns the checkpoint's directory.

    Args:
        root: absolute checkpoint root, the same on every trainer.
        owned: the memory copies this trainer owns, by copy index.
        barrier: waits for every trainer (``torch.distributed.barrier`` in a job, a no-op alone).
        meta: extra JSON-able facts to check on resume (the stream's size, the parallelism).
        held: this trainer's own arrays by name (:func:`held_by` gives them back).
    """
    name = checkpoint_name(position.step)
    staging = ".staging-" + name
    if rank == 0:
        prepare_staging(root, staging)
    barrier()
    directory = Path(root) / staging
    for copy, memory in owned.items():
        for field, array in memory.state().items():
            write_new_file(directory / f"memory{copy}.{field}.npy", array)
    write_new_file(directory / f"rng{rank}.npy", generator.get_state().numpy())
    for name, array in (held or {}).items():
        write_new_file(directory / f"trainer{rank}.{name}.npy", array)
    if rank == 0:
        for key, value in model.state_dict().items():
            write_new_file(directory / f"model.{key}.npy", value.detach().cpu().numpy())
        state = optimizer.state_dict()
        for index, slots in state["state"].items():
            for key, value in slots.items():
                write_new_file(directory / f"optim.{index}.{key}.npy", torch.as_tensor(value).cpu().numpy())
    barrier()
    if rank == 0:
        files = {path.name: _sha256(path) for path in sorted(directory.glob("*.npy"))}
        groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.state_dict()["param_groups"]]
        manifest = {
            "position": position.__dict__,
            "param_groups": groups,
            "meta": meta or {},
            "files": files,
        }
        write_new_file(directory / MANIFEST, data=json.dumps(manifest, sort_keys=True).encode())
        commit_staging(root, staging)
        for old in sorted(p.name for p in Path(root).glob("step-*"))[:-keep]:
            remove_checkpoint(root, old)
    barrier()
    return Path(root) / name


def latest(root: str) -> Path | None:
    """The newest complete checkpoint under ``root``, or None."""
    found = sorted(p for p in Path(root).glob("step-*") if (p / MANIFEST).is_file())
    return found[-1] if found else None


@dataclass
class Loaded:
    """A checkpoint's contents, verified; arrays are read-only memory maps."""

    position: Position
    meta: dict
    files: dict[str, np.ndarray]
    param_groups: list[dict]


def load(path: str | Path) -> Loaded:
    """Reads and verifies the checkpoint at ``path`` (every file's size and sha256)."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{path} is not a checkpoint (no {MANIFEST}); pass a step-<n> directory or 'auto'")
    manifest = json.loads(manifest_path.read_text())
    files = {name: read_verified_npy(path / name, entry) for name, entry in manifest["files"].items()}
    return Loaded(Position(**manifest["position"]), manifest["meta"], files, manifest["param_groups"])


def restore(
    loaded: Loaded,
    rank: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    owned: dict[int, NodeMemory],
) -> None:
    """Puts ``loaded`` back into the model, optimizer, this trainer's generator and its memory copies."""
    files = loaded.files
    model.load_state_dict(
        {key[6:-4]: torch.from_numpy(np.array(a)) for key, a in files.items() if key.startswith("model.")}
    )
    state: dict[int, dict] = {}
    for name, array in files.items():
        if name.startswith("optim."):
            _, index, key, _ = name.split(".")
            state.setdefault(int(index), {})[key] = torch.from_numpy(np.array(array))
    own = optimizer.state_dict()
    groups = [
        dict(saved, params=g["params"]) for saved, g in zip(loaded.param_groups, own["param_groups"], strict=True)
    ]
    optimizer.load_state_dict({"state": state, "param_groups": groups})
    rng = files.get(f"rng{rank}.npy")
    if rng is None:
        raise CheckpointError(f"the checkpoint has no random state for trainer {rank}: it was taken by fewer trainers")
    generator.set_state(torch.from_numpy(np.array(rng)))
    for copy, memory in owned.items():
        try:
            memory.load_state({field: files[f"memory{copy}.{field}.npy"] for field in NodeMemory.FIELDS})
        except KeyError:
            raise CheckpointError(
                f"the checkpoint holds no memory copy {copy}: it was taken with fewer copies"
            ) from None


def held_by(loaded: Loaded, rank: int) -> dict[str, np.ndarray]:
    """The arrays trainer ``rank`` saved as ``held`` (empty when none)."""
    prefix = f"trainer{rank}."
    return {name[len(prefix) : -4]: array for name, array in loaded.files.items() if name.startswith(prefix)}
