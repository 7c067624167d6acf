"""GraphSAGE on Cora: a 2 machines x 2 trainers simulated cluster matches single-process training."""

from __future__ import annotations

from pathlib import Path

import pytest
from example_runs import run_example

ROOT = Path(__file__).resolve().parents[2]
CORA = (ROOT / ".." / "shared" / "data" / "planetoid").resolve()
# Same model, optimiser and epochs on both sides; the cluster's 4 trainers each take a quarter of
# the 140 training nodes per step, so one DDP step averages the same 140 nodes as one local step.
COMMON = ["--dataset=cora", f"--data-dir={CORA}", "--epochs=100", "--lr=0.01", "--weight-decay=5e-4", "--hidden=64"]
COMMON += ["--fanouts=10,10", "--quiet", "--seed=0"]


@pytest.mark.slow
@pytest.mark.skipif(not (CORA / "ind.cora.graph").exists(), reason=f"Cora files not found in {CORA}")
def test_two_by_two_cluster_matches_single_process_accuracy(tmp_path, capsys) -> None:
    single = run_example(
        "graphsage", [*COMMON, "--single", "--no-malloc-tuning", "--num-threads=1", "--batch-size=140"], capsys
    ).result
    cluster_flags = ["--local", "--num-parts=2", "--trainers-per-machine=2", "--batch-size=35", f"--workdir={tmp_path}"]
    cluster = run_example("graphsage", [*COMMON, *cluster_flags], capsys).result
    assert single["num_trainers"] == 1 and cluster["num_trainers"] == 4
    assert cluster["batches_per_epoch"] == single["batches_per_epoch"] == 1
    assert single["test_acc"] >= 0.775, single
    assert abs(cluster["test_acc"] - single["test_acc"]) <= 0.015, (single, cluster)
    assert cluster["epoch_time_s"] > 0 and cluster["seps"] > 0
    assert len(cluster["epoch_times_s"]) == 100
