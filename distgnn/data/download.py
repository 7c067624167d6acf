"""Planetoid files fetched into a cache directory when no ``--data-dir`` holds them, as PyG and DGL do.

``planetoid_dir(name)`` returns a directory with ``ind.<name>.*``: ``$DISTGNN_DATA_DIR/planetoid`` or
``~/.cache/distgnn/datasets/planetoid``, downloading what is missing from the Planetoid authors' repository
(``DISTGNN_PLANETOID_URL`` overrides the base address, e.g. a mirror). Each file is written under a temporary
name and renamed once complete, so an interrupted download leaves nothing that looks finished. Files with a
known sha256 (Cora's) are checked before they are kept; every file is checked again by the restricted
unpickler when it is read. Without a network the error names the directory to put the files in.
"""

from __future__ import annotations

import hashlib
import logging
import os
import urllib.error
import urllib.request
from pathlib import Path

from distgnn.errors import InputError

log = logging.getLogger(__name__)

BASE_URL = "https://github.com/kimiyoung/planetoid/raw/master/data"
URL_ENV = "DISTGNN_PLANETOID_URL"
DATA_DIR_ENV = "DISTGNN_DATA_DIR"
SUFFIXES = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")
TIMEOUT_S = 60.0
SHA256 = {
    "ind.cora.allx": "9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543",
    "ind.cora.ally": "2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71",
    "ind.cora.graph": "58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d",
    "ind.cora.test.index": "297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875",
    "ind.cora.tx": "b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a",
    "ind.cora.ty": "41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad",
    "ind.cora.x": "23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab",
    "ind.cora.y": "94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1",
}


def cache_dir() -> Path:
    """Where downloaded datasets go: ``$DISTGNN_DATA_DIR`` or ``~/.cache/distgnn/datasets``."""
    root = os.environ.get(DATA_DIR_ENV)
    return Path(root) if root else Path.home() / ".cache" / "distgnn" / "datasets"


def planetoid_files(name: str) -> list[str]:
    return [f"ind.{name}.{suffix}" for suffix in SUFFIXES]


def planetoid_dir(name: str, data_dir: str | os.PathLike | None = None) -> Path:
    """The directory with ``ind.<name>.*``: ``data_dir`` as given (never downloaded into), or the cache,
    filled from the Planetoid repository on first use."""
    if data_dir is not None:
        return Path(data_dir)
    directory = cache_dir() / "planetoid"
    missing = [f for f in planetoid_files(name) if not (directory / f).exists()]
    if missing:
        directory.mkdir(parents=True, exist_ok=True)
        base = os.environ.get(URL_ENV, BASE_URL).rstrip("/")
        log.info("downloading %s (%d files) from %s into %s", name, len(missing), base, directory)
        for file_name in missing:
            _download(f"{base}/{file_name}", directory / file_name, name)
    return directory


def _download(url: str, path: Path, name: str) -> None:
    partial = path.with_name(path.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as reply, open(partial, "wb") as out:
            digest = hashlib.sha256()
            while chunk := reply.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except (urllib.error.URLError, OSError) as err:
        partial.unlink(missing_ok=True)
        raise InputError(
            f"could not download {url} ({err}); offline? put the files {', '.join(planetoid_files(name))} "
            f"in {path.parent} or pass --data-dir DIR"
        ) from None
    expected = SHA256.get(path.name)
    if expected is not None and digest.hexdigest() != expected:
        partial.unlink(missing_ok=True)
        raise InputError(f"{url}: sha256 {digest.hexdigest()} where {expected} was expected; nothing was kept")
    partial.replace(path)
