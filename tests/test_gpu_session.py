"""benchmarks/gpu_session.py, the one driver of GPU-machine calls: its stages parse as bash and fit one call."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on this machine")
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_session.py"


def _session():
    spec = importlib.util.spec_from_file_location("gpu_session", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_stage_is_valid_bash_named_once_and_under_a_call() -> None:
    session = _session()
    names = [stage.name for stage in session.STAGES]
    assert len(names) == len(set(names))
    for name in session.DEFAULT.split(","):
        assert name in names
    for stage in session.STAGES:
        assert 0 < stage.limit_s < 600, stage.name  # one device call runs at most 10 minutes
        checked = subprocess.run(["bash", "-n", "-c", session.PRELUDE + stage.body], capture_output=True, text=True)
        assert checked.returncode == 0, f"stage {stage.name}: {checked.stderr}"


def test_a_broken_body_is_caught() -> None:
    session = _session()
    checked = subprocess.run(["bash", "-n", "-c", session.PRELUDE + "if [ 1 ]; then\n"], capture_output=True)
    assert checked.returncode != 0
