"""Files of a checkpoint on disk: names, confined paths, ``.npy`` arrays written with a checksum.

Shared by the trainer side (``distgnn.train.checkpoint``) and the servers' checkpoint
ops (``distgnn.server.checkpoint_ops``), which write their partition's rows of
each distributed tensor. A checkpoint is a directory ``step-<n>`` under a root;
it is assembled in ``.staging-step-<n>`` and renamed into place when complete,
so a crash while writing leaves a staging directory, never a checkpoint that
loads but is wrong. Arrays are plain ``.npy`` (never pickled); every file's
size and sha256 go into the manifest and are checked before anything is loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np

from distgnn.errors import CheckpointError

STAGING_PREFIX = ".staging-"
_DIR_NAME = re.compile(r"^(\.staging-)?step-\d{1,12}$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,250}\.(npy|json)$")
_HASH_CHUNK = 4 << 20


def checkpoint_name(step: int) -> str:
    """The directory name of the checkpoint taken after global step ``step``."""
    return f"step-{step:08d}"


def check_dir_name(name: object) -> str:
    if not isinstance(name, str) or not _DIR_NAME.match(name):
        raise CheckpointError(f"a checkpoint directory is named step-<n> or .staging-step-<n>, got {name!r}")
    return name


def check_file_name(name: object) -> str:
    if not isinstance(name, str) or not _FILE_NAME.match(name):
        raise CheckpointError(f"a checkpoint file name must match {_FILE_NAME.pattern} (no directories), got {name!r}")
    return name


def confined(root: object, dir_name: object, file_name: object | None = None) -> Path:
    """``root/dir_name[/file_name]``, refusing a relative root or anything that resolves outside ``root``."""
    if not isinstance(root, str) or not os.path.isabs(root):
        raise CheckpointError(f"the checkpoint root must be an absolute path, got {root!r}")
    path = Path(root) / check_dir_name(dir_name)
    if file_name is not None:
        path = path / check_file_name(file_name)
    real_root = os.path.realpath(root)
    # A symlinked step directory (or file) could point anywhere: the resolved path must stay inside.
    if not os.path.realpath(path).startswith(real_root + os.sep):
        raise CheckpointError(f"{path} resolves outside the checkpoint root {root}")
    return path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _HashingFile:
    """A write-only file object that hashes and counts what goes through it."""

    def __init__(self, fd: int):
        self._file = os.fdopen(fd, "wb", buffering=1 << 20)
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.sha256.update(view)
        self.size += len(view)
        return self._file.write(view)

    def finish(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()


def write_new_file(path: Path, array: np.ndarray | None = None, data: bytes | None = None) -> dict:
    """Create ``path`` (never overwriting, never through a symlink), write ``array`` as ``.npy`` or the raw
    ``data``, fsync it; returns its manifest entry ``{"bytes": int, "sha256": hex str}``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    out = _HashingFile(fd)
    try:
        if array is not None:
            # Not a real file object, so numpy writes in chunks through out.write (no full copy in memory).
            np.lib.format.write_array(out, np.asarray(array), allow_pickle=False)
        else:
            out.write(data)
        out.finish()
    except BaseException:
        out._file.close()
        path.unlink(missing_ok=True)
        raise
    return {"bytes": out.size, "sha256": out.sha256.hexdigest()}


def verify_file(path: Path, entry: dict) -> None:
    """Raise CheckpointError unless ``path`` has the size and sha256 that ``entry`` records."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file {path} is missing; the checkpoint is incomplete") from None
    if size != entry.get("bytes"):
        raise CheckpointError(
            f"checkpoint file {path} has {size} bytes, the manifest says {entry.get('bytes')}: truncated or replaced"
        )
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    if digest.hexdigest() != entry.get("sha256"):
        raise CheckpointError(f"checkpoint file {path} fails its sha256 check: it was modified after it was written")


def read_verified_npy(path: Path, entry: dict) -> np.ndarray:
    """The array in ``path`` (memory-mapped, read-only) after its size and checksum match ``entry``."""
    verify_file(path, entry)
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        raise CheckpointError(f"checkpoint file {path} is not a plain .npy array: {exc}") from None


def read_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """Every ``.npy`` file of the checkpoint at ``path`` by file name, each checked against the manifest (size
    and sha256) and memory-mapped read-only: for tools and tests that look inside a checkpoint."""
    path = Path(path)
    try:
        files = json.loads((path / "manifest.json").read_text())["files"]
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{path} is not a readable checkpoint: {exc}") from None
    return {name: read_verified_npy(path / name, entry) for name, entry in files.items() if name.endswith(".npy")}


def prepare_staging(root: str, staging: str) -> Path:
    """An empty ``root/staging`` directory (a leftover of a crashed save is removed first)."""
    path = confined(root, staging)
    if not staging.startswith(STAGING_PREFIX):
        raise CheckpointError(f"{staging!r} is not a staging directory name")
    Path(root).mkdir(parents=True, exist_ok=True)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    return path


def commit_staging(root: str, staging: str) -> Path:
    """Rename ``root/staging`` to its final name; a no-op where another process already did (shared root)."""
    src = confined(root, staging)
    if not staging.startswith(STAGING_PREFIX):
        raise CheckpointError(f"{staging!r} is not a staging directory name")
    dst = confined(root, staging[len(STAGING_PREFIX) :])
    if src.is_dir():
        if dst.exists():
            shutil.rmtree(dst)  # an older checkpoint of the same step (a run restarted before it)
        os.rename(src, dst)
        fsync_dir(Path(root))
    elif not dst.is_dir():
        raise CheckpointError(f"neither {src} nor {dst} exists: nothing to commit")
    return dst


def remove_checkpoint(root: str, name: str) -> None:
    path = confined(root, name)
    if path.is_dir():
        shutil.rmtree(path)
