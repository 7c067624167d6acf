"""DistTGL's parallelisms: configuration checks, memory parallelism at a learning rate > 0 against a serial
replay of its schedule, mini-batch parallelism against one trainer on the same batches, and resuming from a
checkpoint."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from distgnn.errors import ConfigError
from distgnn.nn.temporal import TGN, NodeMemory
from distgnn.store.checkpoint_files import read_arrays
from distgnn.temporal import build_temporal_csr, loop, parallel
from distgnn.temporal.job import load_stream
from distgnn.temporal.parallel import Parallelism
from distgnn.temporal.plan import Plan
from distgnn.temporal.step import link_loss
from distgnn.temporal.train import TGNRunner, batch_ranges, chronological_split
from distgnn.train.checkpoint import Checkpointer

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


def test_heuristic_follows_disttgl_rule():
    """Memory copies first (one per machine at least, one per trainer while the budget and batches allow), then
    epoch slots for the trainers a copy is left with, then mini-batch shares for those j cannot take."""
    mb = 1_000_000

    def choose(machines, per_machine, batches, budget_copies, batch_size=200):
        choice = parallel.default_parallelism(machines, per_machine, batch_size, batches, mb, budget_copies * mb)
        return choice.parallelism, choice.reason

    assert choose(1, 1, 210, 100)[0] == Parallelism(1, 1, 1)
    assert choose(2, 1, 210, 100)[0] == Parallelism(1, 1, 2)  # across machines: always memory parallelism
    assert choose(2, 4, 210, 100)[0] == Parallelism(1, 1, 8)  # copies fit: one per trainer
    chosen, reason = choose(2, 4, 210, 2)  # room for 2 copies a machine: the other trainers share them
    assert chosen == Parallelism(1, 2, 4)
    assert "k = 4" in reason and "room for 2" in reason and "j = 2" in reason
    assert choose(1, 4, 210, 1)[0] == Parallelism(1, 4, 1)  # no room for a second copy: j takes all four
    assert choose(3, 1, 210, 0)[0] == Parallelism(1, 1, 3)  # one copy a machine even when none "fits"
    assert choose(1, 6, 210, 4)[0] == Parallelism(1, 2, 3)  # copies a divisor of the trainers: 3, not 4
    chosen, reason = choose(1, 4, 2, 1)  # a segment of 2 batches: j = 2, the other 2 split each batch
    assert chosen == Parallelism(2, 2, 1)
    assert "i = 2" in reason and "shares of 100 events" in reason
    # 3 batches: at most 3 copies, a divisor of 4: 2, whose segments of 1 batch leave j = 1, so i = 2
    assert choose(1, 4, 3, 100)[0] == Parallelism(2, 1, 2)
    assert "below the 50" in choose(1, 8, 1, 1, batch_size=200)[1]  # i = 8: shares of 25 events


def test_checks_and_flags():
    parallel.check(Parallelism(2, 1, 2), 4, 10, 200)
    with pytest.raises(ConfigError, match="--minibatch-parallelism 2 x --epoch-parallelism 1 x --memory-parallelism 3"):
        parallel.check(Parallelism(2, 1, 3), 4, 10, 200)
    with pytest.raises(ConfigError, match="--memory-parallelism 4 is more than the 3 training batches"):
        parallel.check(Parallelism(1, 1, 4), 4, 3, 200)
    assert [parallel.share_of_batch(0, 7, s, 3) for s in range(3)] == [(0, 3), (3, 5), (5, 7)]
    assert [parallel.segment_of(c, 3, 8) for c in range(3)] == [(0, 3), (3, 6), (6, 8)]
    flags = argparse.Namespace(
        minibatch_parallelism=0, epoch_parallelism=0, memory_parallelism=2, batch_size=200, device="cpu"
    )
    assert parallel.from_args(flags, 4, 2, 210, 1000) == parallel.Choice(Parallelism(2, 1, 2), "flags")
    flags.memory_parallelism = 0
    assert parallel.from_args(flags, 4, 2, 210, 1000).parallelism == Parallelism(1, 1, 4)  # the rule's


def test_lr_multiplier_counts_batches_per_step():
    assert parallel.lr_multiplier(Parallelism(2, 3, 4), "linear") == 12  # j * k; the i shares are one batch
    assert parallel.lr_multiplier(Parallelism(3, 2, 8), "sqrt") == 4
    assert parallel.lr_multiplier(Parallelism(2, 3, 4), "none") == 1
    with pytest.raises(ConfigError, match="--lr-scaling must be one of linear, sqrt, none, got 'cubic'"):
        parallel.lr_multiplier(Parallelism(), "cubic")


def test_later_work_names_every_replay_and_batch_size_a_copy_meets():
    """Two copies over 11 batches of 10 events, the last one short: the oldest batch is left out, the copies
    alternate the segments [10, 60) (from an empty memory: stop 0) and [60, 105) (the memory replayed over
    [0, 60)); each meets both from epoch 0, one in the last epoch; one trainer meets every batch, no replay."""
    events = SimpleNamespace(num_nodes=5)
    batches = batch_ranges(0, 105, 10)
    plan = Plan(events, 105, 110, batches, Parallelism(memory=2))
    assert plan.segment(1)[-1] == (100, 105)
    for copy in (0, 1):
        work = loop.later_work(plan, copy, 0, 3)
        assert work == loop.LaterWork(stops={0, 60}, sizes={10, 5})
    assert loop.later_work(plan, 0, 2, 3) == loop.LaterWork(stops={0}, sizes={10})
    assert loop.later_work(plan, 1, 2, 3) == loop.LaterWork(stops={60}, sizes={10, 5})
    one = Plan(events, 105, 110, batches, Parallelism())
    assert loop.later_work(one, 0, 0, 10) == loop.LaterWork(stops={0}, sizes={10, 5})


def test_bad_configuration_is_one_line_before_any_process(capsys):
    main = example_main()
    assert main(["--local", "--num-parts", "2", "--memory-parallelism", "3", *SMALL]) == 2
    assert "--memory-parallelism 3" in capsys.readouterr().err
    assert main(["--single", "--dataset", "events:/nonexistent.csv"]) == 2
    assert "does not exist" in capsys.readouterr().err


def memory_file(files: dict[str, np.ndarray], copy: int, field: str) -> np.ndarray:
    """Memory copy ``copy``'s array ``field`` in a checkpoint's files (saved by the trainer that owns it)."""
    (name,) = [name for name in files if name.endswith(f".memory.{copy}.{field}.npy")]
    return files[name]


def position_of(path: Path) -> tuple:
    """A checkpoint's step and every trainer's loop position (epoch, batches done)."""
    state = json.loads((path / "state.json").read_text())
    return state["step"], [dict(rank["position"]["__dict__"]) for rank in state["ranks"]]


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


def replay_schedule(lr: float, epochs: int) -> list[dict]:
    """The 2-copy job's schedule replayed in one process: one model, both copies' memories; every step trains
    batch t of each copy's segment (copy c on segment (c + epoch) mod 2, its own negatives), takes the mean of
    the two losses (DDP averages the gradients) and one Adam step (lr x 2: the linear scaling), then commits
    both batches. At every epoch's start each copy's memory is emptied, and the copy on segment 1 replays
    segment 0 through it with the weights of that moment. Returns, after each epoch, the weights and both
    memories."""
    events = load_stream(SPEC, seed=0)
    torch.manual_seed(0)
    model = TGN(events.num_nodes, 0, 8, 4, 8)
    csr = build_temporal_csr(events)
    runners = [TGNRunner(model, events, csr, torch.device("cpu"), 4, seed=copy) for copy in range(2)]
    batches = batch_ranges(0, chronological_split(len(events))[0], 200)  # 14 batches: 7 per copy
    segments = [batches[:7], batches[7:]]
    optimizer = loop.adam(model.parameters(), lr * 2, torch.device("cpu"), "eager")
    states = []
    for epoch in range(epochs):
        mine = [segments[(copy + epoch) % 2] for copy in range(2)]
        for runner, segment in zip(runners, mine, strict=True):
            runner.reset_memory()
            if segment is segments[1]:  # every epoch, with the weights of the moment
                warm_reference(model, runner.memory, events, segments[0])
        for t in range(7):
            outs = []
            for runner, segment in zip(runners, mine, strict=True):
                begin, end = segment[t]
                outs.append(runner.forward(begin, end, runner.negatives(end - begin, 1)))
            loss = (link_loss(outs[0]) + link_loss(outs[1])) / 2
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            for out in outs:
                out.commit()
        weights = {f"model.{name}.npy": value.detach().numpy().copy() for name, value in model.state_dict().items()}
        states.append({"weights": weights, "memory": [runner.memory.state() for runner in runners]})
    return states


@pytest.mark.slow
def test_memory_parallel_equals_serial_replay_of_its_schedule(tmp_path):
    """Two memory copies (2 machines x 1 trainer) at a learning rate > 0: every epoch's weights and both
    copies' memories as the same schedule replayed in one process leaves them."""
    flags = [*SMALL, "--checkpoint-keep", "10", "--lr", "0.003", "--checkpoint-dir", str(tmp_path)]
    flags[flags.index("--epochs") + 1] = "2"
    run_local(["--num-parts", "2", "--memory-parallelism", "2", "--num-threads", "1", *flags])
    epochs = [read_arrays(path) for path in sorted(tmp_path.glob("step-*"))]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the trainers' one thread: the same summation order in every kernel
    try:
        expected = replay_schedule(0.003, 2)
    finally:
        torch.set_num_threads(threads)
    # DDP's averaged gradient is the mean loss's gradient up to float rounding (gloo's sum of the two copies'
    # gradients against autograd's sum of two halves); Adam turns such noise into whole steps where the
    # exact gradient is 0: the keys' bias (softmax ignores a shift shared by all keys), left out here.
    for epoch, files in enumerate(epochs):
        for name, array in expected[epoch]["weights"].items():
            got = files[name]
            if name == "model.attention.key_value_node.bias.npy":
                array, got = array[8:], got[8:]  # the values' half
            np.testing.assert_allclose(got, array, atol=1e-5, err_msg=f"epoch {epoch} {name}")
        for copy in range(2):
            for field in NodeMemory.FIELDS:
                np.testing.assert_allclose(
                    memory_file(files, copy, field),
                    expected[epoch]["memory"][copy][field],
                    atol=1e-4,
                    err_msg=f"epoch {epoch} copy {copy} {field}",
                )
    # The copies really differ (each saw its own segments only), and the weights moved.
    assert not np.allclose(memory_file(epochs[0], 0, "memory"), memory_file(epochs[0], 1, "memory"))
    assert not np.allclose(epochs[1]["model.predictor.final.weight.npy"], epochs[0]["model.predictor.final.weight.npy"])


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
    one = read_arrays(Checkpointer(serial, 0).latest())
    two = read_arrays(Checkpointer(split, 0).latest())
    # Sums over a batch's rows in another grouping round differently; Adam turns such noise into whole steps
    # where the exact gradient is 0: the keys' bias (softmax ignores a shift shared by all keys), left out here.
    for name, array in one.items():
        if name == "model.attention.key_value_node.bias.npy":
            array, other = array[8:], two[name][8:]  # the values' half
        elif name.startswith(("model.", "rank0.memory.0.")):
            other = two[name]
        else:
            continue
        np.testing.assert_allclose(other, array, atol=1e-4, err_msg=name)


