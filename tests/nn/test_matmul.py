"""distgnn.nn.matmul: the layers' products in float32, or with bfloat16 inputs on a CPU's AMX units under
``--matmul-precision medium``, against plain references on random inputs."""

from __future__ import annotations

import pytest
import torch

import distgnn.nn.matmul as matmul
from distgnn.nn import SAGEConv
from distgnn.sampling.block import Block


@pytest.fixture
def precision():
    """Sets torch's float32 matmul precision for a test, restored after."""
    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


def bf16_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """What the bfloat16 path computes, in float64: rounded inputs, exact sums, the product rounded to bfloat16,
    then the bias added in float32."""
    product = x.bfloat16().double() @ weight.bfloat16().double().t()
    out = product.bfloat16().float()
    return out if bias is None else out + bias


@pytest.mark.parametrize("bias_shape", [None, "row", "full"])
def test_bf16_linear_matches_its_reference_forward_and_backward(bias_shape):
    gen = torch.Generator().manual_seed(11)
    n, d_in, d_out = 300, 70, 40
    x = torch.randn(n, d_in, generator=gen, requires_grad=True)
    weight = torch.randn(d_out, d_in, generator=gen, requires_grad=True)
    bias = None
    if bias_shape is not None:
        shape = (d_out,) if bias_shape == "row" else (n, d_out)
        bias = torch.randn(*shape, generator=gen, requires_grad=True)
    out = matmul._BF16Linear.apply(x, weight, bias)
    assert out.dtype == torch.float32 and out.shape == (n, d_out)
    # Accumulation order differs from the float64 sum by float32 rounding, below one bfloat16 step of the result.
    torch.testing.assert_close(out, bf16_reference(x.detach(), weight.detach(), bias), rtol=8e-3, atol=1e-2)
    grad = torch.randn(n, d_out, generator=gen)
    out.backward(grad)
    g16 = grad.bfloat16().double()
    torch.testing.assert_close(
        x.grad, (g16 @ weight.detach().bfloat16().double()).bfloat16().float(), rtol=8e-3, atol=1e-2
    )
    torch.testing.assert_close(
        weight.grad, (g16.t() @ x.detach().bfloat16().double()).bfloat16().float(), rtol=8e-3, atol=5e-2
    )
    if bias is not None:
        torch.testing.assert_close(bias.grad, grad.sum(0) if bias_shape == "row" else grad)
    # And against the float32 product: within bfloat16's precision.
    exact = torch.addmm(bias.detach(), x.detach(), weight.detach().t()) if bias is not None else x @ weight.t()
    assert ((out - exact).norm() / exact.norm()).item() < 1e-2


def test_linear_dispatches_on_precision_and_device(precision, monkeypatch):
    gen = torch.Generator().manual_seed(12)
    x, weight, bias = torch.randn(64, 32, generator=gen), torch.randn(16, 32, generator=gen), torch.randn(16)
    precision("highest")
    assert not matmul.bf16_on_cpu(x)
    assert torch.equal(matmul.linear(x, weight, bias), torch.addmm(bias, x, weight.t()))
    monkeypatch.setattr(matmul, "cpu_has_matrix_units", lambda: True)
    precision("medium")
    assert matmul.bf16_on_cpu(x)
    assert torch.equal(matmul.linear(x, weight, bias), matmul._BF16Linear.apply(x, weight, bias))
    monkeypatch.setattr(matmul, "cpu_has_matrix_units", lambda: False)
    assert not matmul.bf16_on_cpu(x)  # no AMX: bfloat16 inputs would only cost
    precision("high")  # TF32 is a GPU's: a CPU product stays float32
    monkeypatch.setattr(matmul, "cpu_has_matrix_units", lambda: True)
    assert not matmul.bf16_on_cpu(x)


@pytest.mark.parametrize("in_feats,out_feats", [(24, 40), (40, 24)])
def test_sage_layer_under_medium_precision_stays_close_to_float32(precision, monkeypatch, in_feats, out_feats):
    """Both SAGEConv paths (aggregate then project, project then aggregate) through the bfloat16 products:
    output and gradients within bfloat16's precision of the float32 layer's."""
    monkeypatch.setattr(matmul, "cpu_has_matrix_units", lambda: True)
    gen = torch.Generator().manual_seed(13)
    num_dst, num_src, per_dst = 50, 180, 6
    indptr = torch.arange(0, (num_dst + 1) * per_dst, per_dst)
    indices = torch.randint(0, num_src, (num_dst * per_dst,), generator=gen)
    block = Block(torch.arange(num_src), num_dst, indptr, indices, torch.arange(len(indices)))
    torch.manual_seed(0)
    layer = SAGEConv(in_feats, out_feats)
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(num_src, in_feats, generator=gen)
    grad = torch.randn(num_dst, out_feats, generator=gen)
    results = []
    for mode in ("highest", "medium"):
        precision(mode)
        layer.zero_grad()
        xs = x.clone().requires_grad_()
        out = layer(block, xs)
        out.backward(grad)
        results.append((out.detach(), xs.grad, [p.grad.clone() for p in layer.parameters()]))
    (ref, ref_gx, ref_gp), (got, got_gx, got_gp) = results
    assert not torch.equal(ref, got)  # the bfloat16 path did run
    for a, b in [(ref, got), (ref_gx, got_gx), *zip(ref_gp, got_gp, strict=True)]:
        assert ((a - b).norm() / a.norm()).item() < 1.5e-2
