"""Training on the synthetic community graph: a GNN beats an MLP, and runs are reproducible."""

from __future__ import annotations

from pathlib import Path

import pytest
from example_runs import load_example as load_named_example
from example_runs import run_example

from distgnn.train import job

SMALL = ["--dataset=synthetic", "--num-nodes=3000", "--avg-degree=10", "--feat-dim=16", "--synthetic-classes=4"]
SMALL += ["--batch-size=64", "--lr=0.01", "--hidden=32", "--fanouts=5,5", "--quiet", "--seed=1"]


def load_example():
    return load_named_example("graphsage")


def train_single(example, argv: list[str]) -> dict:
    args = example.parse_args([*argv, "--single", "--no-malloc-tuning", "--num-threads=1"])
    with job.start_trainer(args) as trainer:
        return example.run_trainer(trainer, args)


def test_graphsage_clearly_beats_mlp_on_the_synthetic_graph() -> None:
    example = load_example()
    accuracy = {}
    for model in ("sage", "mlp"):
        runs = [
            train_single(example, [*SMALL, "--epochs=10", f"--model={model}", f"--seed={seed}"])
            for seed in (0, 1)  # two graphs, two initialisations: the mean is steadier than one run
        ]
        accuracy[model] = sum(r["test_acc"] for r in runs) / len(runs)
    # Own features alone are mostly noise; neighbours (mostly of the same class) average it out.
    assert accuracy["sage"] > accuracy["mlp"] + 0.2, accuracy
    assert accuracy["sage"] > 0.85, accuracy


def run_local(tmp_path: Path, num_workers: int, capsys) -> tuple[dict, list[str]]:
    args = [*SMALL, "--local", "--num-parts=2", "--epochs=2", f"--num-workers={num_workers}"]
    run = run_example("graphsage", [*args, f"--workdir={tmp_path}", "--part-method=random"], capsys)
    return run.result, [line.split("|")[1] for line in run.out.splitlines() if line.startswith("epoch")]


@pytest.mark.slow
def test_cluster_training_is_reproducible_for_a_seed_whatever_the_worker_count(tmp_path, capsys, caplog) -> None:
    first, first_losses = run_local(tmp_path, 0, capsys)
    assert "partitioned" in caplog.text and "reusing partition" not in caplog.text
    caplog.clear()
    second, second_losses = run_local(tmp_path, 1, capsys)
    assert "reusing partition" in caplog.text
    assert len(first_losses) == 2
    assert first_losses == second_losses
    for key in ("train_loss", "val_acc", "test_acc"):
        assert first[key] == second[key], key
    assert first["num_trainers"] == 2


@pytest.mark.parametrize(
    ("flags", "prefetch"),
    [
        ([], None),  # the loader's default (2) for CPU sampling
        (["--device=cuda", "--sample-device=cuda"], 0),  # GPU sampling runs inline by default
        (["--device=cuda", "--sample-device=cuda", "--prefetch=2"], 2),  # unless asked for
        (["--device=cuda", "--sample-device=cuda", "--num-workers=2"], None),  # workers keep the default
    ],
)
def test_gpu_sampling_samples_inline_unless_prefetch_is_given(flags, prefetch) -> None:
    args = load_example().parse_args([*SMALL, "--local", *flags])  # parsing only: no GPU needed
    assert args.prefetch == prefetch
