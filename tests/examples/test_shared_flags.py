"""Every example shows one face: the same job (``--max-restarts`` too), checkpoint and evaluation flags, and ``--resume`` alone meaning
``auto`` (the RESULT keys: test_result_schema.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(ROOT.glob("examples/*/train_dist.py"))
SHARED = ["--local", "--num-parts=2", "--trainers-per-machine=2", "--device=cpu", "--num-threads=1", "--epochs=3"]
SHARED += ["--seed=4", "--checkpoint-dir=ck", "--resume", "--run-dir=r", "--no-eval", "--max-restarts=1"]


def load(path: Path):
    spec = importlib.util.spec_from_file_location(f"example_{path.parent.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.parent.name)
def test_every_example_takes_the_shared_flags(path: Path) -> None:
    args = load(path).parse_args(SHARED)
    assert (args.local, args.num_parts, args.trainers_per_machine, args.epochs, args.seed) == (True, 2, 2, 3, 4)
    assert (args.resume, args.no_eval, args.checkpoint_dir, args.run_dir) == ("auto", True, "ck", "r")
    assert args.max_restarts == 1
    assert load(path).parse_args(["--resume", "ck/step-7"]).resume == "ck/step-7"
