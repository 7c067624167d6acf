"""GradSync (distgnn/train/grad_sync.py): gradients as views of one flat buffer, averaged by one all-reduce.

In one process (a gloo group of one): every ``.grad`` is a view of the buffer of its dtype, backward accumulates
into it, ``zero_`` clears it and ``attach`` restores the views after ``set_to_none``. In two gloo processes: rank
0's weights are broadcast; a few Adam steps on different batches per rank give the same gradients and weights as
DDP; ``agree_steps`` (before the steps) gives both the larger step count, and the padded steps (zero gradient) pair
up the all-reduces,
so a trainer with fewer batches neither hangs nor drifts from the others.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from spawned import run_ranks
from torch.nn.parallel import DistributedDataParallel

from distgnn.errors import ConfigError
from distgnn.train.collective import broadcast_tensors
from distgnn.train.grad_sync import GradSync


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def test_needs_an_initialised_group():
    assert not dist.is_initialized()
    with pytest.raises(ConfigError, match="init_process_group"):
        GradSync(_model(0).parameters())


def test_gradients_are_views_of_one_buffer_per_dtype(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/init", rank=0, world_size=1)
    try:
        model = _model(0)
        extra = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
        frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
        sync = GradSync([*model.parameters(), extra, frozen])
        assert all(p is not frozen for p in sync.params) and set(sync.buffers) == {torch.float32, torch.float64}
        assert sync.buffers[torch.float32].numel() == sum(p.numel() for p in model.parameters())
        for p in model.parameters():
            assert p.grad.untyped_storage().data_ptr() == sync.buffers[torch.float32].untyped_storage().data_ptr()
        x = torch.randn(5, 6)
        model(x).square().sum().backward()
        (extra * 2).sum().backward()
        reference = copy.deepcopy(model)
        for p in reference.parameters():
            p.grad = None
        reference(x).square().sum().backward()
        flat = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
        torch.testing.assert_close(sync.buffers[torch.float32], flat)  # accumulated in place, in order
        assert torch.equal(sync.buffers[torch.float64], torch.full((4,), 2.0, dtype=torch.float64))
        sync.all_reduce()  # a group of one: unchanged
        torch.testing.assert_close(sync.buffers[torch.float32], flat)
        sync.zero_()
        assert all(not p.grad.any() for p in sync.params) and sync.attached()
        torch.optim.SGD(model.parameters()).zero_grad(set_to_none=True)
        assert not sync.attached()
        sync.attach()
        assert sync.attached() and sync.agree_steps(4) == 4
        with pytest.raises(ConfigError, match=">= 0"):
            sync.agree_steps(-1)
    finally:
        dist.destroy_process_group()


def _trainer(rank: int, init: str, out) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        # Different weights per rank: the broadcast must make them rank 0's.
        ddp_model = DistributedDataParallel(_model(0))
        model = _model(rank)  # rank 0 seeds as DDP's copy did
        sync = GradSync(model.parameters())
        same_start = all(torch.equal(a, b) for a, b in zip(model.parameters(), ddp_model.parameters(), strict=True))
        ddp_opt = torch.optim.Adam(ddp_model.parameters(), lr=0.05)
        opt = torch.optim.Adam(model.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(rank)
        grad_gaps = []
        for _ in range(4):  # different batches per rank, of different sizes
            x, y = torch.randn(7 + 3 * rank, 6, generator=gen), torch.randint(0, 3, (7 + 3 * rank,), generator=gen)
            ddp_opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp_model(x), y).backward()
            ddp_opt.step()
            sync.zero_()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            sync.all_reduce()
            grad_gaps.append(
                max(
                    float((a.grad - b.grad).abs().max())
                    for a, b in zip(model.parameters(), ddp_model.parameters(), strict=True)
                )
            )
            opt.step()
        weight_gap = max(
            float((a - b).abs().max()) for a, b in zip(model.parameters(), ddp_model.parameters(), strict=True)
        )
        # Uneven batch counts: rank 0 has 2 batches, rank 1 has 5; rank 0 pads with zero-gradient steps.
        taken = 2 if rank == 0 else 5
        padded = sync.agree_steps(taken) - taken
        for _ in range(taken):
            sync.zero_()
            model(torch.randn(4, 6, generator=gen)).sum().backward()
            sync.all_reduce()
            opt.step()
        for _ in range(padded):
            sync.zero_()
            sync.all_reduce()
            opt.step()
        weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        mine = weights.clone()
        broadcast_tensors([weights], src=1)  # rank 1's, to compare with
        out.put((rank, (same_start, grad_gaps, weight_gap, padded, float((mine - weights).abs().max()))))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two processes that import torch
def test_two_trainers_match_ddp_and_even_out_their_steps(tmp_path):
    results = run_ranks(_trainer, (f"file://{tmp_path}/init",), timeout_s=120)
    for rank in (0, 1):
        same_start, grad_gaps, weight_gap, _, drift = results[rank]
        assert same_start  # broadcast from rank 0, as DDP does
        assert max(grad_gaps) < 1e-6 and weight_gap < 1e-5  # the flat all-reduce is DDP's average
        assert drift == 0.0  # after the padded steps both ranks hold the same weights
    assert results[0][3] == 3 and results[1][3] == 0
