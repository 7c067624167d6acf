"""Building and loading distgnn's C++ CPU extension ``distgnn._cpu_kernels``.

The extension (``csrc/cpu``) holds every CPU kernel: neighbour sampling, relabelling, parallel gathers, and
the nn kernels (mean aggregation, fused ReLU + dropout). :func:`extension` is how the rest of distgnn gets it.
``pip install`` builds it through ``setup.py`` with the flags defined here.
When it is missing (a source checkout on ``PYTHONPATH``, a failed build),
:func:`load_extension` compiles it once into a cache directory keyed by a hash
of the sources and flags, and loads it from there on later imports. Only the
standard library and setuptools are imported at module level, because
``setup.py`` loads this file before anything else is installed.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib
import importlib.machinery
import importlib.util
import logging
import os
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

EXTENSION_NAME = "distgnn._cpu_kernels"
_MODULE = "_cpu_kernels"
SOURCE_DIR = Path(__file__).resolve().parents[2] / "csrc" / "cpu"
COMPILE_ARGS = ["-O3", "-pthread", "-std=c++17", "-fvisibility=hidden"]
LINK_ARGS = ["-pthread"]
CACHE_ENV = "DISTGNN_CACHE_DIR"

logger = logging.getLogger(__name__)


def source_files(source_dir: Path = SOURCE_DIR) -> list[Path]:
    """The extension's translation units, sorted (headers are not listed)."""
    return sorted(source_dir.glob("*.cpp"))


def load_extension() -> ModuleType:
    """Import the installed extension, or build it once into the cache and load that.

    In a source checkout, an installed build of older sources (its
    ``build_key`` differs) is passed over for a cached build of the current ones.

    Raises:
        ExtensionBuildError: the extension is not installed and cannot be built here.
    """
    try:
        module = importlib.import_module(EXTENSION_NAME)
    except ImportError as err:
        logger.debug("installed %s not importable (%s); using the build cache", EXTENSION_NAME, err)
        return load_cached_build()
    if source_files() and getattr(module, "build_key", None) != build_key():
        logger.warning(
            "installed C++ kernels %s was built from other sources than %s; using a build of the current "
            "sources (`pip install -e .` refreshes the installed one)",
            module.__file__,
            SOURCE_DIR,
        )
        return load_cached_build()
    return module


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "distgnn"
    return Path(root)


def build_key(source_dir: Path = SOURCE_DIR) -> str:
    """Hash of everything that changes the binary: sources, headers, flags, interpreter ABI.

    Compiled into the module as ``build_key`` (see :func:`build_macros`).
    """
    digest = hashlib.sha256()
    for path in sorted(source_dir.glob("*.cpp")) + sorted(source_dir.glob("*.h")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    digest.update(" ".join(COMPILE_ARGS + LINK_ARGS).encode())
    digest.update(str(sysconfig.get_config_var("EXT_SUFFIX")).encode())
    return digest.hexdigest()[:16]


def build_macros(source_dir: Path = SOURCE_DIR) -> list[tuple[str, str]]:
    return [("DISTGNN_BUILD_KEY", f'"{build_key(source_dir)}"')]


def load_cached_build(source_dir: Path = SOURCE_DIR, root: Path | None = None) -> ModuleType:
    """Load ``_cpu_kernels`` from the cache, compiling it first if it is not there."""
    from distgnn.errors import ExtensionBuildError

    if not source_files(source_dir):
        raise ExtensionBuildError(
            f"distgnn's C++ kernels is not installed and its sources are not at {source_dir}; "
            "reinstall distgnn with `pip install distgnn` (or `pip install -e .` in a checkout)"
        )
    target_dir = (root or cache_dir()) / f"cpu_kernels_{build_key(source_dir)}"
    target = target_dir / (_MODULE + importlib.machinery.EXTENSION_SUFFIXES[0])
    if not target.exists():
        target_dir.mkdir(parents=True, exist_ok=True)
        # Several processes may start at once; one compiles, the others wait.
        with open(target_dir / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not target.exists():
                _compile(source_dir, target)
    return _load_from(target)


def _compile(source_dir: Path, target: Path) -> None:
    from distgnn.errors import ExtensionBuildError

    logger.warning("building distgnn C++ kernels (once) into %s ...", target.parent)
    try:
        from setuptools import Distribution, Extension
        from setuptools.command.build_ext import build_ext
    except ImportError as err:
        raise ExtensionBuildError(f"cannot build distgnn's C++ kernels: setuptools is missing ({err})") from err
    include_dir = pybind11_include_dir()
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        extension = Extension(
            _MODULE,
            [str(p) for p in source_files(source_dir)],
            include_dirs=[include_dir, str(source_dir)],
            define_macros=build_macros(source_dir),
            language="c++",
            extra_compile_args=COMPILE_ARGS,
            extra_link_args=LINK_ARGS,
        )
        command = build_ext(Distribution({"name": "distgnn-cpu-kernels", "ext_modules": [extension]}))
        command.build_lib = tmp
        command.build_temp = os.path.join(tmp, "obj")
        try:
            command.ensure_finalized()
            command.run()
        except Exception as err:
            raise ExtensionBuildError(
                f"building distgnn's C++ kernels failed: {err}. It needs a C++17 compiler "
                "(g++ >= 9) and pybind11 headers; install them or reinstall distgnn with `pip install -e .`"
            ) from err
        os.replace(command.get_ext_fullpath(_MODULE), target)
    logger.warning("built distgnn C++ kernels: %s", target)


def pybind11_include_dir() -> str:
    """pybind11's headers: the pybind11 package, else the copy torch ships."""
    from distgnn.errors import ExtensionBuildError

    try:
        import pybind11

        return pybind11.get_include()
    except ImportError:
        pass
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin is not None:
        torch_include = Path(spec.origin).parent / "include"
        if (torch_include / "pybind11" / "pybind11.h").exists():
            return str(torch_include)
    raise ExtensionBuildError(
        "cannot build distgnn's C++ kernels: pybind11 headers not found; `pip install pybind11` "
        "or reinstall distgnn with `pip install -e .`"
    )


def _load_from(path: Path) -> ModuleType:
    from distgnn.errors import ExtensionBuildError

    # The last name component selects the init function (PyInit__cpu_kernels);
    # the build-specific prefix keeps Python from handing back another build
    # already imported under the same name.
    spec = importlib.util.spec_from_file_location(f"_distgnn_build_{path.parent.name}.{_MODULE}", path)
    if spec is None or spec.loader is None:
        raise ExtensionBuildError(f"cannot load the cached C++ kernels at {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as err:
        raise ExtensionBuildError(
            f"the cached C++ kernels at {path} does not load ({err}); delete {path.parent} to rebuild it"
        ) from err
    return module


@functools.cache
def extension() -> ModuleType:
    """The loaded CPU extension, once per process (raises ExtensionBuildError if it cannot be had)."""
    return load_extension()
