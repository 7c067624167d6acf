"""The C++ layer kernels (mean aggregation, fused ReLU + dropout) against their torch / numpy references."""

from __future__ import annotations

import resource
import subprocess
import sys

import numpy as np
import pytest
import torch

import distgnn.nn.aggregate as aggregate
from distgnn.nn import GraphSAGE, SAGEConv
from distgnn.nn.fused import drop_threshold, relu_dropout, relu_dropout_reference
from distgnn.sampling import cpu
from distgnn.sampling.block import Block


def random_block(rng: np.random.Generator, num_dst: int, num_src: int, max_degree: int) -> Block:
    degrees = rng.integers(0, max_degree + 1, num_dst)
    degrees[rng.random(num_dst) < 0.2] = 0  # destinations without in-edges
    indptr = np.zeros(num_dst + 1, dtype=np.int64)
    np.cumsum(degrees, out=indptr[1:])
    indices = rng.integers(0, num_src, int(indptr[-1]))  # repeats allowed
    return make_block(num_src, num_dst, indptr, indices)


def make_block(num_src: int, num_dst: int, indptr, indices) -> Block:
    indptr, indices = torch.as_tensor(indptr, dtype=torch.int64), torch.as_tensor(indices, dtype=torch.int64)
    return Block(torch.arange(num_src), num_dst, indptr, indices, torch.arange(len(indices)))


@pytest.mark.parametrize("with_self", [False, True])
@pytest.mark.parametrize("width", [1, 7, 100])
@pytest.mark.parametrize("threads", [1, 3])
def test_mean_kernel_matches_the_torch_reference_forward_and_backward(with_self, width, threads) -> None:
    rng = np.random.default_rng([width, threads, with_self])
    block = random_block(rng, num_dst=300, num_src=1000, max_degree=12)
    x = torch.from_numpy(rng.standard_normal((1000, width), dtype=np.float32)).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    op, reference = (aggregate.mean, aggregate.mean_reference)
    if with_self:
        op, reference = (aggregate.self_and_mean, aggregate.self_and_mean_reference)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = op(block, x)
        expected = reference(block, x_ref)
        assert out.shape == expected.shape == (300, 2 * width if with_self else width)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        upstream = torch.from_numpy(rng.standard_normal(tuple(out.shape), dtype=np.float32))
        out.backward(upstream)
        expected.backward(upstream)
        torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("threads", [1, 3])
def test_sum_kernel_matches_a_numpy_reference_into_any_column_of_wider_rows(threads) -> None:
    # average=False: the per-destination sums a feature owner sends back (DistTensor.self_and_mean), written
    # into columns [col, col + F) of rows 2F wide; the other half is left alone.
    rng = np.random.default_rng([threads, 17])
    block = random_block(rng, num_dst=200, num_src=700, max_degree=9)
    x = rng.standard_normal((700, 13), dtype=np.float32)
    indptr, indices = block.indptr.numpy(), block.indices.numpy()
    expected = np.zeros((200, 13), dtype=np.float64)
    for d in range(200):
        expected[d] = x[indices[indptr[d] : indptr[d + 1]]].astype(np.float64).sum(0)
    for col in (0, 13):
        out = np.full((200, 26), 7.0, dtype=np.float32)
        cpu.extension().mean_aggregate(indptr, indices, x, out, col, -1, threads, average=False)
        np.testing.assert_allclose(out[:, col : col + 13], expected, rtol=1e-5, atol=1e-5)
        untouched = np.delete(out, np.s_[col : col + 13], axis=1)
        assert (untouched == 7.0).all()


@pytest.mark.parametrize("threads", [1, 3])
def test_mean_over_rows_held_in_several_tables_equals_the_reference_on_the_stacked_rows(threads) -> None:
    # mean_aggregate_tables: source s is row row_index[s] of tables[row_table[s]] (shared memory and pulled
    # replies in DistTensor.read_self_and_mean); the rows are never stacked, the result is as if they were.
    rng = np.random.default_rng([threads, 29])
    tables = [rng.standard_normal((n, 13), dtype=np.float32) for n in (500, 40, 1, 77)]
    num_src = 400
    row_table = rng.integers(0, len(tables), num_src)
    row_index = np.array([rng.integers(0, len(tables[t])) for t in row_table], dtype=np.int64)
    stacked = torch.from_numpy(np.stack([tables[t][r] for t, r in zip(row_table, row_index, strict=True)]))
    block = random_block(rng, num_dst=150, num_src=num_src, max_degree=9)
    out = np.full((150, 26), 7.0, dtype=np.float32)
    cpu.extension().mean_aggregate_tables(
        block.indptr.numpy(), block.indices.numpy(), tables, row_table, row_index, out, 13, 0, threads
    )
    expected = aggregate.self_and_mean_reference(block, stacked)
    torch.testing.assert_close(torch.from_numpy(out), expected, rtol=1e-5, atol=1e-5)
    # The same adds in the same order as the mean over the stacked rows: bitwise equal.
    dense = np.full((150, 26), 7.0, dtype=np.float32)
    cpu.extension().mean_aggregate(block.indptr.numpy(), block.indices.numpy(), stacked.numpy(), dense, 13, 0, threads)
    assert np.array_equal(out, dense)


