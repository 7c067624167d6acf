"""TrainStep across two GPUs (distgnn/train/step.py with distgnn/train/grad_sync.py), against the eager DDP step.

Two processes, one GPU each, NCCL. Each trains the same model (dropout 0) from the same seed on its own random
batches of varying size, once eagerly through DDP and once through the captured step (the all-reduce inside the
graph, or two graphs around an eager all-reduce): the per-rank losses and the final weights agree to float
tolerance, and both ranks end with the same weights. With one batch fewer on rank 0, ``agree_steps`` and ``pad``
add one empty step there, so the all-reduces pair up and the weights stay equal. Skipped without two GPUs.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from spawned import run_ranks
from step_batches import random_blocks

from distgnn.nn import GraphSAGE
from distgnn.train.step import WARMUP_STEPS, TrainStep

TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2
FANOUTS, BATCH, FEATS, CLASSES = [5, 4, 3], 48, 20, 7


def _train(rank: int, mode: str, batches: list, capture_all_reduce: bool) -> tuple[list[float], torch.Tensor, int]:
    device = torch.device("cuda", rank)
    torch.manual_seed(3)
    model = GraphSAGE(FEATS, 32, CLASSES, len(FANOUTS), 0.0).to(device)
    step = TrainStep(model, mode, BATCH, FANOUTS, device, distributed=True)
    if step.grad_sync is not None:
        step.grad_sync.capturable = capture_all_reduce
    step.optimizer = torch.optim.Adam(model.parameters(), lr=0.01, fused=True, capturable=step.graphed)
    planned = step.agree_steps(len(batches))
    losses = [float(step(blocks, x, y)[0]) for blocks, x, y in batches]
    added = planned - len(batches)
    step.pad(added)
    assert step.graphed == (mode == "graph") and (not step.graphed or step.captured)
    return losses, torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu(), added


def _trainer(rank: int, init: str, sizes: list[int], out) -> None:
    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    try:
        gen = torch.Generator().manual_seed(rank)
        batches = []
        for size in sizes:
            blocks = random_blocks(size, FANOUTS, gen, f"cuda:{rank}")
            x = torch.randn(blocks[0].num_src, FEATS, generator=gen).to(rank)
            batches.append((blocks, x, torch.randint(0, CLASSES, (size,), generator=gen).to(rank)))
        results = {"eager": _train(rank, "eager", batches, True)}
        results["graph"] = _train(rank, "graph", batches, True)
        results["two graphs"] = _train(rank, "graph", batches, False)
        # Uneven: rank 0 has a batch fewer; pad adds a step, or the last all-reduce would wait forever.
        results["uneven"] = _train(rank, "graph", batches[:-1] if rank == 0 else batches, True)
        out.put((rank, results))
    finally:
        dist.destroy_process_group()


@pytest.mark.cuda
@pytest.mark.skipif(not TWO_GPUS, reason="needs two CUDA GPUs")
def test_captured_step_on_two_gpus_matches_eager_ddp(tmp_path):
    sizes = [48, 48, 40, 48, 48, 31, 48, 17]  # warm-ups, the capture, replays, a short last batch
    assert len(sizes) > WARMUP_STEPS + 1
    results = run_ranks(_trainer, (f"file://{tmp_path}/init", sizes), timeout_s=240)
    for rank in (0, 1):
        eager_losses, eager_weights, _ = results[rank]["eager"]
        for name in ("graph", "two graphs"):
            losses, weights, added = results[rank][name]
            assert losses == pytest.approx(eager_losses, rel=1e-4, abs=1e-5), name
            torch.testing.assert_close(weights, eager_weights, rtol=1e-4, atol=1e-5)
            assert added == 0
        assert torch.equal(results[rank]["graph"][1], results[1 - rank]["graph"][1])  # the same on both ranks
    assert results[0]["uneven"][2] == 1 and results[1]["uneven"][2] == 0
    assert torch.equal(results[0]["uneven"][1], results[1]["uneven"][1])