def test_resume_mid_epoch_ends_as_an_uninterrupted_run(tmp_path, capsys):
    main = example_main()
    flags = ["--single", "--num-threads", "1", "--lr", "0.003", "--checkpoint-keep", "100", *SMALL]
    flags[flags.index("--epochs") + 1] = "2"
    assert main([*flags, "--checkpoint-dir", str(tmp_path / "a"), "--checkpoint-every", "5"]) == 0
    middle = tmp_path / "a" / "step-00000005"
    assert main([*flags, "--checkpoint-dir", str(tmp_path / "b"), "--resume", str(middle)]) == 0
    full, resumed = (Checkpointer(tmp_path / run, 0).latest() for run in ("a", "b"))
    assert position_of(full) == position_of(resumed)
    resumed_files = read_arrays(resumed)
    for name, array in read_arrays(full).items():
        np.testing.assert_array_equal(resumed_files[name], array, err_msg=name)
    # A model of other parameters (trained time frequencies) cannot take this checkpoint: one clear line.
    capsys.readouterr()
    assert main([*flags, "--time-encoding", "learned", "--resume", str(middle)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: checkpoint ") and err.count("\n") == 1, err
    assert "'time_encoding': 'fixed'" in err and "'time_encoding': 'learned'" in err


def test_evals_per_epoch_validates_midway_and_logs_training_seconds(tmp_path, capsys, monkeypatch):
    import gc

    assert loop.mid_epoch_marks(10, 4) == {2, 5, 8}
    assert loop.mid_epoch_marks(3, 5) == {1, 2} and loop.mid_epoch_marks(10, 1) == set()
    steps_with_gc = []

    class Counting(loop.StepCollector):  # the steps run with Python's automatic collection off
        def step_done(self) -> None:
            steps_with_gc.append(gc.isenabled())
            super().step_done()

    monkeypatch.setattr(loop, "StepCollector", Counting)
    main = example_main()
    small = [a for a in SMALL if a not in ("--no-eval", "--quiet")]
    args = ["--single", *small, "--epochs", "2", "--evals-per-epoch", "3", "--num-threads", "1", "--quiet"]
    assert main([*args, "--run-dir", str(tmp_path)]) == 0
    assert steps_with_gc and not any(steps_with_gc) and gc.isenabled()
    out = capsys.readouterr().out
    assert "lr 0.0001 x 1 = 0.0001 (--lr-scaling linear)" in out and "memory caught up over" in out
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert [r["epoch"] for r in evals] == [0, 0, 0, 1, 1, 1]
    assert [r["fraction"] for r in evals] == pytest.approx([1 / 3, 2 / 3, 1, 1 / 3, 2 / 3, 1], abs=0.04)
    seconds = [r["train_s"] for r in evals]
    assert all(a < b for a, b in zip(seconds, seconds[1:], strict=False)), seconds
    # The epoch's own evaluation is the last of its three; the training seconds add up over the epochs.
    assert [r["val_ap"] for r in evals[2::3]] == [r["val_ap"] for r in epochs]
    assert seconds[-1] == pytest.approx(sum(r["epoch_time_s"] for r in epochs))