def test_mean_over_tables_names_a_bad_table_row_or_width() -> None:
    tables = [np.zeros((4, 3), np.float32), np.zeros((2, 3), np.float32)]
    indptr, indices = np.array([0, 1], np.int64), np.array([1], np.int64)
    out = np.empty((1, 6), np.float32)

    def run(row_table, row_index, tables=tables, indices=indices):
        cpu.extension().mean_aggregate_tables(
            indptr, indices, tables, np.array(row_table, np.int64), np.array(row_index, np.int64), out, 3, 0, 1
        )

    with pytest.raises(ValueError, match=r"row_table\[1\] = 2 is not one of 2 tables"):
        run([0, 2], [0, 0])
    with pytest.raises(ValueError, match=r"row_table\[0\] = -1 is not one of 2 tables"):
        run([-1, 1], [0, 0])
    with pytest.raises(ValueError, match=r"row_index\[1\] = 2 is out of range for the 2 rows of tables\[1\]"):
        run([0, 1], [3, 2])
    with pytest.raises(ValueError, match=r"tables\[1\] has 5 columns, tables\[0\] 3"):
        run([0, 1], [0, 0], tables=[tables[0], np.zeros((2, 5), np.float32)])
    with pytest.raises(IndexError, match="source index 2 of edge 0 is outside"):
        run([0, 1], [0, 0], indices=np.array([2], np.int64))
    run([0, 1], [3, 1])  # the same call with good rows goes through


@pytest.mark.parametrize("width", [1, 37, 64, 130])
@pytest.mark.parametrize("threads", [1, 3])
def test_relu_dropout_mean_kernel_equals_relu_dropout_then_the_mean_forward_and_backward(width, threads) -> None:
    # The fused hidden-layer input: [d(h)[:num_dst] | mean of d(h)] with d = relu_dropout (the same masks for the
    # same torch seed); its backward gathers each row's gradient and masks it in one pass.
    rng = np.random.default_rng([width, threads, 3])
    block = random_block(rng, num_dst=120, num_src=400, max_degree=9)
    h = torch.from_numpy(rng.standard_normal((400, width), dtype=np.float32)).requires_grad_()
    h_ref = h.detach().clone().requires_grad_()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for p in (0.3, 0.5):
            seed = int(rng.integers(2**31))
            torch.manual_seed(seed)
            out = aggregate.relu_dropout_self_and_mean(block, h, p)
            torch.manual_seed(seed)
            expected = aggregate.self_and_mean_reference(block, relu_dropout(h_ref, p))
            assert out.shape == (120, 2 * width)
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
            upstream = torch.from_numpy(rng.standard_normal(tuple(out.shape), dtype=np.float32))
            out.backward(upstream)
            expected.backward(upstream)
            torch.testing.assert_close(h.grad, h_ref.grad, rtol=1e-5, atol=1e-5)
            h.grad = h_ref.grad = None
    finally:
        torch.set_num_threads(previous)
    # In eval mode or at p = 0 it is ReLU then the mean.
    torch.testing.assert_close(
        aggregate.relu_dropout_self_and_mean(block, h, 0.5, training=False),
        aggregate.self_and_mean_reference(block, torch.relu(h)),
    )


def test_relu_dropout_mean_backward_names_an_out_of_range_source_and_a_bad_indptr() -> None:
    out, grad = np.ones((3, 4), np.float32), np.ones((1, 8), np.float32)

    def run(indptr, indices):
        cpu.extension().relu_dropout_mean_backward(
            np.array(indptr, np.int64), np.array(indices, np.int64), grad, out, 2.0, np.empty((3, 4), np.float32), 1
        )

    with pytest.raises(IndexError, match="source index 3 of edge 1 is outside"):
        run([0, 2], [0, 3])
    with pytest.raises(ValueError, match="indptr must run from 0 to the number of edges"):
        run([0, 3], [0, 1])
    run([0, 2], [0, 2])  # good input goes through


