"""The CUDA ReLU + dropout (csrc/cuda/relu_dropout.cu) against its numpy reference, on fresh random inputs.

Skipped without a GPU. With an explicit (seed, offset) the forward equals ``relu_dropout_reference`` bit for bit
(sizes that are not a multiple of 4, a misaligned view for the scalar path, several rates); the backward is the
output's mask times the scale; through ``relu_dropout`` torch's generator picks the masks (the same seed gives the
same output, the kept share is near 1 - p, a second call draws anew), and a captured CUDA graph draws new masks on
every replay.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distgnn.nn.fused import drop_threshold, relu_dropout, relu_dropout_reference

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")]


def kernels():
    from distgnn.native.cuda import nn_kernels

    return nn_kernels()


@pytest.mark.parametrize("n", [1, 7, 4096, 100_003])
@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("misaligned", [False, True])
def test_forward_equals_the_numpy_reference(n, p, misaligned):
    gen = torch.Generator().manual_seed(n)
    base = torch.randn(n + 1, generator=gen).cuda()
    x = base[1:] if misaligned else base[:n]  # [1:]: 4 bytes past a 16-byte boundary (the scalar path)
    threshold = drop_threshold(p)
    scale = 65536 / (65536 - threshold)
    seed, offset = int(torch.randint(0, 2**62, (1,), generator=gen)), 4 * int(torch.randint(0, 2**20, (1,)))
    out = kernels().relu_dropout(x, threshold, scale, seed, offset)
    expected = relu_dropout_reference(x.cpu().numpy(), threshold, scale, seed, offset)
    np.testing.assert_array_equal(out.cpu().numpy(), expected)
    kept = (out > 0).float().sum() / (x > 0).float().sum()
    assert abs(float(kept) - (1 - p)) < 0.1 + 5 / max(n, 1) ** 0.5


@pytest.mark.parametrize("n", [5, 65_537])
def test_backward_is_the_kept_positive_mask_times_the_scale(n):
    gen = torch.Generator().manual_seed(n)
    x, grad = torch.randn(n, generator=gen).cuda(), torch.randn(n, generator=gen).cuda()
    out = kernels().relu_dropout(x, drop_threshold(0.3), 1 / 0.7, 11, 0)
    got = kernels().relu_dropout_backward(out, grad, 1 / 0.7)
    torch.testing.assert_close(got, torch.where(out > 0, grad * (1 / 0.7), torch.zeros_like(grad)), rtol=0, atol=0)


def test_relu_dropout_draws_from_torchs_generator_and_its_gradient_flows():
    x = torch.randn(300, 64, device="cuda", requires_grad=True)
    torch.manual_seed(3)
    first = relu_dropout(x, 0.5)
    torch.manual_seed(3)
    again = relu_dropout(x, 0.5)
    other = relu_dropout(x, 0.5)
    assert torch.equal(first, again) and not torch.equal(again, other)
    scaled = x.detach() * 2.0
    assert torch.all((first == 0) | (first == scaled))
    kept = float((first > 0).sum() / (x > 0).sum())
    assert 0.45 < kept < 0.55
    grad = torch.randn_like(first)
    first.backward(grad)
    torch.testing.assert_close(x.grad, torch.where(first > 0, grad * 2.0, torch.zeros_like(grad)))


def test_a_captured_graph_draws_new_masks_on_every_replay():
    x = torch.randn(4096, device="cuda")
    relu_dropout(x, 0.5)  # loads the extension outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = relu_dropout(x, 0.5)
    masks = []
    for _ in range(3):
        graph.replay()
        assert torch.all((out == 0) | (out == x * 2.0))
        masks.append(out > 0)
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
