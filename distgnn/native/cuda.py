"""Builds (on first use) and loads distgnn's CUDA extensions from ``csrc/cuda``.

Four extensions: the gather (``distgnn_gather_cuda``: the feature cache's one-launch gather, planning, IPC
and host-memory helpers; :func:`gather_kernels`), the graph kernels (``distgnn_graph_cuda``: neighbour
sampling, relabelling and the nn mean aggregation; :func:`graph_kernels`), the fused nn ops
(``distgnn_nn_cuda``: ReLU + dropout; :func:`nn_kernels`) and the temporal sampler
(``distgnn_temporal_cuda``; :func:`temporal_kernels`).
The build goes through ``torch.utils.cpp_extension.load`` into a cache directory per torch version, CUDA
version and GPU architecture (``~/.cache/distgnn/extensions/...``), so a machine builds it once (about a
minute) and later processes load the cached library. :func:`cuda_extension` does this for each of them.
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
GATHER_SOURCES = ("binding.cpp", "gather.cu", "gather_cached.cu", "plan.cu")
GATHER_EXTENSION = "distgnn_gather_cuda"
GRAPH_SOURCES = ("graph_binding.cpp", "sample.cu", "relabel.cu", "aggregate.cu")
GRAPH_EXTENSION = "distgnn_graph_cuda"
NN_SOURCES = ("nn_binding.cpp", "relu_dropout.cu")
NN_EXTENSION = "distgnn_nn_cuda"
TEMPORAL_SOURCES = ("temporal_sample.cu",)
TEMPORAL_EXTENSION = "distgnn_temporal_cuda"


def build_directory(prefix: str = "gather") -> Path:
    """Where extension ``prefix`` (default: the gather's) is built and cached for this torch/CUDA/GPU combination."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "distgnn" / "extensions"
    major, minor = torch.cuda.get_device_capability()
    tag = f"torch{torch.__version__.split('+')[0]}-cu{torch.version.cuda}-sm{major}{minor}"
    return root / f"{prefix}-{tag}"


@functools.cache
def _build_once(name: str, sources: tuple[str, ...], prefix: str) -> ModuleType | ExtensionBuildError:
    """Loads the extension, or returns (not raises) why it cannot be, so a failure is remembered too."""
    if not torch.cuda.is_available() or torch.version.cuda is None:
        return ExtensionBuildError(f"CUDA is not available to torch, so the {prefix} extension cannot be built")
    missing = [source for source in sources if not (SOURCE_DIR / source).is_file()]
    if missing:
        return ExtensionBuildError(
            f"CUDA sources {missing} not found under {SOURCE_DIR}; install distgnn from a source checkout"
        )
    from torch.utils import cpp_extension

    build_dir = build_directory(prefix)
    build_dir.mkdir(parents=True, exist_ok=True)
    if not (build_dir / f"{name}.so").exists():
        logger.warning(
            "building the distgnn CUDA %s extension in %s (first use here, about a minute)", prefix, build_dir
        )
    try:
        module = cpp_extension.load(
            name=name,
            sources=[str(SOURCE_DIR / source) for source in sources],
            extra_cflags=["-O3"],
            extra_cuda_cflags=["-O3", "-lineinfo"],
            build_directory=str(build_dir),
            verbose=logger.isEnabledFor(logging.DEBUG),
        )
    except (RuntimeError, OSError, ImportError) as exc:
        logger.warning("building the CUDA %s extension failed: %s", prefix, exc)
        return ExtensionBuildError(f"building the CUDA {prefix} extension in {build_dir} failed: {exc}")
    logger.info("loaded the distgnn CUDA %s extension from %s", prefix, build_dir)
    return module


def cuda_extension(name: str, sources: tuple[str, ...], prefix: str) -> ModuleType:
    """Extension ``name`` built from ``sources`` in csrc/cuda into the cache directory ``prefix-<torch/CUDA/GPU>``.

    Built once per machine and loaded once per process; a failure is remembered too.

    Raises:
        ExtensionBuildError: CUDA is absent, a source is missing, or the build failed.
    """
    result = _build_once(name, sources, prefix)
    if isinstance(result, ExtensionBuildError):
        raise result
    return result


def gather_kernels() -> ModuleType:
    """The compiled gather extension; raises ExtensionBuildError when CUDA is absent or the build failed."""
    return cuda_extension(GATHER_EXTENSION, GATHER_SOURCES, "gather")


def gather_available() -> bool:
    """Whether the CUDA gather extension can be used in this process (builds it on first call)."""
    return not isinstance(_build_once(GATHER_EXTENSION, GATHER_SOURCES, "gather"), ExtensionBuildError)


def graph_kernels() -> ModuleType:
    """The compiled graph extension (sampling, relabel, mean aggregation); raises ExtensionBuildError when CUDA
    is absent or the build failed."""
    return cuda_extension(GRAPH_EXTENSION, GRAPH_SOURCES, "graph")


def nn_kernels() -> ModuleType:
    """The compiled fused nn extension (ReLU + dropout); raises ExtensionBuildError when CUDA is absent or the
    build failed."""
    return cuda_extension(NN_EXTENSION, NN_SOURCES, "nn")


def temporal_kernels() -> ModuleType:
    """The compiled temporal sampling extension; raises ExtensionBuildError when CUDA is absent or the build
    failed."""
    return cuda_extension(TEMPORAL_EXTENSION, TEMPORAL_SOURCES, "temporal")
