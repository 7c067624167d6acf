"""Builds (on first use) and loads the CUDA gather extension from ``csrc/cuda``.

The build goes through ``torch.utils.cpp_extension.load`` into a cache directory per torch version, CUDA
version and GPU architecture (``~/.cache/distgnn/extensions/...``), so a machine builds it once (about a
minute) and later processes load the cached library.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from types import ModuleType

import torch

from distgnn.errors import ExtensionBuildError

logger = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parents[2] / "csrc" / "cuda"
SOURCES = ("binding.cpp", "gather.cu", "plan.cu")
EXTENSION_NAME = "distgnn_gather_cuda"


def build_directory() -> Path:
    """Where the extension for this torch/CUDA/GPU combination is built and cached."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "distgnn" / "extensions"
    major, minor = torch.cuda.get_device_capability()
    tag = f"torch{torch.__version__.split('+')[0]}-cu{torch.version.cuda}-sm{major}{minor}"
    return root / f"gather-{tag}"


@functools.lru_cache(maxsize=1)
def _load_once() -> ModuleType | ExtensionBuildError:
    """Loads the extension, or returns (not raises) why it cannot be, so a failure is remembered too."""
    if not torch.cuda.is_available() or torch.version.cuda is None:
        return ExtensionBuildError("CUDA is not available to torch; the gather runs its torch reference path")
    missing = [name for name in SOURCES if not (SOURCE_DIR / name).is_file()]
    if missing:
        return ExtensionBuildError(
            f"CUDA sources {missing} not found under {SOURCE_DIR}; install distgnn from a source checkout"
        )
    from torch.utils import cpp_extension

    build_dir = build_directory()
    build_dir.mkdir(parents=True, exist_ok=True)
    if not (build_dir / f"{EXTENSION_NAME}.so").exists():
        logger.warning("building the distgnn CUDA gather extension in %s (first use here, about a minute)", build_dir)
    try:
        module = cpp_extension.load(
            name=EXTENSION_NAME,
            sources=[str(SOURCE_DIR / name) for name in SOURCES],
            extra_cflags=["-O3"],
            extra_cuda_cflags=["-O3", "-lineinfo"],
            build_directory=str(build_dir),
            verbose=logger.isEnabledFor(logging.DEBUG),
        )
    except (RuntimeError, OSError, ImportError) as exc:
        logger.warning("building the CUDA gather extension failed; gathers use the torch reference path: %s", exc)
        return ExtensionBuildError(f"building the CUDA gather extension in {build_dir} failed: {exc}")
    logger.info("loaded the distgnn CUDA gather extension from %s", build_dir)
    return module


def load_extension() -> ModuleType:
    """The compiled extension; raises ExtensionBuildError when CUDA is absent or the build failed."""
    result = _load_once()
    if isinstance(result, ExtensionBuildError):
        raise result
    return result


def extension_available() -> bool:
    """Whether the CUDA gather extension can be used in this process (builds it on first call)."""
    return not isinstance(_load_once(), ExtensionBuildError)