def test_graphsage_with_the_fused_hidden_inputs_equals_its_layer_by_layer_forward() -> None:
    # GraphSAGE.forward hands each hidden layer its input as Dropped (applied by the layer, fused with its mean);
    # forward_layer applies relu_dropout between layers: the same seed gives the same output and gradients.
    rng = np.random.default_rng(8)
    blocks = [random_block(rng, 300, 900, 8), random_block(rng, 60, 300, 6), random_block(rng, 10, 60, 5)]
    model = GraphSAGE(12, 32, 5, num_layers=3, dropout=0.5)
    x = torch.from_numpy(rng.standard_normal((900, 12), dtype=np.float32))
    torch.manual_seed(11)
    fused = model(blocks, x)
    fused.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch.manual_seed(11)
    h = x
    for i, block in enumerate(blocks):
        h = model.forward_layer(i, block, h)
    torch.testing.assert_close(fused, h, rtol=1e-5, atol=1e-5)
    h.sum().backward()
    for got, param in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(got, param.grad, rtol=1e-4, atol=1e-5)


def test_sage_layer_on_its_input_aggregated_elsewhere_equals_the_layer_on_raw_features() -> None:
    from distgnn.nn import SAGEConv
    from distgnn.sampling.block import SelfAndMean

    rng = np.random.default_rng(3)
    block = random_block(rng, num_dst=50, num_src=160, max_degree=7)
    x = torch.from_numpy(rng.standard_normal((160, 6), dtype=np.float32))
    for out_feats in (4, 9):  # narrower (projection first on raw features) and wider
        layer = SAGEConv(6, out_feats)
        with torch.no_grad():
            layer.bias.normal_()
        expected = layer(block, x)
        got = layer(block, SelfAndMean(aggregate.self_and_mean_reference(block, x)))
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        grads = torch.autograd.grad(got.sum(), list(layer.parameters()))
        expected_grads = torch.autograd.grad(expected.sum(), list(layer.parameters()))
        for g, e in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
        with pytest.raises(ValueError, match="SelfAndMean rows must be"):
            layer(block, SelfAndMean(torch.zeros(50, 6)))


def test_mean_of_a_destination_without_edges_is_zero_and_empty_blocks_work() -> None:
    block = make_block(3, 2, [0, 0, 2], [2, 2])
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 7.0]])
    assert aggregate.mean(block, x).tolist() == [[0.0, 0.0], [5.0, 7.0]]
    assert aggregate.self_and_mean(block, x).tolist() == [[1.0, 2.0, 0.0, 0.0], [3.0, 4.0, 5.0, 7.0]]
    empty = make_block(0, 0, [0], [])
    assert aggregate.self_and_mean(empty, torch.zeros((0, 4))).shape == (0, 8)


def test_mean_kernel_names_an_out_of_range_source_and_a_broken_indptr() -> None:
    x = torch.zeros((3, 2))
    bad_index = make_block(3, 1, [0, 2], [1, 3])
    with pytest.raises(IndexError, match="source index 3 of edge 1 is outside \\[0, 3\\)"):
        aggregate.mean(bad_index, x)
    bad_indptr = make_block(3, 2, [0, 2, 1], [0, 1])
    with pytest.raises(IndexError, match="indptr is not monotone .* destination 1"):
        aggregate.mean(bad_indptr, x)
    with pytest.raises(ValueError, match="x must have dtype float32"):
        cpu.extension().mean_aggregate(
            np.array([0, 1]), np.array([0]), np.zeros((1, 2)), np.zeros((1, 2), np.float32), 0, -1, 1
        )


