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
SPEC = "synthetic-events:200:4000"
SMALL = [
    "--dataset",
    SPEC,
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


def warm_reference(model: TGN, memory: NodeMemory, events, ranges: list[tuple[int, int]]) -> None:
    """The documented warm-up: per chunk, the endpoints' memory read (mail through the GRU), written back,
    the chunk's events stored as mail."""
    src, dst, time = (torch.from_numpy(a) for a in (events.src, events.dst, events.time))
    with torch.no_grad():
        for begin, end in ranges:
            for u in torch.unique(torch.cat([src[begin:end], dst[begin:end]])).tolist():
                node = torch.tensor([u])
                memory.write_memory(node, model.read_memory(memory, node))
            # Mail from the memory just written: each event's endpoints as the chunk read them.
            memory.store_mail(
                src[begin:end],
                dst[begin:end],
                time[begin:end],
                memory.memory[src[begin:end]],
                memory.memory[dst[begin:end]],
                None,
            )


def replay(copy: int, segments: list[list[tuple[int, int]]], warm: list[tuple[int, int]]) -> list[dict]:
    """One copy's memory after each of its epochs (lr 0: the initial weights throughout): ``warm`` replayed
    first, then each epoch's segment, the memory reset where a segment starts at the stream's first batch."""
    events = load_stream(SPEC, seed=0)
    torch.manual_seed(0)
    model = TGN(events.num_nodes, 0, 8, 4, 8)
    runner = TGNRunner(model, events, build_temporal_csr(events), torch.device("cpu"), 4, seed=copy)
    warm_reference(model, runner.memory, events, warm)
    states = []
    for segment in segments:
        train_epoch(runner, segment, torch.optim.Adam(model.parameters(), lr=0.0), reset=segment[0][0] == 0)
        states.append(runner.memory.state())
    return states


@pytest.mark.slow
def test_memory_parallel_copies_equal_serial_replays_of_their_segments(tmp_path):
    flags = [*SMALL, "--checkpoint-keep", "10", "--lr", "0", "--checkpoint-dir", str(tmp_path)]
    flags[flags.index("--epochs") + 1] = "2"
    run_local(["--num-parts", "2", "--memory-parallelism", "2", *flags])
    epochs = [checkpoint.load(path).files for path in sorted(tmp_path.glob("step-*"))]
    events = load_stream(SPEC)
    batches = batch_ranges(0, chronological_split(len(events))[0], 200)  # 14 batches: 7 per copy
    first, second = batches[:7], batches[7:]
    # Copy 0: segment 0 from an empty memory, then segment 1 going on from there. Copy 1: segment 1 after the
    # events of segment 0 replayed through its memory only, then segment 0 from an empty memory.
    expected = {0: replay(0, [first, second], []), 1: replay(1, [second, first], first)}
    for epoch, files in enumerate(epochs):
        for copy in range(2):
            for field in NodeMemory.FIELDS:
                np.testing.assert_allclose(
                    files[f"memory{copy}.{field}.npy"], expected[copy][epoch][field], atol=1e-6, err_msg=field
                )
    # The copies really differ: each saw its own segments only.
    assert not np.allclose(epochs[0]["memory0.memory.npy"], epochs[0]["memory1.memory.npy"])


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
