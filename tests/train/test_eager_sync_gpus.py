"""EagerSync across two GPUs (distgnn/train/grad_sync.py): the R-GCN and link prediction steps without DDP.

Two processes, one GPU each, NCCL. Each trains the examples' dense models (an R-GCN head over typed blocks with a
linear input projection; a GraphSAGE encoder with a dot-product scorer and the BCE loss over positive and
negative pairs), dropout 0, from the same seed on its own random batches, once through DDP and once through the
GradSync step (one flat gradient buffer, one all-reduce): the per-rank losses and final weights agree to float
tolerance and both ranks hold the same weights. With one batch fewer on rank 0, ``agree_steps`` and ``pad`` add a
zero-gradient step there, so the all-reduces pair up and the weights stay equal. Skipped without two GPUs.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
from spawned import run_ranks
from step_batches import random_blocks

from distgnn.nn import RGCN, DotPredictor, GraphSAGE, bce_loss
from distgnn.sampling.block import Block
from distgnn.train.grad_sync import EagerSync

TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2
FANOUTS, FEATS, HIDDEN, RELS, CLASSES = [4, 3], 12, 16, 3, 5


class _RGCNNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inputs = torch.nn.Linear(FEATS, HIDDEN)
        self.head = RGCN(HIDDEN, HIDDEN, CLASSES, RELS, len(FANOUTS), 2, 0.0)

    def forward(self, blocks, x):
        return self.head(blocks, self.inputs(x))


class _LinkNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = GraphSAGE(FEATS, HIDDEN, HIDDEN, len(FANOUTS), 0.0)
        self.predictor = DotPredictor()

    def forward(self, blocks, x):
        return self.encoder(blocks, x)


def _batch(kind: str, size: int, gen: torch.Generator, device: str) -> tuple:
    blocks = random_blocks(size, FANOUTS, gen, device)
    if kind == "rgcn":
        blocks = [
            Block(
                b.src_nids,
                b.num_dst,
                b.indptr,
                b.indices,
                b.eids,
                torch.randint(0, RELS, (b.num_edges,), generator=gen).to(device),
            )
            for b in blocks
        ]
    x = torch.randn(blocks[0].num_src, FEATS, generator=gen).to(device)
    if kind == "rgcn":
        target = torch.randint(0, CLASSES, (size,), generator=gen).to(device)
    else:  # positive and negative pairs over the seeds
        target = torch.randint(0, size, (4, size // 2), generator=gen).to(device)
    return blocks, x, target


def _loss(kind: str, net: torch.nn.Module, model: torch.nn.Module, batch: tuple) -> torch.Tensor:
    blocks, x, target = batch
    out = model(blocks, x)
    if kind == "rgcn":
        return torch.nn.functional.cross_entropy(out, target)
    pos = net.predictor(out[target[0]], out[target[1]])
    return bce_loss(pos, net.predictor(out[target[2]], out[target[3]]))


def _train(rank: int, kind: str, ddp: bool, batches: list) -> tuple[list[float], np.ndarray, int]:
    torch.manual_seed(5)
    net = (_RGCNNet() if kind == "rgcn" else _LinkNet()).to(rank)
    sync = EagerSync(net, net.parameters(), distributed=True, ddp=ddp)
    assert (sync.grad_sync is None) == ddp
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    planned = sync.agree_steps(len(batches))
    losses = []
    for batch in batches:
        loss = _loss(kind, net, sync.model, batch)
        sync.step(loss, [optimizer])
        losses.append(float(loss.detach()))
    sync.pad(planned - len(batches), optimizer)
    return losses, torch.cat([p.detach().reshape(-1) for p in net.parameters()]).cpu().numpy(), planned - len(batches)


def _trainer(rank: int, init: str, sizes: list[int], out) -> None:
    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    try:
        results = {}
        for kind in ("rgcn", "link"):
            gen = torch.Generator().manual_seed(rank)
            batches = [_batch(kind, size, gen, f"cuda:{rank}") for size in sizes]
            results[kind] = {
                "ddp": _train(rank, kind, True, batches),
                "sync": _train(rank, kind, False, batches),
                "uneven": _train(rank, kind, False, batches[:-1] if rank == 0 else batches),
            }
        out.put((rank, results))
    finally:
        dist.destroy_process_group()


@pytest.mark.cuda
@pytest.mark.skipif(not TWO_GPUS, reason="needs two CUDA GPUs")
def test_rgcn_and_link_steps_on_two_gpus_match_ddp(tmp_path):
    sizes = [32, 32, 20, 32, 9]
    results = run_ranks(_trainer, (f"file://{tmp_path}/init", sizes), timeout_s=240)
    for kind in ("rgcn", "link"):
        for rank in (0, 1):
            ddp_losses, ddp_weights, _ = results[rank][kind]["ddp"]
            losses, weights, added = results[rank][kind]["sync"]
            assert losses == pytest.approx(ddp_losses, rel=1e-4, abs=1e-5), kind
            np.testing.assert_allclose(weights, ddp_weights, rtol=1e-4, atol=1e-5)
            assert added == 0
        assert np.array_equal(results[0][kind]["sync"][1], results[1][kind]["sync"][1])  # the same on both ranks
        assert results[0][kind]["uneven"][2] == 1 and results[1][kind]["uneven"][2] == 0
        assert np.array_equal(results[0][kind]["uneven"][1], results[1][kind]["uneven"][1])
