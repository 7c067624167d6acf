"""TGN pieces: mailbox semantics, no leak of a batch's own events, time encoding, a short training run, what an
evaluation scores and which memory."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from distgnn.data.events import EventStream, read_events, synthetic_events
from distgnn.errors import ConfigError
from distgnn.nn.temporal import TGN, NodeMemory, TimeEncoder
from distgnn.temporal import build_temporal_csr
from distgnn.temporal.train import (
    TGNRunner,
    average_precision,
    batch_ranges,
    chronological_split,
    train_epoch,
)
from distgnn.temporal.warm import replay_memory

COLLEGE_MSG = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "snap" / "CollegeMsg.txt"


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def small_runner(events: EventStream, seed: int = 0, static_dim: int = 0, learn_time: bool = False) -> TGNRunner:
    torch.manual_seed(seed)
    model = TGN(
        events.num_nodes,
        events.feat_dim,
        memory_dim=16,
        time_dim=8,
        embedding_dim=16,
        static_dim=static_dim,
        learn_time=learn_time,
    )
    return TGNRunner(model, events, build_temporal_csr(events), torch.device("cpu"), k=5, seed=seed, num_threads=1)


def test_store_mail_keeps_each_nodes_last_event():
    memory = NodeMemory(5, 2, edge_dim=1)
    src, dst = torch.tensor([0, 1, 0]), torch.tensor([1, 2, 3])
    time = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    src_mem = torch.tensor([[1.0, 1], [2, 2], [3, 3]])
    dst_mem = torch.tensor([[4.0, 4], [5, 5], [6, 6]])
    feat = torch.tensor([[7.0], [8.0], [9.0]])
    memory.store_mail(src, dst, time, src_mem, dst_mem, feat)
    assert memory.has_mail.tolist() == [True, True, True, True, False]
    # node 0: last event 2 (as source); node 1: event 1 (source) after event 0 (destination)
    torch.testing.assert_close(memory.mail[0], torch.tensor([3.0, 3, 6, 6, 9]))
    torch.testing.assert_close(memory.mail[1], torch.tensor([2.0, 2, 5, 5, 8]))
    torch.testing.assert_close(memory.mail[2], torch.tensor([5.0, 5, 2, 2, 8]))
    assert memory.mail_time.tolist() == [3.0, 2.0, 2.0, 3.0, 0.0]
    memory.write_memory(torch.tensor([0, 4]), torch.ones(2, 2))
    assert memory.last_update.tolist() == [3.0, 0.0, 0.0, 0.0, 0.0]
    assert memory.has_mail.tolist() == [False, True, True, True, False]
    restored = NodeMemory(5, 2, edge_dim=1)
    restored.load_state(memory.state())
    for name in NodeMemory.FIELDS:
        torch.testing.assert_close(getattr(restored, name), getattr(memory, name))


def test_time_encoder_is_cos_of_affine_time():
    t = torch.tensor([0.0, 1.5, 1e6, 3e7], dtype=torch.float64)
    learned = TimeEncoder(6, learnable=True)
    w, b = learned.linear.weight.squeeze(1), learned.linear.bias
    torch.testing.assert_close(learned(t), torch.cos(t.float().unsqueeze(1) * w + b))
    assert math.isclose(float(w[0].detach()), 1.0) and math.isclose(float(w[-1].detach()), 1e-9, rel_tol=1e-5)
    fixed = TimeEncoder(6)
    torch.testing.assert_close(fixed(t), learned(t))  # the same start, one of them never trained
    assert list(fixed.parameters()) == [] and len(list(learned.parameters())) == 2


def test_tgn_trains_its_time_frequencies_only_when_asked():
    def time_params(model):
        return [name for name, _ in model.named_parameters() if ".time." in name]

    assert time_params(TGN(10, 2, memory_dim=4, time_dim=4, embedding_dim=4)) == []
    assert sorted(time_params(TGN(10, 2, memory_dim=4, time_dim=4, embedding_dim=4, learn_time=True))) == [
        "attention.time.linear.bias",
        "attention.time.linear.weight",
        "updater.time.linear.bias",
        "updater.time.linear.weight",
    ]


def test_a_batch_reads_memory_before_its_own_events():
    """Scores of a batch's first event do not change when the batch's other events change."""
    events = synthetic_events(200, 3000, seed=1)
    changed_dst = events.dst.copy()
    changed_dst[2001:2100] = (changed_dst[2001:2100] + 17) % events.num_nodes
    other = EventStream(events.src, changed_dst, events.time, events.num_nodes)
    scores = []
    for stream in (events, other):
        runner = small_runner(stream)
        for begin, end in batch_ranges(0, 2000, 100):
            runner.forward(begin, end, runner.negatives(end - begin, 1)).commit()
        with torch.no_grad():
            out = runner.forward(2000, 2100, runner.negatives(100, 3))
        scores.append((out.pos[0], out.neg[0]))
        before = runner.memory.state()
        out.commit()
        assert not np.array_equal(before["has_mail"], runner.memory.state()["has_mail"])
    torch.testing.assert_close(scores[0][0], scores[1][0])
    torch.testing.assert_close(scores[0][1], scores[1][1])


def test_memory_of_a_node_is_the_gru_of_its_last_mail():
    events = synthetic_events(100, 400, seed=2)
    runner = small_runner(events)
    runner.forward(0, 200, runner.negatives(200, 1)).commit()
    node = int(events.src[150])
    memory = runner.memory
    mail, mail_time, stored = memory.mail[node].clone(), memory.mail_time[node].clone(), memory.memory[node].clone()
    with torch.no_grad():
        read = runner.model.read_memory(memory, torch.tensor([node]))
        expected = runner.model.updater(mail[None], (mail_time - memory.last_update[node])[None], stored[None])
    torch.testing.assert_close(read, expected)


def test_average_precision_matches_hand_computation():
    assert average_precision(np.array([0.9, 0.4]), np.array([0.5, 0.1])) == pytest.approx((1 + 2 / 3) / 2)
    assert average_precision(np.array([1.0]), np.array([1.0])) == pytest.approx(0.5)


def test_split_and_static_memory():
    assert chronological_split(100) == (70, 85)
    events = synthetic_events(50, 200, seed=3)
    runner = small_runner(events, static_dim=4)
    out = runner.forward(0, 50, runner.negatives(50, 2))
    assert out.pos.shape == (50,) and out.neg.shape == (50, 2)
    (out.pos.sum() + out.neg.sum()).backward()
    assert runner.model.static.weight.grad.abs().sum() > 0


@pytest.mark.slow
def test_training_learns_a_repeated_partner_signal(one_thread):
    """Each source always messages the same partner. Without node features every memory starts equal, and what
    tells nodes apart is their event times; trained frequencies (at this lr) hash those times into distinct
    memories within an epoch, TGN's fixed ones need more epochs, so this toy trains them (the default's accuracy
    is tested on real events below)."""
    rng = np.random.default_rng(0)
    src = rng.integers(0, 300, 8000)
    events = EventStream(src, rng.permutation(300)[src], np.arange(8000, dtype=np.float64), 300)
    runner = small_runner(events, learn_time=True)
    optimizer = torch.optim.Adam(runner.model.parameters(), lr=1e-2)
    train_end, val_end = chronological_split(len(events))
    loss, timing = train_epoch(runner, batch_ranges(0, train_end, 200), optimizer)
    assert timing.events == train_end and timing.events_per_s > 0 and loss < 2 * math.log(2)
    val = runner.evaluate(batch_ranges(train_end, val_end, 200), mrr=True)
    assert val["ap"] > 0.65 and val["auc"] > 0.65 and 0 < val["mrr"] <= 1


@pytest.mark.slow
def test_default_model_learns_collegemsg_in_one_epoch(one_thread):
    """The default TGN (fixed time encoding, PyG's example's sizes) on real events: one epoch of CollegeMsg's
    training share lifts validation AP well above chance (0.5; 3 epochs reach ~0.83)."""
    if not COLLEGE_MSG.is_file():
        pytest.skip(f"CollegeMsg not found at {COLLEGE_MSG} (shared data absent)")
    events = read_events(COLLEGE_MSG)
    torch.manual_seed(0)
    model = TGN(events.num_nodes, events.feat_dim)
    runner = TGNRunner(model, events, build_temporal_csr(events), torch.device("cpu"), k=10, seed=0, num_threads=1)
    train_end, val_end = chronological_split(len(events))
    train_epoch(runner, batch_ranges(0, train_end, 200), torch.optim.Adam(model.parameters(), lr=1e-4))
    assert runner.evaluate(batch_ranges(train_end, val_end, 200))["ap"] > 0.75


def test_evaluation_scores_fixed_pairs_and_leaves_training_alone(one_thread):
    """Evaluation negatives come from their own stream, restarted at every evaluation: two evaluations of the same
    weights and memory agree exactly, and the training negatives' stream does not move."""
    events = synthetic_events(60, 1200, seed=4)
    runner = small_runner(events)
    train_end, val_end = chronological_split(len(events))
    train_epoch(runner, batch_ranges(0, train_end, 100), torch.optim.Adam(runner.model.parameters(), lr=1e-3))
    saved = runner.memory.state()
    before = runner.generator.get_state().clone()
    first = runner.evaluate(batch_ranges(train_end, val_end, 100))
    runner.memory.load_state(saved)  # evaluation moved the memory over the validation events: put it back
    assert runner.evaluate(batch_ranges(train_end, val_end, 100)) == first
    assert torch.equal(runner.generator.get_state(), before)
    runner.eval_seed = 1
    runner.memory.load_state(saved)
    assert runner.evaluate(batch_ranges(train_end, val_end, 100)) != first  # other negatives, other figures


