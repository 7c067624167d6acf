"""Every example shows one face: the same job, checkpoint and evaluation flags, ``--resume`` alone meaning
``auto``, and the same leading RESULT keys."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from distgnn.train import job

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(ROOT.glob("examples/*/train_dist.py"))
SHARED = ["--local", "--num-parts=2", "--trainers-per-machine=2", "--device=cpu", "--num-threads=1", "--epochs=3"]
SHARED += ["--seed=4", "--checkpoint-dir=ck", "--resume", "--run-dir=r", "--no-eval"]
MAG = ["--dataset=synthetic-mag", "--num-papers=800", "--feat-dim=8", "--synthetic-classes=4", "--fanouts=4,4"]
MAG += ["--batch-size=128", "--hidden=16", "--quiet", "--no-malloc-tuning", "--epochs=1", "--max-batches=2"]


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
    assert load(path).parse_args(["--resume", "ck/step-7"]).resume == "ck/step-7"


@pytest.mark.parametrize("path", [p for p in EXAMPLES if p.parent.name in ("rgcn", "link_prediction")], ids=str)
def test_no_eval_skips_the_evaluation_and_keeps_the_shared_result_keys(path: Path) -> None:
    example = load(path)
    extra = ["--target-etype=author:writes:paper"] if path.parent.name == "link_prediction" else []
    args = example.parse_args([*MAG, *extra, "--single", "--no-eval"])
    with job.start_trainer(args) as trainer:
        result = example.run_trainer(trainer, args)
    shared = ["dataset", "device", "backend", "num_trainers", "num_parts", "epochs", "batches_per_epoch"]
    assert list(result)[: len(shared)] == shared
    assert "epoch_time_s" in result and "eval_time_s" not in result
    assert not {"test_acc", "val_acc", "mrr", "auc"} & set(result)
