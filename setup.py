"""Builds distgnn's C++ CPU extension and lists its packages; everything else is declared in pyproject.toml.

The package list is computed from the folders: ``distgnn/`` and everything under it, plus the two separate
programs at the top, ``partition/`` and ``launch/``, installed as ``distgnn.partition`` and ``distgnn.launch``
(``package_dir`` maps them; neither is importable as a top-level ``partition`` or ``launch``).

The compiler flags live in distgnn/native/cpu.py (shared with the
build-on-first-use fallback); that file is loaded by path because distgnn
itself cannot be imported before it is installed.
"""

import importlib.util
from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension
from setuptools import setup

ROOT = Path(__file__).resolve().parent
# Top-level folders installed inside the distgnn package: folder -> package name.
MAPPED = {"partition": "distgnn.partition", "launch": "distgnn.launch"}


def packages() -> tuple[list[str], dict[str, str]]:
    """Every package under ``distgnn/`` and the mapped folders (a folder with an ``__init__.py``), and the
    ``package_dir`` entries that put the mapped folders inside ``distgnn``."""
    found = []
    roots = {"distgnn": "distgnn", **MAPPED}
    for folder, package in roots.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT / folder)
            found.append(".".join([package, *rel.parts]))
    return found, {package: folder for folder, package in MAPPED.items()}


_spec = importlib.util.spec_from_file_location("_distgnn_build", ROOT / "distgnn" / "native" / "cpu.py")
_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_build)

cpu_kernels = Pybind11Extension(
    _build.EXTENSION_NAME,
    [str(p.relative_to(ROOT)) for p in _build.source_files(ROOT / "csrc" / "cpu")],
    include_dirs=["csrc/cpu"],
    depends=sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc" / "cpu").glob("*.h")),
    define_macros=_build.build_macros(ROOT / "csrc" / "cpu"),
    cxx_std=17,
    extra_compile_args=_build.COMPILE_ARGS,
    extra_link_args=_build.LINK_ARGS,
)

PACKAGES, PACKAGE_DIR = packages()
setup(ext_modules=[cpu_kernels], packages=PACKAGES, package_dir=PACKAGE_DIR)
