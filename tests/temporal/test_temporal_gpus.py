"""TGN memory copies on two GPUs (memory parallelism 2): the captured step with GradSync against eager DDP.

Two processes, one GPU and one memory copy each, NCCL. Each trains its own time segment of a small synthetic
stream (rank 1's ends in a short batch, captured at its first run, after the full batches' capture; rank 0
captures that size ahead after epoch 0, as the job does, and never runs it) for three epochs,
once through DDP with the eager step and once through :class:`~distgnn.temporal.step.DenseStep` replayed from a
CUDA graph that holds the gradient all-reduce (:class:`~distgnn.train.grad_sync.GradSync`), with SGD: the
per-rank losses of every step and the final weights agree to float tolerance, and both ranks end with the same
weights. Skipped without two GPUs. On the CPU, in a gloo group of one, the steps with a GradSync train as
without one and keep its gradient views.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from spawned import run_ranks
from torch.nn.parallel import DistributedDataParallel

from distgnn.data.events import synthetic_events
from distgnn.nn.temporal import TGN
from distgnn.temporal import build_temporal_csr
from distgnn.temporal.loop import NO_BUFFER_SYNC
from distgnn.temporal.step import DenseStep
from distgnn.temporal.train import TGNRunner, batch_ranges, train_epoch
from distgnn.train.grad_sync import GradSync

TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2
EPOCHS = 3


def _segment(rank: int) -> list[tuple[int, int]]:
    # Eight batches each; rank 1's last batch is 30 events (a second DenseStep size).
    return batch_ranges(0, 480, 60) if rank == 0 else batch_ranges(480, 930, 60)


def _train(rank: int, mode: str) -> tuple[list[float], torch.Tensor]:
    device = torch.device("cuda", rank)
    events = synthetic_events(40, 1300, seed=5, feat_dim=3)
    torch.manual_seed(0)
    model = TGN(events.num_nodes, events.feat_dim, memory_dim=16, time_dim=8, embedding_dim=16).to(device)
    sync = GradSync(model.parameters()) if mode == "graph" else None
    net = DistributedDataParallel(model, device_ids=[rank], **NO_BUFFER_SYNC) if sync is None else None
    runner = TGNRunner(model, events, build_temporal_csr(events), device, k=5, seed=3 + rank, step=mode, grad_sync=sync)
    assert runner.graphed == (mode == "graph")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    steps: list[torch.Tensor] = []
    for epoch in range(EPOCHS):
        train_epoch(runner, _segment(rank), optimizer, net, lambda _, loss: steps.append(loss), lazy_loss=True)
        if epoch == 0:
            runner.prepare_steps(optimizer, {60, 30})
            assert len(runner._dense_steps) == (2 if sync is not None else 0)
    losses = [float(loss) for loss in steps]
    if sync is not None:
        assert all(step._graph is not None for step in runner._dense_steps.values())
        assert sync.attached()
    runner.release_steps()  # before the process group goes: NCCL's teardown waits on a live graph's communicator
    return losses, torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()


def _trainer(rank: int, init: str, out) -> None:
    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    try:
        out.put((rank, {mode: _train(rank, mode) for mode in ("eager", "graph")}))
    finally:
        dist.destroy_process_group()


@pytest.mark.cuda
@pytest.mark.skipif(not TWO_GPUS, reason="needs two CUDA GPUs")
def test_memory_copies_on_two_gpus_captured_step_matches_eager_ddp(tmp_path):
    results = run_ranks(_trainer, (f"file://{tmp_path}/init",), timeout_s=240, clean_exit=True)
    for rank in (0, 1):
        eager_losses, eager_weights = results[rank]["eager"]
        graph_losses, graph_weights = results[rank]["graph"]
        assert len(graph_losses) == len(eager_losses) == EPOCHS * 8
        torch.testing.assert_close(torch.tensor(graph_losses), torch.tensor(eager_losses), rtol=1e-3, atol=1e-4)
        torch.testing.assert_close(graph_weights, eager_weights, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(results[0]["graph"][1], results[1]["graph"][1], rtol=0, atol=1e-6)


def test_steps_with_a_grad_sync_keep_its_views_and_train_as_without(tmp_path):
    """On the CPU, in a gloo group of one: the dense and the eager step with a GradSync train as without one (the
    all-reduce of one trainer is the identity) and leave every ``.grad`` a view of its flat buffer."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/init", rank=0, world_size=1)
    try:
        events = synthetic_events(40, 1300, seed=5, feat_dim=3)
        csr = build_temporal_csr(events)
        for step in ("dense", "eager"):
            runs = []
            for synced in (False, True):
                torch.manual_seed(0)
                model = TGN(events.num_nodes, events.feat_dim, memory_dim=16, time_dim=8, embedding_dim=16)
                sync = GradSync(model.parameters()) if synced else None
                runner = TGNRunner(model, events, csr, torch.device("cpu"), k=5, seed=3, grad_sync=sync)
                optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
                losses = []
                for begin, end in batch_ranges(0, 240, 60):
                    if step == "dense":
                        dense = DenseStep(runner, optimizer, end - begin, grad_sync=sync)
                        losses.append(float(dense(begin, runner.draw_negatives(end - begin, 1))))
                    else:
                        losses.append(float(runner.train_step(begin, end, optimizer)))
                    assert sync is None or sync.attached()
                runs.append((losses, torch.cat([p.detach().reshape(-1) for p in model.parameters()])))
            torch.testing.assert_close(torch.tensor(runs[1][0]), torch.tensor(runs[0][0]), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(runs[1][1], runs[0][1], rtol=1e-5, atol=1e-6)
    finally:
        dist.destroy_process_group()
