"""Builds distgnn's C++ CPU extension; everything else is declared in pyproject.toml.

The compiler flags live in distgnn/native/cpu.py (shared with the
build-on-first-use fallback); that file is loaded by path because distgnn
itself cannot be imported before it is installed.
"""

import importlib.util
from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension
from setuptools import setup

ROOT = Path(__file__).resolve().parent
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

setup(ext_modules=[cpu_kernels])
