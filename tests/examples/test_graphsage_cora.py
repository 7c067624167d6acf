"""GraphSAGE on Cora: a 2 machines x 2 trainers simulated cluster matches single-process training."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "graphsage" / "train_dist.py"
CORA = (ROOT / ".." / "shared" / "data" / "planetoid").resolve()
# Same model, optimiser and epochs on both sides; the cluster's 4 trainers each take a quarter of
# the 140 training nodes per step, so one DDP step averages the same 140 nodes as one local step.
COMMON = ["--dataset=cora", f"--data-dir={CORA}", "--epochs=100", "--lr=0.01", "--weight-decay=5e-4", "--hidden=64"]
COMMON += ["--fanouts=10,10", "--quiet", "--seed=0"]


def run(args: list[str], timeout: int) -> dict:
    proc = subprocess.run(
        [sys.executable, str(TRAIN), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout[-3000:]
    return json.loads(lines[0][len("RESULT ") :])


@pytest.mark.slow
@pytest.mark.skipif(not (CORA / "ind.cora.graph").exists(), reason=f"Cora files not found in {CORA}")
def test_two_by_two_cluster_matches_single_process_accuracy(tmp_path) -> None:
    single = run([*COMMON, "--single", "--batch-size=140"], timeout=240)
    cluster = run(
        [
            *COMMON,
            "--local",
            "--num-parts=2",
            "--trainers-per-machine=2",
            "--batch-size=35",
            f"--workdir={tmp_path}",
        ],
        timeout=280,
    )
    assert single["num_trainers"] == 1 and cluster["num_trainers"] == 4
    assert cluster["batches_per_epoch"] == single["batches_per_epoch"] == 1
    assert single["test_acc"] >= 0.775, single
    assert abs(cluster["test_acc"] - single["test_acc"]) <= 0.015, (single, cluster)
    assert cluster["epoch_time_s"] > 0 and cluster["seps"] > 0
    assert len(cluster["epoch_times_s"]) == 100