def test_evaluation_with_catch_up_replays_a_scratch_copy(one_thread):
    """``catch_up`` evaluates a copy of the memory moved over the events it has not seen (memory only): the same
    figures as replaying them into the memory itself first, and the memory stays where it was."""
    events = synthetic_events(60, 1200, seed=5)
    runner = small_runner(events)
    train_end, val_end = chronological_split(len(events))
    half = batch_ranges(0, train_end, 100)
    train_epoch(runner, half[: len(half) // 2], torch.optim.Adam(runner.model.parameters(), lr=1e-3))
    stands = runner.memory.state()
    caught = runner.evaluate(batch_ranges(train_end, val_end, 100), catch_up=half[len(half) // 2 :])
    for name, array in runner.memory.state().items():
        assert np.array_equal(array, stands[name]), name
    replay_memory(runner.model, runner.memory, runner.src, runner.dst, runner.time, runner.feat, half[len(half) // 2 :])
    assert runner.evaluate(batch_ranges(train_end, val_end, 100)) == caught
    runner.memory.load_state(stands)
    assert runner.evaluate(batch_ranges(train_end, val_end, 100)) != caught  # the catch-up matters


def test_clipping_bounds_each_steps_gradient_norm(one_thread):
    """``clip_grad_norm``: the gradient a step applies has a global norm of at most the bound (here far below
    the unclipped one); a bound that is not positive is one clear error."""
    events = synthetic_events(60, 1200, seed=6)
    runner = small_runner(events)
    optimizer = torch.optim.Adam(runner.model.parameters(), lr=1e-3)

    def grad_norm() -> float:
        return float(torch.norm(torch.stack([p.grad.norm() for p in runner.model.parameters() if p.grad is not None])))

    runner.train_batch(0, 100, optimizer)
    unclipped = grad_norm()
    runner.clip_grad_norm = unclipped / 10
    runner.train_batch(100, 200, optimizer)
    assert grad_norm() <= unclipped / 10 * (1 + 1e-5)
    with pytest.raises(ConfigError, match="clipping norm must be > 0, got 0"):
        TGNRunner(runner.model, events, build_temporal_csr(events), torch.device("cpu"), k=5, clip_grad_norm=0)


def test_warmup_moves_the_memory_over_the_first_batches_without_training_them(one_thread):
    """``warmup=N``: the epoch's first N batches go through the memory alone (as a replay), the others train; the
    memory ends as a replay of the first N followed by training on the rest from the same weights."""
    events = synthetic_events(60, 1200, seed=7)
    ranges = batch_ranges(0, 800, 100)
    runner, twin = small_runner(events), small_runner(events)
    steps = []
    loss, timing = train_epoch(
        runner,
        ranges,
        torch.optim.Adam(runner.model.parameters(), lr=1e-3),
        on_step=lambda i, v: steps.append(v),
        warmup=3,
    )
    assert len(steps) == len(ranges) - 3 and loss == pytest.approx(float(np.mean(steps)))
    assert timing.events == 500
    replay_memory(twin.model, twin.memory, twin.src, twin.dst, twin.time, twin.feat, ranges[:3])
    train_epoch(twin, ranges[3:], torch.optim.Adam(twin.model.parameters(), lr=1e-3), reset=False)
    for name, array in runner.memory.state().items():
        np.testing.assert_array_equal(array, twin.memory.state()[name], err_msg=name)


def test_normalized_memory_is_what_the_attention_reads():
    """``normalize_memory``: each node's memory row reaches the attention with mean 0 and variance 1 (a zero row,
    a node never updated, stays zero); the model has no more parameters than without it."""
    torch.manual_seed(0)
    plain = TGN(10, 0, memory_dim=16, time_dim=8, embedding_dim=16)
    torch.manual_seed(0)
    normed = TGN(10, 0, memory_dim=16, time_dim=8, embedding_dim=16, normalize_memory=True)
    assert plain.state_dict().keys() == normed.state_dict().keys()
    rows = torch.randn(4, 16) * 5 + 3
    rows[2] = 0
    features = normed.node_features(torch.arange(4), rows)
    kept = [0, 1, 3]
    torch.testing.assert_close(features[kept].mean(1), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(features[kept].var(1, unbiased=False), torch.ones(3), atol=1e-3, rtol=0)
    assert torch.equal(features[2], torch.zeros(16))
    assert torch.equal(plain.node_features(torch.arange(4), rows), rows)
