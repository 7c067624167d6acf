"""DistTGL's parallelisms: configuration checks, memory parallelism against a serial replay of each copy's
segment, mini-batch parallelism against one trainer on the same batches, and resuming from a checkpoint."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from distgnn.errors import ConfigError
from distgnn.nn.temporal import TGN, NodeMemory
from distgnn.temporal import build_temporal_csr, checkpoint, parallel
from distgnn.temporal.job import load_stream
from distgnn.temporal.parallel import Parallelism
from distgnn.temporal.train import TGNRunner, batch_ranges, chronological_split, train_epoch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tgn" / "train_dist.py"
SMALL = [
    "--dataset",
    "synthetic-events:200:4000",
    "--memory-dim",
    "8",
    "--time-dim",
    "4",
    "--embedding-dim",
    "8",
    "--neighbors",
    "4",
    "--epochs",
    "1",
    "--no-eval",
    "--quiet",
]


def example_main():
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import train_dist
    finally:
        sys.path.pop(0)
    return train_dist.main


def run_local(args: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--local", *args], capture_output=True, text=True, timeout=240, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_heuristic_and_checks():
    assert parallel.default_parallelism(1, 1, 200) == Parallelism(1, 1, 1)
    assert parallel.default_parallelism(2, 1, 200) == Parallelism(1, 1, 2)
    assert parallel.default_parallelism(2, 4, 200) == Parallelism(4, 1, 2)
    assert parallel.default_parallelism(1, 4, 100) == Parallelism(2, 1, 2)  # shares of >= 50 events
    parallel.check(Parallelism(2, 1, 2), 4, 10, 200)
    with pytest.raises(ConfigError, match="--minibatch-parallelism 2 x --epoch-parallelism 1 x --memory-parallelism 3"):
        parallel.check(Parallelism(2, 1, 3), 4, 10, 200)
    with pytest.raises(ConfigError, match="--memory-parallelism 4 is more than the 3 training batches"):
        parallel.check(Parallelism(1, 1, 4), 4, 3, 200)
    assert [parallel.share_of_batch(0, 7, s, 3) for s in range(3)] == [(0, 3), (3, 5), (5, 7)]
    assert [parallel.segment_of(c, 3, 8) for c in range(3)] == [(0, 3), (3, 6), (6, 8)]
    flags = argparse.Namespace(minibatch_parallelism=0, epoch_parallelism=0, memory_parallelism=2, batch_size=200)
    assert parallel.from_args(flags, 4, 2) == Parallelism(2, 1, 2)


def test_bad_configuration_is_one_line_before_any_process(capsys):
    main = example_main()
    assert main(["--local", "--num-parts", "2", "--memory-parallelism", "3", *SMALL]) == 2
    assert "--memory-parallelism 3" in capsys.readouterr().err
    assert main(["--single", "--dataset", "events:/nonexistent.csv"]) == 2
    assert "does not exist" in capsys.readouterr().err


def replay(stream_spec: str, seed: int, copy: int, batches: list[tuple[int, int]]) -> NodeMemory:
    """One copy's memory after its segment, replayed alone with the initial weights (lr 0)."""
    events = load_stream(stream_spec, seed=seed)
    torch.manual_seed(seed)
    model = TGN(events.num_nodes, 0, 8, 4, 8)
    runner = TGNRunner(model, events, build_temporal_csr(events), torch.device("cpu"), 4, seed=seed * 1000 + copy)
    train_epoch(runner, batches, torch.optim.Adam(model.parameters(), lr=0.0))
    return runner.memory


@pytest.mark.slow
def test_memory_parallel_copies_equal_serial_replays_of_their_segments(tmp_path):
    run_local(["--num-parts", "2", "--memory-parallelism", "2", "--lr", "0", "--checkpoint-dir", str(tmp_path), *SMALL])
    loaded = checkpoint.load(checkpoint.latest(str(tmp_path)))
    events = load_stream("synthetic-events:200:4000")
    train_end, _ = chronological_split(len(events))
    batches = batch_ranges(0, train_end, 200)  # 14 batches: 7 per copy
    for copy in range(2):
        expected = replay("synthetic-events:200:4000", 0, copy, batches[copy * 7 : (copy + 1) * 7]).state()
        for field in NodeMemory.FIELDS:
            np.testing.assert_allclose(loaded.files[f"memory{copy}.{field}.npy"], expected[field], atol=1e-6)
    # The copies really differ: each saw its own segment only.
    assert not np.allclose(loaded.files["memory0.memory.npy"], loaded.files["memory1.memory.npy"])


@pytest.mark.slow
def test_minibatch_parallel_equals_one_trainer_on_the_same_batches(tmp_path):
    serial, split = tmp_path / "serial", tmp_path / "split"
    flags = ["--lr", "0.003", *SMALL]
    assert example_main()(["--single", "--checkpoint-dir", str(serial), "--num-threads", "1", *flags]) == 0
    run_local(
        [
            "--num-parts",
            "1",
            "--trainers-per-machine",
            "2",
            "--minibatch-parallelism",
            "2",
            "--checkpoint-dir",
            str(split),
            *flags,
        ]
    )
    one = checkpoint.load(checkpoint.latest(str(serial))).files
    two = checkpoint.load(checkpoint.latest(str(split))).files
    # Sums over a batch's rows in another grouping round differently; Adam turns such noise into whole steps
    # where the exact gradient is 0: the keys' bias (softmax ignores a shift shared by all keys), left out here.
    for name, array in one.items():
        if name == "model.attention.key_value_node.bias.npy":
            array, other = array[8:], two[name][8:]  # the values' half
        elif name.startswith(("model.", "memory0.")):
            other = two[name]
        else:
            continue
        np.testing.assert_allclose(other, array, atol=1e-4, err_msg=name)


def test_resume_mid_epoch_ends_as_an_uninterrupted_run(tmp_path):
    main = example_main()
    flags = ["--single", "--num-threads", "1", "--lr", "0.003", "--checkpoint-keep", "100", *SMALL]
    flags[flags.index("--epochs") + 1] = "2"
    assert main([*flags, "--checkpoint-dir", str(tmp_path / "a"), "--checkpoint-every", "5"]) == 0
    middle = tmp_path / "a" / "step-00000005"
    assert main([*flags, "--checkpoint-dir", str(tmp_path / "b"), "--resume", str(middle)]) == 0
    full = checkpoint.load(checkpoint.latest(str(tmp_path / "a")))
    resumed = checkpoint.load(checkpoint.latest(str(tmp_path / "b")))
    assert full.position == resumed.position
    for name, array in full.files.items():
        np.testing.assert_array_equal(resumed.files[name], array, err_msg=name)
