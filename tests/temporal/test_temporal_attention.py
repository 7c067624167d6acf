"""The fused CPU temporal attention (C++ kernel and its backward) against the torch reference, on random inputs:
repeated neighbour rows, empty slots and roots without any filled slot; both against a per-root loop written from
the definition; and the kernel's bad-input errors."""

from __future__ import annotations

import math

import pytest
import torch

from distgnn.native.cpu import extension
from distgnn.nn.temporal import attend, attend_reference


def random_case(gen: torch.Generator, roots: int, k: int, heads: int, head_dim: int, num_kv: int, packed: bool):
    """(query, kv_rows, slots, event_rows, event_slots, mask): slots repeat rows; with ``packed`` each filled
    slot has its own event row, in a shuffled order, among spare rows no slot reads; else one row per slot."""
    width = heads * head_dim
    query = torch.randn(roots, width, generator=gen, requires_grad=True)
    kv_rows = torch.randn(num_kv, 2 * width, generator=gen, requires_grad=True)
    slots = torch.randint(0, num_kv, (roots, k), generator=gen)  # rows repeat across slots and roots
    mask = torch.rand(roots, k, generator=gen) < 0.6
    mask[:3] = False  # roots without a filled slot
    if packed:
        rows = int(mask.sum()) + 7
        event_slots = torch.full((roots, k), -1, dtype=torch.int64)
        event_slots[mask] = torch.randperm(rows, generator=gen)[: int(mask.sum())]
    else:
        rows, event_slots = roots * k, None
    event_rows = torch.randn(rows, width, generator=gen, requires_grad=True)
    return query, kv_rows, slots, event_rows, event_slots, mask


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("heads,head_dim", [(2, 50), (1, 7), (4, 3)])
def test_fused_attention_matches_the_reference(threads, heads, head_dim, packed):
    gen = torch.Generator().manual_seed(heads * 100 + head_dim)
    inputs = random_case(gen, roots=300, k=10, heads=heads, head_dim=head_dim, num_kv=120, packed=packed)
    grad = torch.randn(300, heads * head_dim, generator=gen)
    leaves = (inputs[0], inputs[1], inputs[3])
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        results = []
        for fn in (attend, attend_reference):
            for t in leaves:
                t.grad = None
            out = fn(*inputs, heads)
            out.backward(grad)
            results.append([out.detach(), *(t.grad for t in leaves)])
    finally:
        torch.set_num_threads(before)
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.all(results[0][0][:3] == 0)  # no filled slot: nothing attended
    event_slots, mask = inputs[4], inputs[5]
    read = torch.zeros(len(inputs[3]), dtype=torch.bool)
    read[(torch.arange(mask.numel()) if event_slots is None else event_slots.flatten())[mask.flatten()]] = True
    assert torch.all(results[0][3][~read] == 0)  # event rows no filled slot reads get no gradient


def test_attend_dispatches_the_cpu_kernel_for_gathered_slots():
    gen = torch.Generator().manual_seed(5)
    query, kv_rows, slots, event_rows, event_slots, mask = random_case(gen, 20, 4, 2, 5, 30, packed=True)
    out = attend(query, kv_rows, slots, event_rows, event_slots, mask, 2)
    assert out.grad_fn.name().endswith("_FusedAttentionBackward")
    dense = kv_rows[slots].reshape(-1, kv_rows.shape[1])  # the dense layout: no slot index, torch ops
    out = attend(query, dense, None, event_rows, event_slots, mask, 2)
    assert not out.grad_fn.name().endswith("_FusedAttentionBackward")


