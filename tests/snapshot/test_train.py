"""Snapshot training: one process's epoch is the mean loss over the training snapshots, and every schedule
on a simulated cluster trains the same model to the same loss as the single process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from example_runs import run_example
from netns_cluster import free_port

from distgnn.nn.recurrent import SnapshotModel
from distgnn.snapshot import synthetic_sequence
from distgnn.snapshot.events import first_appearance_ids, snapshots_from_events
from distgnn.snapshot.schedule import make_plan, make_windows
from distgnn.snapshot.train import SnapshotRunner, _lockstep_batch, all_reduce_gradients, evaluate, train_epoch

SMALL = ["--dataset=synthetic", "--synthetic-nodes=2000", "--synthetic-snapshots=20", "--epochs=4", "--quiet"]
SMALL += ["--num-threads=1", "--cheb-k=2", "--hidden=8", "--window=3"]


def _grad(p: torch.Tensor) -> torch.Tensor:
    # A weight that only multiplies a zero state (windows of one snapshot) gets no gradient: zero.
    return torch.zeros_like(p) if p.grad is None else p.grad


@pytest.mark.parametrize("window", [0, 1, 3])
def test_one_trainer_epoch_is_the_mean_snapshot_loss(window):
    seq = synthetic_sequence(num_nodes=500, num_snapshots=12, seed=1)
    torch.manual_seed(0)
    model = SnapshotModel("gconvgru", seq.num_features, 8, k=2)
    runner = SnapshotRunner(model, seq, 10, torch.device("cpu"))
    plan = make_plan("blad", seq.costs()[:10], make_windows(10, window), 1)
    result = train_epoch(runner, plan, 0)
    grads = [_grad(p).clone() for p in model.parameters()]
    model.zero_grad()
    # By hand: windows restart from a zero state.
    loss = 0.0
    for w in make_windows(10, window):
        outs, _ = model([runner.snapshot(t) for t in range(w.start, w.stop)])
        loss = loss + sum(
            F.mse_loss(o, runner.snapshot(t).y) for t, o in zip(range(w.start, w.stop), outs, strict=True)
        )
    (loss / 10).backward()
    assert result.loss == pytest.approx(float(loss.detach() / 10), rel=1e-5)
    for a, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(a, _grad(p), rtol=1e-4, atol=1e-6)
    assert set(evaluate(runner, window, 10, 12)) == {"mse"}


@pytest.mark.parametrize("cell", ["gconvgru", "gclstm", "evolvegcn"])
@pytest.mark.parametrize("start_fraction", [1.0, 0.3])
def test_batched_windows_equal_one_snapshot_at_a_time_on_a_changing_graph(cell, start_fraction):
    # Every snapshot has its own random graph (start_fraction 1: a fixed node count; 0.3: a growing node set).
    seq = synthetic_sequence(num_nodes=60, num_snapshots=11, start_fraction=start_fraction, seed=3)
    assert len({s.edge_index.tobytes() for s in seq}) == len(seq)
    torch.manual_seed(0)
    model = SnapshotModel(cell, seq.num_features, 8, k=2)
    runner = SnapshotRunner(model, seq, 9, torch.device("cpu"))
    plan = make_plan("blad", seq.costs()[:9], make_windows(9, 3), 1)
    assert len(_lockstep_batch(runner, plan, plan.segments[0], 0)) == 3  # the three windows run as one batch
    result = train_epoch(runner, plan, 0)
    grads = [_grad(p).clone() for p in model.parameters()]
    model.zero_grad()
    loss = 0.0
    for w in make_windows(9, 3):
        state = None
        for t in range(w.start, w.stop):
            (out,), state = model([runner.snapshot(t)], state)
            loss = loss + F.mse_loss(out, runner.snapshot(t).y)
    (loss / 9).backward()
    assert result.loss == pytest.approx(float(loss.detach() / 9), rel=1e-5)
    for a, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(a, _grad(p), rtol=1e-4, atol=1e-6)


def test_events_cut_into_growing_snapshots_train_links():
    from distgnn.data.events import EventStream

    src = np.array([5, 7, 5, 9, 7, 2], np.int64)
    dst = np.array([7, 5, 9, 2, 2, 5], np.int64)
    time = np.array([0.0, 1, 2, 3, 4, 5])
    new_src, new_dst, n = first_appearance_ids(src, dst)
    assert list(new_src) == [0, 1, 0, 2, 1, 3] and list(new_dst) == [1, 0, 2, 3, 3, 0] and n == 4
    seq = snapshots_from_events(EventStream(src, dst, time, 10), span=2.0)
    assert [s.num_nodes for s in seq] == [2, 4, 4] and [s.num_edges for s in seq] == [2, 2, 2]
    assert seq.growing and not seq.has_targets
    with pytest.raises(Exception, match="exactly one of --snapshot-span and --num-snapshots"):
        snapshots_from_events(EventStream(src, dst, time, 10))
    torch.manual_seed(0)
    model = SnapshotModel("gclstm", 2, 8, task="link")
    runner = SnapshotRunner(model, seq, 1, torch.device("cpu"))
    result = train_epoch(runner, make_plan("blad", seq.costs()[:1], make_windows(1, 0), 1), 0)
    assert np.isfinite(result.loss)
    scores = evaluate(runner, 0, 1, 2)
    assert 0 <= scores["auc"] <= 1 and 0 < scores["mrr"] <= 1


def run(args: list[str], tmp_path: Path, capsys) -> dict:
    return run_example("snapshot", [*args, f"--workdir={tmp_path}"], capsys).result


def _train(seq, schedule: str, rank: int, world: int, epochs: int = 3) -> tuple[list[float], torch.Tensor]:
    """Losses per epoch (summed over trainers) and the final weights of GConvGRU (K=2) on ``seq``."""
    torch.manual_seed(0)
    model = SnapshotModel("gconvgru", seq.num_features, 8, k=2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    runner = SnapshotRunner(model, seq, 16, torch.device("cpu"), rank, world)
    plan = make_plan(schedule, seq.costs()[:16], make_windows(16, 3), world)
    losses = []
    for epoch in range(epochs):
        optimizer.zero_grad()
        result = train_epoch(runner, plan, epoch)
        all_reduce_gradients(model, torch.device("cpu"))
        optimizer.step()
        loss = torch.tensor([result.loss], dtype=torch.float64)
        if world > 1:
            dist.all_reduce(loss)
        losses.append(float(loss))
    return losses, torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _trainer(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.set_num_threads(1)
    seq = synthetic_sequence(num_nodes=2000, num_snapshots=20, seed=0)
    results = {s: _train(seq, s, rank, 2) for s in ("blad", "contiguous", "vertex")}
    if rank == 0:
        torch.save({s: (losses, weights) for s, (losses, weights) in results.items()}, out)
    dist.destroy_process_group()


@pytest.mark.slow
def test_every_schedule_trains_the_same_model_to_the_same_loss(tmp_path):
    # Chebyshev order 2: the vertex schedule exchanges rows; windows of 3 over 16 training snapshots on 2
    # trainers: the contiguous schedule hands a window's state across its boundary.
    port = free_port()
    out = tmp_path / "results.pt"
    mp.spawn(_trainer, args=(port, str(out)), nprocs=2, join=True)
    torch.set_num_threads(1)
    single_losses, single_weights = _train(synthetic_sequence(num_nodes=2000, num_snapshots=20, seed=0), "blad", 0, 1)
    for schedule, (losses, weights) in torch.load(out).items():
        assert losses == pytest.approx(single_losses, rel=1e-5), schedule
        torch.testing.assert_close(weights, single_weights, rtol=1e-4, atol=1e-5, msg=schedule)


@pytest.mark.slow
def test_the_example_trains_on_a_simulated_cluster(tmp_path, capsys):
    single = run([*SMALL, "--single", "--no-malloc-tuning"], tmp_path, capsys)
    job = run([*SMALL, "--local", "--num-parts=2", "--schedule=contiguous"], tmp_path, capsys)
    assert (job["num_trainers"], job["num_parts"], job["backend"]) == (2, 2, "gloo")
    assert job["train_loss"] == pytest.approx(single["train_loss"], rel=1e-5)
    assert job["test_mse"] == pytest.approx(single["test_mse"], rel=1e-4)
    assert job["load_imbalance"] >= 1.0 and job["epoch_time_s"] > 0


def test_bad_window_is_one_line(tmp_path, capsys):
    run = run_example("snapshot", [*SMALL, "--single", "--no-malloc-tuning", "--window=40"], capsys)
    assert run.code == 2 and "RESULT" not in run.out
    assert run.err.strip() == "error: --window 40 is longer than the 16 training snapshots; give at most 16"
