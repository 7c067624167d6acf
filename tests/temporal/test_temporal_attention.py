"""The fused CPU temporal attention (C++ kernel and its backward) against the torch reference, on random inputs:
repeated neighbour rows, empty slots and roots without any filled slot; and its bad-input errors."""

from __future__ import annotations

import pytest
import torch

from distgnn.native.cpu import extension
from distgnn.nn.temporal import _FusedAttention, attend, attend_reference


def random_case(gen: torch.Generator, roots: int, k: int, heads: int, head_dim: int, num_kv: int):
    width = heads * head_dim
    query = torch.randn(roots, width, generator=gen, requires_grad=True)
    kv_rows = torch.randn(num_kv, 2 * width, generator=gen, requires_grad=True)
    slots = torch.randint(0, num_kv, (roots, k), generator=gen)  # rows repeat across slots and roots
    event = torch.randn(roots, k, width, generator=gen, requires_grad=True)
    mask = torch.rand(roots, k, generator=gen) < 0.6
    mask[:3] = False  # roots without a filled slot
    return query, kv_rows, slots, event, mask


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("heads,head_dim", [(2, 50), (1, 7), (4, 3)])
def test_fused_attention_matches_the_reference(threads, heads, head_dim):
    gen = torch.Generator().manual_seed(heads * 100 + head_dim)
    inputs = random_case(gen, roots=300, k=10, heads=heads, head_dim=head_dim, num_kv=120)
    grad = torch.randn(300, heads * head_dim, generator=gen)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        results = []
        for fn in (_FusedAttention.apply, attend_reference):
            for t in (inputs[0], inputs[1], inputs[3]):
                t.grad = None
            out = fn(*inputs, heads)
            out.backward(grad)
            results.append([out.detach(), inputs[0].grad, inputs[1].grad, inputs[3].grad])
    finally:
        torch.set_num_threads(before)
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.all(results[0][0][:3] == 0)  # no filled slot: nothing attended
    empty = ~inputs[4]
    assert torch.all(results[0][3][empty] == 0)  # an empty slot's event gets no gradient


def test_attend_dispatches_the_cpu_kernel_for_gathered_slots():
    gen = torch.Generator().manual_seed(5)
    query, kv_rows, slots, event, mask = random_case(gen, roots=20, k=4, heads=2, head_dim=5, num_kv=30)
    assert attend(query, kv_rows, slots, event, mask, 2).grad_fn.name().endswith("_FusedAttentionBackward")
    dense = kv_rows[slots].reshape(-1, kv_rows.shape[1])  # the dense layout: no slot index, torch ops
    assert not attend(query, dense, None, event, mask, 2).grad_fn.name().endswith("_FusedAttentionBackward")


def test_kernel_rejects_bad_rows_and_shapes():
    gen = torch.Generator().manual_seed(6)
    query, kv_rows, slots, event, mask = random_case(gen, roots=8, k=3, heads=2, head_dim=4, num_kv=5)
    mask[5, 1] = True
    slots[5, 1] = 5  # one past the last key/value row, on a filled slot
    out, weight = torch.empty(8, 8), torch.empty(24, 2)
    args = (query.detach().numpy(), kv_rows.detach().numpy(), slots.reshape(-1).numpy())
    rest = (event.detach().reshape(24, 8).numpy(), mask.reshape(-1).view(torch.uint8).numpy())
    with pytest.raises(ValueError, match="neighbour row 5 at slot 16 is outside the 5 key/value rows"):
        extension().temporal_attention(*args, *rest, 2, 0.5, out.numpy(), weight.numpy(), 1)
    with pytest.raises(ValueError, match="not a multiple of heads 3"):
        extension().temporal_attention(*args, *rest, 3, 0.5, out.numpy(), weight.numpy(), 1)
    with pytest.raises(ValueError, match="kv rows must be 2 x 8 wide"):
        extension().temporal_attention(
            args[0],
            kv_rows.detach()[:, :8].contiguous().numpy(),
            args[2],
            *rest,
            2,
            0.5,
            out.numpy(),
            weight.numpy(),
            1,
        )
