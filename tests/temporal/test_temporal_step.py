"""The dense TGN step (fixed shapes, what the CUDA graph captures) against the eager step: from the same state,
the same loss, gradients, parameters after the optimizer step, memory and mailbox after the commit, and scores.
The CUDA graph replay against the eager step on a GPU (skips without one)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distgnn.data.events import EventStream, synthetic_events
from distgnn.errors import ConfigError
from distgnn.nn.temporal import TGN, NodeMemory
from distgnn.temporal import build_temporal_csr
from distgnn.temporal.step import DenseStep, dense_forward, last_row, write_dense
from distgnn.temporal.train import TGNRunner, batch_ranges

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def stream(feat_dim: int) -> EventStream:
    # 40 nodes and batches of 60 events: nodes repeat within a batch and the first batch has no neighbours.
    return synthetic_events(40, 1300, seed=5, feat_dim=feat_dim)


def make_runner(events: EventStream, device: str = "cpu", step: str = "eager") -> TGNRunner:
    torch.manual_seed(0)
    model = TGN(events.num_nodes, events.feat_dim, memory_dim=16, time_dim=8, embedding_dim=16).to(device)
    return TGNRunner(model, events, build_temporal_csr(events), torch.device(device), k=5, seed=3, step=step)


def copy_state(dst: TGNRunner, dst_opt: torch.optim.Optimizer, src: TGNRunner, src_opt: torch.optim.Optimizer):
    """``src``'s parameters, optimizer state and memory into ``dst``'s tensors, in place (a captured graph keeps
    reading the same addresses)."""
    with torch.no_grad():
        for p, q in zip(dst.model.parameters(), src.model.parameters(), strict=True):
            p.copy_(q)
            for name, value in src_opt.state.get(q, {}).items():
                dst_opt.state[p][name].copy_(value)
    for name in NodeMemory.FIELDS:
        getattr(dst.memory, name).copy_(getattr(src.memory, name))


def make_optimizer(runner: TGNRunner, name: str, capturable: bool = False) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(runner.model.parameters(), lr=1e-2, momentum=0.9)
    return torch.optim.Adam(runner.model.parameters(), lr=1e-2, capturable=capturable)


def assert_same_state(a: TGNRunner, b: TGNRunner, parameters: bool, atol: float = 1e-5) -> None:
    """Gradients, memory and mailbox close; with ``parameters`` the parameters after the step too (not after
    Adam: the keys' bias has a gradient of zero up to float noise, softmax being shift-invariant, and Adam
    scales that noise to steps of the learning rate)."""
    for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=atol)
        if parameters:
            torch.testing.assert_close(p, q, rtol=1e-4, atol=atol)
    for name in NodeMemory.FIELDS:
        torch.testing.assert_close(getattr(a.memory, name), getattr(b.memory, name), rtol=1e-4, atol=atol)


def test_last_row_and_write_dense_match_write_memory_then_store_mail():
    rng = np.random.default_rng(0)
    num_nodes, dim, feat_dim, num_events = 30, 4, 3, 25
    ref, dense = NodeMemory(num_nodes, dim, feat_dim), NodeMemory(num_nodes, dim, feat_dim)
    for name in NodeMemory.FIELDS:  # a state with some mail pending
        value = torch.from_numpy(rng.random(getattr(ref, name).shape)).to(getattr(ref, name).dtype)
        getattr(ref, name).copy_(value)
        getattr(dense, name).copy_(value)
    src = torch.from_numpy(rng.integers(0, num_nodes, num_events))
    dst = torch.from_numpy(rng.integers(0, num_nodes, num_events))
    dst[3] = src[3]  # a self-loop: its destination's message wins, as store_mail orders them
    time = torch.from_numpy(np.sort(rng.random(num_events)))
    feat = torch.rand(num_events, feat_dim)
    # Dense rows: the events' endpoints, then more slots, repeats included; a node's rows hold one memory.
    slots = torch.cat([src, dst, torch.from_numpy(rng.integers(0, num_nodes, 40))])
    per_node = torch.rand(num_nodes, dim)
    rows = per_node[slots]
    scratch = torch.zeros(num_nodes, dtype=torch.int64)
    keys = torch.tensor([4, 1, 4, 4, 2, 1])
    assert last_row(keys, scratch).tolist() == [3, 5, 3, 3, 4, 5]
    write_dense(dense, slots, rows, src, dst, time, feat, scratch)
    distinct = torch.unique(slots)
    ref.write_memory(distinct, per_node[distinct])
    ref.store_mail(src, dst, time, per_node[src], per_node[dst], feat)
    for name in NodeMemory.FIELDS:
        assert torch.equal(getattr(ref, name), getattr(dense, name)), name


@pytest.mark.parametrize("feat_dim,optimizer", [(0, "sgd"), (3, "sgd"), (3, "adam")])
def test_dense_step_equals_the_eager_step_from_the_same_state(feat_dim, optimizer):
    events = stream(feat_dim)
    eager, dense = make_runner(events), make_runner(events)
    eager_opt, dense_opt = make_optimizer(eager, optimizer), make_optimizer(dense, optimizer)
    steps: dict[int, DenseStep] = {}
    for begin, end in batch_ranges(0, 1000, 60):  # 16 full batches and a last one of 40
        if eager_opt.state:
            copy_state(dense, dense_opt, eager, eager_opt)
        loss = eager.train_batch(begin, end, eager_opt)
        step = steps.setdefault(end - begin, DenseStep(dense, dense_opt, end - begin))
        dense_loss = step(begin, dense.draw_negatives(end - begin, 1))
        assert abs(float(dense_loss) - loss) <= 1e-5 * max(1.0, abs(loss))
        assert_same_state(eager, dense, parameters=optimizer == "sgd")


def test_dense_forward_scores_as_forward_with_several_negatives():
    events = stream(2)
    eager, dense = make_runner(events), make_runner(events)
    scratch = torch.zeros(events.num_nodes, dtype=torch.int64)
    for begin, end in batch_ranges(0, 600, 60):
        eager.forward(begin, end, eager.negatives(end - begin, 1)).commit()
        slots = torch.cat([torch.tensor([begin]), dense.draw_negatives(end - begin, 1).flatten()])
        dense_forward(dense, slots, end - begin, scratch).commit()
    negatives = eager.negatives(60, 4)
    with torch.no_grad():
        out = eager.forward(600, 660, negatives)
        dense_out = dense_forward(dense, torch.cat([torch.tensor([600]), negatives.flatten()]), 60, scratch)
    torch.testing.assert_close(dense_out.pos, out.pos, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dense_out.neg, out.neg, rtol=1e-4, atol=1e-5)
    out.commit()
    dense_out.commit()
    for name in NodeMemory.FIELDS:
        torch.testing.assert_close(getattr(eager.memory, name), getattr(dense.memory, name), rtol=1e-4, atol=1e-5)


def test_graph_step_refuses_the_cpu_and_a_non_capturable_optimizer():
    events = stream(0)
    with pytest.raises(ConfigError, match="not a GPU"):
        make_runner(events, step="graph")
    runner = make_runner(events, step="auto")
    assert not runner.graphed
    with pytest.raises(ConfigError, match="not a GPU"):
        DenseStep(runner, torch.optim.Adam(runner.model.parameters()), 60, graph=True)


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("feat_dim,optimizer", [(0, "sgd"), (3, "sgd"), (0, "adam")])
def test_cuda_graph_step_equals_the_eager_step_from_the_same_state(feat_dim, optimizer):
    events = stream(feat_dim)
    eager, graph = make_runner(events, "cuda"), make_runner(events, "cuda", step="graph")
    assert graph.graphed
    with pytest.raises(ConfigError, match="capturable"):
        DenseStep(graph, torch.optim.Adam(graph.model.parameters()), 60, graph=True)
    eager_opt = make_optimizer(eager, optimizer, capturable=True)
    graph_opt = make_optimizer(graph, optimizer, capturable=True)
    # Epoch 0 trains full batches only (two warm-ups, then the capture); the partial last batch of epochs 1 and 2
    # (40 events) is captured ahead, before it runs, with no warm-up of its own.
    for epoch, stop in enumerate([960, 1000, 1000]):
        eager.reset_memory()
        graph.reset_memory()
        for begin, end in batch_ranges(0, stop, 60):
            if eager_opt.state:
                copy_state(graph, graph_opt, eager, eager_opt)
            loss = eager.train_batch(begin, end, eager_opt)
            graph_loss = graph.train_batch(begin, end, graph_opt)
            assert abs(graph_loss - loss) <= 1e-4 * max(1.0, abs(loss)), (epoch, begin)
            assert_same_state(eager, graph, parameters=optimizer == "sgd", atol=1e-4)
        if epoch == 0:
            graph.prepare_steps(graph_opt, {60, 40})
            assert sorted(size for size, _ in graph._dense_steps) == [40, 60]
            assert all(step.captured for step in graph._dense_steps.values())
            assert graph._dense_steps[(40, id(graph_opt))]._warmups == 0
    assert len(graph._dense_steps) == 2
    copy_state(graph, graph_opt, eager, eager_opt)
    ranges = batch_ranges(1000, 1300, 60)
    scores = [runner.evaluate(ranges) for runner in (eager, graph)]
    assert scores[0]["ap"] == pytest.approx(scores[1]["ap"], abs=1e-4)
    for name in NodeMemory.FIELDS:
        torch.testing.assert_close(getattr(eager.memory, name), getattr(graph.memory, name), rtol=1e-4, atol=1e-4)


def test_attention_projecting_filled_slots_only_equals_projecting_every_slot():
    events = stream(3)
    runner = make_runner(events)
    runner.forward(0, 60, runner.negatives(60, 1)).commit()  # some memory and mail: features differ per node
    negatives = runner.negatives(60, 2)
    roots = torch.cat([runner.src[60:120], runner.dst[60:120], negatives.flatten()])
    filled = runner.sampler.sample(roots, runner.time[60].expand(len(roots)).contiguous())[0].mask
    assert 0 < int(filled.sum()) < filled.numel() and not filled.all(1).all() and filled.any(1).any()
    attention = runner.model.attention
    results = []
    for pack in (True, False):
        attention.pack_events = pack
        runner.model.zero_grad()
        out = runner.forward(60, 120, negatives)
        (out.pos.sum() + out.neg.square().sum()).backward()
        results.append((out.pos, out.neg, [p.grad.clone() for p in runner.model.parameters()]))
    (pos, neg, grads), (pos_all, neg_all, grads_all) = results
    torch.testing.assert_close(pos, pos_all)
    torch.testing.assert_close(neg, neg_all)
    for grad, grad_all in zip(grads, grads_all, strict=True):
        torch.testing.assert_close(grad, grad_all, rtol=1e-4, atol=1e-6)
