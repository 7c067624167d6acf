"""The CUDA mean aggregation (csrc/cuda/aggregate.cu) against the torch reference, on fresh random blocks.

The CUDA tests skip without a GPU. They compare forward values and gradients w.r.t. x with the reference
(computed on the CPU in float32 from the same inputs): with and without the self columns, row widths that
take every vector width and lane-group size, destinations without in-edges, empty blocks, int32 and int64
indices, float32 (tight) and float16 / bfloat16 (loose), rows at a misaligned address (the scalar path), a
SAGEConv and a GATConv on CUDA against the same layer on the CPU, weighted sums over per-head
(strided) views against a float64 CPU reference, that the kernel path is the one taken (the reference
patched to raise, and no host sync), and that bad indices trip a device-side assert (in a subprocess, since
the assert poisons the process's CUDA context). The fallback when the extension cannot be built runs on the
CPU too.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch

import distgnn.nn.aggregate as aggregate
from distgnn.errors import ExtensionBuildError
from distgnn.native import cuda as native_cuda
from distgnn.nn import GATConv, SAGEConv
from distgnn.sampling.block import Block

CUDA = torch.cuda.is_available()


def needs_cuda(test):
    """Marked ``cuda`` (``pytest -m cuda`` selects the GPU tests) and skipped without a GPU."""
    return pytest.mark.cuda(pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")(test))


WIDTHS = [1, 3, 64, 100, 256, 257]
# (rtol, atol) against a float32 reference computed from the same (rounded) inputs.
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-2, 1e-2), torch.bfloat16: (3e-2, 3e-2)}
DTYPES = list(TOLERANCES)


def random_csc(rng: np.random.Generator, num_dst: int, num_src: int, max_degree: int) -> tuple[np.ndarray, np.ndarray]:
    degrees = rng.integers(0, max_degree + 1, num_dst)
    degrees[rng.random(num_dst) < 0.2] = 0  # destinations without in-edges
    indptr = np.zeros(num_dst + 1, dtype=np.int64)
    np.cumsum(degrees, out=indptr[1:])
    return indptr, rng.integers(0, num_src, int(indptr[-1]))  # repeated sources allowed


def make_block(num_src: int, num_dst: int, indptr, indices, index_dtype=torch.int64, device="cpu") -> Block:
    indptr = torch.as_tensor(indptr, dtype=torch.int64)
    indices = torch.as_tensor(indices, dtype=torch.int64)
    block = Block(torch.arange(num_src), num_dst, indptr, indices.to(index_dtype), torch.arange(len(indices)))
    return block.to(device)


def ops(with_self: bool):
    if with_self:
        return aggregate.self_and_mean, aggregate.self_and_mean_reference
    return aggregate.mean, aggregate.mean_reference


def check_against_reference(indptr, indices, num_src, width, with_self, dtype, index_dtype, x=None, seed=0):
    """Kernel on CUDA vs the reference on the CPU (float32 from the same rounded inputs): values and d/dx."""
    rng = np.random.default_rng(seed)
    num_dst = len(indptr) - 1
    if x is None:
        x = torch.from_numpy(rng.standard_normal((num_src, width), dtype=np.float32)).to("cuda", dtype)
    x = x.detach().requires_grad_()
    block = make_block(num_src, num_dst, indptr, indices, index_dtype, device="cuda")
    op, reference = ops(with_self)
    out = op(block, x)
    assert out.dtype == dtype and out.device == x.device
    assert out.shape == (num_dst, 2 * width if with_self else width)
    upstream = torch.from_numpy(rng.standard_normal(tuple(out.shape), dtype=np.float32)).to("cuda", dtype)
    (grad,) = torch.autograd.grad(out, x, upstream)
    assert grad.dtype == dtype and grad.shape == x.shape

    x_ref = x.detach().float().cpu().requires_grad_()
    expected = reference(make_block(num_src, num_dst, indptr, indices), x_ref)
    expected_grad = None
    if expected.requires_grad:  # the reference's mean of a block without edges is a constant
        (expected_grad,) = torch.autograd.grad(expected, x_ref, upstream.float().cpu(), allow_unused=True)
    if expected_grad is None:
        expected_grad = torch.zeros_like(x_ref)
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(out.float().cpu(), expected, rtol=rtol, atol=atol)
    torch.testing.assert_close(grad.float().cpu(), expected_grad, rtol=rtol, atol=atol)


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("with_self", [False, True])
def test_kernel_matches_the_reference_forward_and_backward(with_self, width, index_dtype, dtype) -> None:
    seed = [width, with_self, index_dtype == torch.int32, DTYPES.index(dtype)]
    rng = np.random.default_rng(seed)
    indptr, indices = random_csc(rng, num_dst=300, num_src=1000, max_degree=13)
    check_against_reference(indptr, indices, 1000, width, with_self, dtype, index_dtype, seed=seed)


@needs_cuda
@pytest.mark.parametrize("with_self", [False, True])
def test_high_degrees_and_destinations_without_edges(with_self) -> None:
    rng = np.random.default_rng(7)
    degrees = rng.integers(0, 200, 64)
    degrees[::3] = 0
    indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int64)
    indices = rng.integers(0, 500, int(indptr[-1]))
    check_against_reference(indptr, indices, 500, 100, with_self, torch.float32, torch.int64)
    x = torch.randn(500, 100, device="cuda")
    out = aggregate.mean(make_block(500, 64, indptr, indices, device="cuda"), x)
    assert torch.all(out[::3] == 0)


@needs_cuda
@pytest.mark.parametrize("with_self", [False, True])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
def test_empty_blocks(with_self, index_dtype) -> None:
    # Destinations but no edges: the mean is 0 everywhere and only the self columns carry gradient.
    check_against_reference(
        np.zeros(11, dtype=np.int64), np.zeros(0, dtype=np.int64), 20, 64, with_self, torch.float32, index_dtype
    )
    # No destinations at all (the sources still get a zero gradient of their shape).
    check_against_reference(
        np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64), 5, 3, with_self, torch.float32, index_dtype
    )
    check_against_reference(
        np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64), 0, 8, with_self, torch.float32, index_dtype
    )


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_rows_at_a_misaligned_address_take_the_narrow_loads(dtype) -> None:
    rng = np.random.default_rng(11)
    indptr, indices = random_csc(rng, num_dst=100, num_src=300, max_degree=9)
    storage = torch.randn(300 * 64 + 1, device="cuda").to(dtype)
    x = storage[1:].view(300, 64)  # contiguous, but one element past a 16-byte boundary
    assert x.data_ptr() % 16 != 0
    for with_self in (False, True):
        check_against_reference(indptr, indices, 300, 64, with_self, dtype, torch.int64, x=x)


@needs_cuda
@pytest.mark.parametrize(("in_feats", "out_feats"), [(32, 48), (100, 16)])  # [self | mean] GEMM; project first
def test_sage_conv_on_cuda_equals_the_same_layer_on_the_cpu(in_feats, out_feats) -> None:
    torch.manual_seed(in_feats)
    check_layer_on_cuda(SAGEConv(in_feats, out_feats), in_feats, np.random.default_rng([in_feats, out_feats]))


def check_layer_on_cuda(
    layer: torch.nn.Module, in_feats: int, rng: np.random.Generator, num_dst=200, num_src=700
) -> None:
    """``layer`` and its copy on CUDA on the same random block: outputs, d/dx and every parameter's gradient."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # full float32 GEMMs, so 1e-4 holds
    try:
        indptr, indices = random_csc(rng, num_dst=num_dst, num_src=num_src, max_degree=15)
        layer_gpu = copy.deepcopy(layer).cuda()
        x = torch.from_numpy(rng.standard_normal((num_src, in_feats), dtype=np.float32)).requires_grad_()
        x_gpu = x.detach().cuda().requires_grad_()
        out = layer(make_block(num_src, num_dst, indptr, indices), x)
        out_gpu = layer_gpu(make_block(num_src, num_dst, indptr, indices, device="cuda"), x_gpu)
        upstream = torch.from_numpy(rng.standard_normal(tuple(out.shape), dtype=np.float32))
        out.backward(upstream)
        out_gpu.backward(upstream.cuda())
        torch.testing.assert_close(out_gpu.cpu(), out, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(x_gpu.grad.cpu(), x.grad, rtol=1e-4, atol=1e-4)
        for (name, p), p_gpu in zip(layer.named_parameters(), layer_gpu.parameters(), strict=True):
            torch.testing.assert_close(p_gpu.grad.cpu(), p.grad, rtol=1e-4, atol=1e-4, msg=name)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


@needs_cuda
def test_the_kernel_path_is_taken_on_cuda_without_host_syncs(monkeypatch) -> None:
    rng = np.random.default_rng(3)
    indptr, indices = random_csc(rng, num_dst=50, num_src=120, max_degree=6)
    block = make_block(120, 50, indptr, indices, device="cuda")
    x = torch.randn(120, 16, device="cuda", requires_grad=True)
    aggregate.mean(block, x)  # builds / loads the extension (which may sync) before the sync check

    def refuse(*args, **kwargs):
        raise AssertionError("the torch reference ran on CUDA tensors")

    for name in ("mean_reference", "self_and_mean_reference", "weighted_sum"):
        monkeypatch.setattr(aggregate, name, refuse)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for op in (aggregate.mean, aggregate.self_and_mean):
            out = op(block, x)
            assert type(out.grad_fn).__name__ == "_CudaMeanAggregateBackward"
            torch.autograd.grad(out, x, torch.ones_like(out))
    finally:
        torch.cuda.set_sync_debug_mode("default")


@needs_cuda
def test_deterministic_mode_takes_the_torch_path() -> None:
    block = make_block(3, 2, [0, 2, 3], [0, 1, 2], device="cuda")
    x = torch.randn(3, 4, device="cuda")
    assert aggregate._native_cuda(block, x)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        assert not aggregate._native_cuda(block, x)
    finally:
        torch.use_deterministic_algorithms(previous)


BAD_INPUT_PROGRAM = textwrap.dedent(
    """
    import sys
    import torch
    import distgnn.nn.aggregate as aggregate
    from distgnn.sampling.block import Block

    case = sys.argv[1]
    indptr = torch.tensor([0, 2, 3], dtype=torch.int64)
    indices = torch.tensor([0, 1, 2], dtype=torch.int64)
    if case == "index":
        indices[1] = 1000
    else:
        indptr[1] = 5
    block = Block(torch.arange(4), 2, indptr, indices, torch.arange(3)).to("cuda")
    out = aggregate.mean(block, torch.randn(4, 8, device="cuda"))
    torch.cuda.synchronize()
    print("NO ERROR")
    """
)


@needs_cuda
@pytest.mark.parametrize(("case", "message"), [("index", "source index 1000 of edge 1"), ("indptr", "not monotone")])
def test_bad_input_trips_a_device_side_assert(case, message) -> None:
    aggregate._cuda_extension()  # built here, so the child only loads it
    result = subprocess.run(
        [sys.executable, "-c", BAD_INPUT_PROGRAM, case], capture_output=True, text=True, timeout=300
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "NO ERROR" not in output
    assert message in output
    assert "device-side assert" in output or "CUDA error" in output, output


def test_an_extension_that_cannot_be_built_falls_back_after_one_warning(monkeypatch) -> None:
    def fail():
        raise ExtensionBuildError("no compiler here")

    monkeypatch.setattr(native_cuda, "graph_kernels", fail)
    aggregate._cuda_extension.forget()
    try:
        with pytest.warns(RuntimeWarning, match="falls back to torch ops: no compiler here"):
            assert aggregate._cuda_extension() is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert aggregate._cuda_extension() is None  # remembered, no second warning
    finally:
        aggregate._cuda_extension.forget()


@needs_cuda
@pytest.mark.parametrize("seed", range(20))
def test_weighted_sum_on_cuda_equals_the_cpu_for_per_head_views(seed) -> None:
    """GAT's sums: per-head strided views of ``z``, unsorted and repeated sources, values and both gradients."""
    rng = np.random.default_rng(seed)
    num_src, heads, width = int(rng.integers(50, 3000)), 4, int(rng.integers(1, 70))
    indptr, indices = random_csc(rng, num_dst=int(rng.integers(1, 50)) * 20, num_src=num_src, max_degree=25)
    num_dst = len(indptr) - 1
    z = torch.from_numpy(rng.standard_normal((num_src, heads, width), dtype=np.float32))
    weight = torch.from_numpy(rng.random((len(indices), heads), dtype=np.float32))
    upstream = torch.from_numpy(rng.standard_normal((num_dst, width), dtype=np.float32))
    for h in range(heads):
        got = [t.cuda().requires_grad_() for t in (z, weight)]
        want = [t.double().requires_grad_() for t in (z, weight)]
        out = aggregate.weighted_sum(
            make_block(num_src, num_dst, indptr, indices, device="cuda"), got[0][:, h], got[1][:, h]
        )
        expected = aggregate.weighted_sum(make_block(num_src, num_dst, indptr, indices), want[0][:, h], want[1][:, h])
        grads = torch.autograd.grad(out, got, upstream.cuda())
        expected_grads = torch.autograd.grad(expected, want, upstream.double())
        torch.testing.assert_close(out.cpu().double(), expected, rtol=1e-5, atol=1e-5)
        for g, e in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(g.cpu().double(), e, rtol=1e-5, atol=1e-5)


@needs_cuda
@pytest.mark.parametrize("seed", range(5))
def test_gat_conv_on_cuda_equals_the_same_layer_on_the_cpu(seed) -> None:
    """Four heads: the softmax and the per-head weighted sums over strided views."""
    torch.manual_seed(seed)
    check_layer_on_cuda(GATConv(24, 8, num_heads=4), 24, np.random.default_rng(100 + seed), num_dst=300, num_src=1500)
