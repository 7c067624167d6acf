"""TrainStep (distgnn/train/step.py): the eager step, the CUDA graph's bounds, and the graph against the eager path.

The CPU tests check the capacities against sampled batches, the mode choice and that the eager step is the loop
it replaced. The CUDA tests (skipped without a GPU) train the same model from the same weights on the same
fresh random batches of varying size (a short last batch too) once eagerly and once through the captured graph:
with dropout 0 the losses, right-prediction counts and final weights agree to float tolerance; with dropout the
graph's masks change on every replay; a batch over the bound is refused.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from step_batches import random_blocks

from distgnn.data.synthetic import synthetic
from distgnn.errors import ConfigError, InputError
from distgnn.nn import GAT, MLP, GraphSAGE
from distgnn.sampling.block import Block
from distgnn.sampling.neighbor import NeighborSampler
from distgnn.sampling.source import InProcessGraph
from distgnn.train.step import (
    IGNORE_INDEX,
    WARMUP_STEPS,
    TrainStep,
    block_capacities,
    copy_padded,
    graph_unsupported,
)

CUDA = torch.cuda.is_available()


def needs_cuda(test):
    """Marked ``cuda`` and skipped without a GPU."""
    return pytest.mark.cuda(pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")(test))


def test_capacities_bound_sampled_batches():
    assert block_capacities(1024, [15, 10, 5]) == [
        (67584 + 67584 * 15, 67584, 67584 * 15),
        (6144 + 61440, 6144, 61440),
        (1024 + 5120, 1024, 5120),
    ]
    # A real sampler's batch fits its bound.
    g = InProcessGraph(synthetic(2000, 10, feat_dim=4, num_classes=3, seed=3))
    fanouts = [4, 3]
    seeds = torch.randperm(2000, generator=torch.Generator().manual_seed(3))[:40]
    blocks = NeighborSampler(fanouts).sample_blocks(g, seeds, rng_seed=7)[2]
    for block, (src_cap, dst_cap, edge_cap) in zip(blocks, block_capacities(40, fanouts), strict=True):
        assert block.num_src <= src_cap and block.num_dst <= dst_cap and block.num_edges <= edge_cap
        assert block.num_edges > 0
    with pytest.raises(ConfigError, match="fanout"):
        block_capacities(1024, [15, -1])


def test_a_batch_fills_the_leading_entries_and_pads_the_rest():
    gen = torch.Generator().manual_seed(8)
    fanouts = [3, 2]
    caps = block_capacities(12, fanouts)
    buffers = [
        Block(torch.zeros(src), dst, torch.full((dst + 1,), -7), torch.full((edges,), -7), torch.empty(0))
        for src, dst, edges in caps
    ]
    labels = torch.full((12,), -7)
    for seeds in (12, 5, 9):  # the padding must also cover what a larger batch left behind
        blocks = random_blocks(seeds, fanouts, gen)
        y = torch.randint(0, 4, (seeds,), generator=gen)
        copy_padded(blocks, y, buffers, labels)
        for block, buf in zip(blocks, buffers, strict=True):
            assert torch.equal(buf.indptr[: block.num_dst + 1], block.indptr)
            assert (buf.indptr[block.num_dst :] == block.num_edges).all()
            assert torch.equal(buf.indices[: block.num_edges], block.indices)
        assert torch.equal(labels[:seeds], y) and (labels[seeds:] == IGNORE_INDEX).all()


def test_mode_choice_on_the_cpu():
    model = GraphSAGE(8, 16, 3, 2, 0.0)
    assert TrainStep(model, "auto", 32, [3, 2], torch.device("cpu")).mode == "eager"
    assert "not a GPU" in graph_unsupported(model, [3, 2], torch.device("cpu"))
    with pytest.raises(ConfigError, match="--step graph cannot run"):
        TrainStep(model, "graph", 32, [3, 2], torch.device("cpu"))
    with pytest.raises(ConfigError, match="step mode"):
        TrainStep(model, "fast", 32, [3, 2], torch.device("cpu"))


def test_eager_step_is_the_loop_it_replaced():
    torch.manual_seed(0)
    model = GraphSAGE(12, 16, 5, 2, 0.0)
    reference = copy.deepcopy(model)
    step = TrainStep(model, "eager", 16, [3, 2], torch.device("cpu"), torch.optim.Adam(model.parameters(), lr=0.01))
    opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1)
    with step.epoch(5) as agreed:  # one trainer: the epoch agrees on its own plan and pads nothing
        assert agreed == 5
        for _ in range(3):
            blocks = random_blocks(16, [3, 2], gen)
            x, y = torch.randn(blocks[0].num_src, 12, generator=gen), torch.randint(0, 5, (16,), generator=gen)
            loss, correct = step(blocks, x, y)
            logits = reference(blocks, x)
            expected = F.cross_entropy(logits, y)
            opt.zero_grad()
            expected.backward()
            opt.step()
            assert torch.equal(loss, expected) and int(correct) == int((logits.argmax(1) == y).sum())
    assert step.steps_taken == 3
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)


def test_eager_step_marks_where_forward_and_backward_end():
    torch.manual_seed(0)
    model = GraphSAGE(12, 16, 5, 2, 0.0)
    step = TrainStep(model, "eager", 16, [3, 2], torch.device("cpu"), torch.optim.Adam(model.parameters(), lr=0.01))
    gen = torch.Generator().manual_seed(1)
    blocks = random_blocks(16, [3, 2], gen)
    x, y = torch.randn(blocks[0].num_src, 12, generator=gen), torch.randint(0, 5, (16,), generator=gen)
    seen = []

    def mark(stage: str) -> None:  # what had happened when each stage was marked
        grads = [p.grad for p in model.parameters()]
        seen.append((stage, all(g is None or not g.any() for g in grads)))

    before = [p.detach().clone() for p in model.parameters()]
    step(blocks, x, y, mark)
    assert seen == [("forward", True), ("backward", False)]  # no gradient at the first mark, gradients at the second
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # then the update


def _train_pair(model_cls, dropout: float, sizes: list[int], seed: int):
    """The same model trained eagerly and through the graph on the same random batches."""
    device = torch.device("cuda")
    fanouts, batch_size, feats, classes = [5, 4, 3], 48, 20, 7
    torch.manual_seed(seed)
    eager_model = model_cls(feats, 32, classes, 3, dropout).to(device)
    graph_model = copy.deepcopy(eager_model)
    eager = TrainStep(eager_model, "eager", batch_size, fanouts, device)
    eager.optimizer = torch.optim.Adam(eager_model.parameters(), lr=0.01, fused=True)
    graphed = TrainStep(graph_model, "graph", batch_size, fanouts, device)
    graphed.optimizer = torch.optim.Adam(graph_model.parameters(), lr=0.01, fused=True, capturable=True)
    gen = torch.Generator().manual_seed(seed)
    results = []
    for k, size in enumerate(sizes):
        blocks = random_blocks(size, fanouts, gen, "cuda")
        x = torch.randn(blocks[0].num_src, feats, generator=gen).cuda()
        y = torch.randint(0, classes, (size,), generator=gen).cuda()
        e_loss, e_correct = eager(blocks, x, y)
        assert eager.input_rows(len(x), feats, x.dtype) is None
        if k % 2:  # as the feature cache does: the features gathered into the graph's input buffer
            x = graphed.input_rows(len(x), feats, x.dtype).copy_(x)
        g_loss, g_correct = graphed(blocks, x, y)
        results.append((float(e_loss), int(e_correct), float(g_loss), int(g_correct)))
    return eager_model, graph_model, graphed, results


@needs_cuda
@pytest.mark.parametrize("model_cls", [GraphSAGE, MLP])
def test_graph_step_matches_the_eager_step(model_cls):
    sizes = [48, 48, 40, 48, 48, 17]  # warm-up steps, the capture, replays, a short last batch
    eager_model, graph_model, graphed, results = _train_pair(model_cls, 0.0, sizes, seed=11)
    assert graphed.captured and len(sizes) > WARMUP_STEPS
    for e_loss, e_correct, g_loss, g_correct in results:
        assert g_loss == pytest.approx(e_loss, rel=1e-4, abs=1e-5)
        assert g_correct == e_correct
    for a, b in zip(eager_model.parameters(), graph_model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


@needs_cuda
def test_graph_step_redraws_dropout_on_every_replay():
    device = torch.device("cuda")
    torch.manual_seed(5)
    model = GraphSAGE(10, 32, 4, 2, 0.5).to(device)
    step = TrainStep(model, "graph", 24, [4, 3], device)
    step.optimizer = torch.optim.Adam(model.parameters(), lr=0.0, fused=True, capturable=True)  # weights stay
    gen = torch.Generator().manual_seed(2)
    blocks = random_blocks(24, [4, 3], gen, "cuda")
    x, y = torch.randn(blocks[0].num_src, 10, generator=gen).cuda(), torch.randint(0, 4, (24,), generator=gen).cuda()
    losses = [float(step(blocks, x, y)[0]) for _ in range(WARMUP_STEPS + 3)]
    assert step.captured
    replays = losses[WARMUP_STEPS:]
    assert all(loss == loss for loss in replays) and len(set(replays)) == len(replays)


@needs_cuda
def test_graph_step_refuses_a_batch_over_its_bound_and_pads_labels():
    device = torch.device("cuda")
    model = GraphSAGE(6, 8, 3, 2, 0.0).to(device)
    step = TrainStep(model, "graph", 8, [2, 2], device)
    step.optimizer = torch.optim.Adam(model.parameters(), lr=0.01, fused=True, capturable=True)
    gen = torch.Generator().manual_seed(4)
    blocks = random_blocks(8, [2, 2], gen, "cuda")
    blocks[-1].indptr = torch.arange(9, device=device) * 3  # 3 in-edges per seed: 24 edges, over 8 x 2
    blocks[-1].indices = torch.zeros(24, dtype=torch.int64, device=device)
    x, y = torch.randn(blocks[0].num_src, 6, device=device), torch.zeros(8, dtype=torch.int64, device=device)
    with pytest.raises(InputError, match="over the CUDA graph's bound"):
        step(blocks, x, y)
    blocks = random_blocks(5, [2, 2], gen, "cuda")
    step(blocks, torch.randn(blocks[0].num_src, 6, device=device), torch.ones(5, dtype=torch.int64, device=device))
    labels = step._buffers[1]
    assert labels.tolist() == [1] * 5 + [IGNORE_INDEX] * 3


@needs_cuda
def test_auto_keeps_models_that_sync_eager():
    device = torch.device("cuda")
    gat = GAT(6, 8, 3, 2, 2, 0.0).to(device)
    assert TrainStep(gat, "auto", 8, [2, 2], device).mode == "eager"
    sage = GraphSAGE(6, 8, 3, 2, 0.0).to(device)
    assert TrainStep(sage, "auto", 8, [2, -1], device).mode == "eager"
    assert TrainStep(sage, "auto", 8, [2, 2], device).mode == "graph"