def test_sage_layer_with_the_kernels_equals_the_torch_composition(monkeypatch) -> None:
    rng = np.random.default_rng(7)
    block = random_block(rng, num_dst=200, num_src=700, max_degree=9)
    torch.manual_seed(0)
    for in_feats, out_feats in ((16, 32), (32, 8)):  # aggregate-first and project-first paths
        layer = SAGEConv(in_feats, out_feats)
        x = torch.randn(700, in_feats, requires_grad=True)
        out = layer(block, x)
        out.square().sum().backward()
        got = (out.detach(), x.grad.clone(), [p.grad.clone() for p in layer.parameters()])
        layer.zero_grad()
        x.grad = None
        with monkeypatch.context() as m:
            m.setattr(aggregate, "_native", lambda block, x: False)
            ref = layer(block, x)
            ref.square().sum().backward()
        torch.testing.assert_close(got[0], ref.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[1], x.grad, rtol=1e-5, atol=1e-5)
        for mine, theirs in zip(got[2], [p.grad for p in layer.parameters()], strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n", [1, 5, 4099, 70_001])
@pytest.mark.parametrize("p", [0.5, 0.1, 0.93])
def test_relu_dropout_kernel_matches_the_numpy_reference_for_any_thread_count(n, p) -> None:
    rng = np.random.default_rng([n, int(p * 100)])
    x = rng.standard_normal(n, dtype=np.float32)
    threshold = drop_threshold(p)
    scale = 65536 / (65536 - threshold)
    seed = int(rng.integers(0, 2**62))
    expected = relu_dropout_reference(x, threshold, scale, seed)
    for threads in (1, 3):
        out = np.empty_like(x)
        cpu.extension().relu_dropout(x, out, threshold, scale, seed, threads)
        np.testing.assert_array_equal(out, expected)
    in_place = x.copy()
    cpu.extension().relu_dropout(in_place, in_place, threshold, scale, seed, 2)
    np.testing.assert_array_equal(in_place, expected)


def test_relu_dropout_keeps_the_right_fraction_and_passes_gradients_only_through_kept_positives() -> None:
    torch.manual_seed(3)
    x = torch.rand(200_000) + 0.01  # all positive: only dropout zeroes anything
    x.requires_grad_()
    out = relu_dropout(x, 0.3)
    kept = out > 0
    fraction = kept.double().mean().item()
    assert abs(fraction - 0.7) < 4 * (0.7 * 0.3 / 200_000) ** 0.5, fraction
    torch.testing.assert_close(out[kept], x.detach()[kept] / 0.7, rtol=1e-3, atol=0)
    upstream = torch.randn(200_000)
    out.backward(upstream)
    torch.testing.assert_close(x.grad, torch.where(kept, upstream / 0.7, 0.0), rtol=1e-3, atol=1e-6)
    # Same torch seed, same mask; a new draw, a different one.
    torch.manual_seed(11)
    first = relu_dropout(x.detach(), 0.3)
    torch.manual_seed(11)
    assert torch.equal(relu_dropout(x.detach(), 0.3), first)
    assert not torch.equal(relu_dropout(x.detach(), 0.3), first)


def test_relu_dropout_in_eval_mode_or_at_p0_is_relu_and_rejects_bad_p() -> None:
    x = torch.randn(1000)
    assert torch.equal(relu_dropout(x, 0.5, training=False), torch.relu(x))
    assert torch.equal(relu_dropout(x, 0.0), torch.relu(x))
    assert torch.count_nonzero(relu_dropout(x, 1.0)) == 0
    with pytest.raises(ValueError, match="dropout probability"):
        relu_dropout(x, 1.5)


def test_graphsage_trains_through_the_kernels_and_its_loss_falls() -> None:
    rng = np.random.default_rng(0)
    blocks = [random_block(rng, 400, 1500, 6), random_block(rng, 100, 400, 6)]
    torch.manual_seed(0)
    x = torch.randn(1500, 12)
    y = torch.randint(0, 3, (100,))
    model = GraphSAGE(12, 32, 3, num_layers=2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(60):
        loss = torch.nn.functional.cross_entropy(model(blocks, x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses[::10]


REPEATED_STEPS = """
import resource, sys, torch
from distgnn.train.allocator import keep_freed_memory
if sys.argv[1] == "tuned":
    assert keep_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
x = torch.randn(56_000, 256)  # 57 MB tensors: above glibc's largest mmap threshold
w = torch.randn(256, 256, requires_grad=True)
def step():
    h = torch.relu(x @ w)
    (h * h).sum().backward()
for _ in range(20):  # warm-up: the heap grows to the step's working set (fragments settle by ~12 steps)
    step()
windows = []
for _ in range(5):  # the quietest of five 2-step windows: the heap may still grow once in a while
    before = faults()
    step()
    step()
    windows.append((faults() - before) // 2)
print(min(windows))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_keep_freed_memory_makes_repeated_training_steps_page_fault_free() -> None:
    def faults_per_step(mode: str) -> int:
        proc = subprocess.run([sys.executable, "-c", REPEATED_STEPS, mode], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return int(proc.stdout.split()[-1])

    tensor_pages = 56_000 * 256 * 4 // resource.getpagesize()
    default, tuned = faults_per_step("default"), faults_per_step("tuned")
    assert default > tensor_pages  # fresh mmaps every step: a fault per page of several tensors
    assert tuned < tensor_pages // 2 and tuned < default // 5, (default, tuned)