def test_kernel_rejects_bad_rows_and_shapes():
    gen = torch.Generator().manual_seed(6)
    query, kv_rows, slots, event_rows, _, mask = random_case(gen, 8, 3, 2, 4, 5, packed=False)
    mask[5, 0] = mask[5, 1] = True  # slots 15 and 16
    out, weight = torch.empty(8, 8), torch.empty(24, 2)
    flat_mask = mask.reshape(-1).view(torch.uint8).numpy()

    def call(slots=slots, event_slots=None, kv=kv_rows, heads=2):
        event_slots = torch.arange(24) if event_slots is None else event_slots
        extension().temporal_attention(
            query.detach().numpy(),
            kv.detach().contiguous().numpy(),
            slots.reshape(-1).numpy(),
            event_rows.detach().numpy(),
            event_slots.numpy(),
            flat_mask,
            heads,
            0.5,
            out.numpy(),
            weight.numpy(),
            1,
        )

    bad = slots.clone()
    bad[5, 1] = 5  # one past the last key/value row, on a filled slot
    with pytest.raises(ValueError, match="neighbour row 5 at slot 16 is outside the 5 key/value rows"):
        call(slots=bad)
    twice = torch.arange(24)
    twice[16] = 15
    with pytest.raises(ValueError, match="event row 15 at slot 16 serves an earlier slot too"):
        call(event_slots=twice)
    with pytest.raises(ValueError, match="event row 24 at slot 16 is outside the 24 event rows"):
        call(event_slots=torch.where(torch.arange(24) == 16, 24, torch.arange(24)))
    with pytest.raises(ValueError, match="not a multiple of heads 3"):
        call(heads=3)
    with pytest.raises(ValueError, match="kv rows must be 2 x 8 wide"):
        call(kv=kv_rows[:, :8])


def attend_per_root(query, kv_rows, slots, event_rows, event_slots, mask, heads) -> torch.Tensor:
    """Root r, head h: softmax over r's filled slots j of q_rh . (K_j + E_j)_h / sqrt(d), weighting
    (V_j + E_j)_h, where [K_j | V_j] is row ``slots[r, j]`` of ``kv_rows`` (row r * k + j without ``slots``) and
    E_j row ``event_slots[r, j]`` of ``event_rows`` (row r * k + j without ``event_slots``); a root without a
    filled slot gets zeros."""
    num_roots, k = mask.shape
    width = query.shape[1]
    d = width // heads
    out = []
    for r in range(num_roots):
        parts = []
        for h in range(heads):
            cols = slice(h * d, (h + 1) * d)
            scores, values = [], []
            for j in range(k):
                if not mask[r, j]:
                    continue
                row = kv_rows[int(slots[r, j]) if slots is not None else r * k + j]
                event = event_rows[int(event_slots[r, j]) if event_slots is not None else r * k + j]
                key = row[:width][cols] + event[cols]
                scores.append((query[r, cols] * key).sum() / math.sqrt(d))
                values.append(row[width:][cols] + event[cols])
            if not scores:
                parts.append(torch.zeros(d, dtype=query.dtype))
                continue
            s = torch.stack(scores)
            w = torch.exp(s - s.max())
            w = w / w.sum()
            parts.append((w[:, None] * torch.stack(values)).sum(0))
        out.append(torch.cat(parts))
    return torch.stack(out)


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("heads,head_dim", [(2, 5), (3, 2)])
@pytest.mark.parametrize("fn", [attend, attend_reference], ids=["fused", "torch"])
def test_attention_equals_the_per_root_loop(fn, heads, head_dim, packed):
    gen = torch.Generator().manual_seed(heads * 10 + head_dim)
    inputs = random_case(gen, roots=24, k=6, heads=heads, head_dim=head_dim, num_kv=20, packed=packed)
    grad = torch.randn(24, heads * head_dim, generator=gen)
    leaves = (0, 1, 3)  # query, kv_rows, event_rows
    out = fn(*inputs, heads)
    got = torch.autograd.grad(out, [inputs[i] for i in leaves], grad)
    wide = list(inputs)
    for i in leaves:
        wide[i] = inputs[i].detach().double().requires_grad_()
    want_out = attend_per_root(*wide, heads)
    want = torch.autograd.grad(want_out, [wide[i] for i in leaves], grad.double())
    torch.testing.assert_close(out.double(), want_out, rtol=1e-5, atol=1e-5)
    for name, g, w in zip(("query", "kv_rows", "event_rows"), got, want, strict=True):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-5, msg=name)
    assert inputs[5].sum(1).min() == 0 and inputs[5].sum(1).max() > 1  # empty roots and softmaxes over several
