"""The recurrent cells against plain, slow references of the same cells (dense Laplacian, one convolution per
gate, loops over Chebyshev terms) on fresh random inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distgnn.nn.recurrent import (
    GCLSTM,
    EvolveGCNO,
    GConvGRU,
    SnapshotModel,
    SparseAdjacency,
    normalized_adjacency,
    spmm,
)


def _graph(n: int, e: int, seed: int):
    rng = np.random.default_rng(seed)
    edges = rng.integers(0, n, (2, e))
    weight = (rng.random(e) + 0.5).astype(np.float32)
    adjs, dense = {}, {}
    for loops in (False, True):
        rows, cols, vals = normalized_adjacency(edges, weight, n, self_loops=loops)
        adjs[loops] = SparseAdjacency.from_coo(rows, cols, vals, n)
        d = torch.zeros(n, n)
        d.index_put_((torch.from_numpy(rows), torch.from_numpy(cols)), torch.from_numpy(vals), accumulate=True)
        dense[loops] = d
    return adjs, dense


def _cheb_conv(lap: torch.Tensor, x: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
    """sum_k T_k(L) x W_k, with T_k built by the recursion one term at a time."""
    t_prev, t_cur = None, x
    out = x @ weights[0]
    for k in range(1, len(weights)):
        t_next = lap @ t_cur if k == 1 else 2 * (lap @ t_cur) - t_prev
        out = out + t_next @ weights[k]
        t_prev, t_cur = t_cur, t_next
    return out


def _blocks(weight: torch.Tensor, k: int, width: int, gate: int, hidden: int) -> list[torch.Tensor]:
    return [weight[j * width : (j + 1) * width, gate * hidden : (gate + 1) * hidden] for j in range(k)]


def reference_gconvgru(cell: GConvGRU, lap, x, h):
    f, hd, k = cell.in_channels, cell.hidden, cell.k
    b = cell.bias
    z = torch.sigmoid(
        _cheb_conv(lap, x, _blocks(cell.weight_x, k, f, 0, hd))
        + b[:hd]
        + _cheb_conv(lap, h, _blocks(cell.weight_h_zr, k, hd, 0, hd))
    )
    r = torch.sigmoid(
        _cheb_conv(lap, x, _blocks(cell.weight_x, k, f, 1, hd))
        + b[hd : 2 * hd]
        + _cheb_conv(lap, h, _blocks(cell.weight_h_zr, k, hd, 1, hd))
    )
    cand = torch.tanh(
        _cheb_conv(lap, x, _blocks(cell.weight_x, k, f, 2, hd))
        + b[2 * hd :]
        + _cheb_conv(lap, h * r, _blocks(cell.weight_h_h, k, hd, 0, hd))
    )
    return z * h + (1 - z) * cand


def reference_gclstm(cell: GCLSTM, lap, x, state):
    hd, k = cell.hidden, cell.k
    h, c = state[:, :hd], state[:, hd:]

    def gate(j):
        return (
            x @ cell.weight_x[:, j * hd : (j + 1) * hd]
            + cell.bias[j * hd : (j + 1) * hd]
            + _cheb_conv(lap, h, _blocks(cell.weight_h, k, hd, j, hd))
        )

    i = torch.sigmoid(gate(0) + cell.peephole[0] * c)
    f = torch.sigmoid(gate(1) + cell.peephole[1] * c)
    c_new = f * c + i * torch.tanh(gate(2))
    o = torch.sigmoid(gate(3) + cell.peephole[2] * c_new)
    return torch.cat([o * torch.tanh(c_new), c_new], 1)


def reference_evolve(cell: EvolveGCNO, a_gcn, x, weight):
    g = cell.evolve
    hd = cell.hidden
    gi = weight @ g.weight_ih.T + g.bias_ih
    gh = weight @ g.weight_hh.T + g.bias_hh
    r = torch.sigmoid(gi[:, :hd] + gh[:, :hd])
    z = torch.sigmoid(gi[:, hd : 2 * hd] + gh[:, hd : 2 * hd])
    n = torch.tanh(gi[:, 2 * hd :] + r * gh[:, 2 * hd :])
    new = (1 - z) * n + z * weight
    return new, a_gcn @ (x @ new)


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_gconvgru_and_gclstm_match_references(k, seed):
    torch.manual_seed(seed)
    n, f, hd = 30, 5, 8
    adjs, dense = _graph(n, 90, seed)
    x = torch.randn(n, f)
    gru = GConvGRU(f, hd, k)
    with torch.no_grad():
        gru.bias.normal_()
    h = torch.randn(n, hd)
    torch.testing.assert_close(gru(x, adjs[False], h), reference_gconvgru(gru, dense[False], x, h))
    lstm = GCLSTM(f, hd, k)
    state = torch.randn(n, 2 * hd)
    torch.testing.assert_close(lstm(x, adjs[False], state), reference_gclstm(lstm, dense[False], x, state))


def test_evolvegcn_matches_reference():
    torch.manual_seed(2)
    n, f, hd = 25, 6, 7
    adjs, dense = _graph(n, 70, 2)
    cell = EvolveGCNO(f, hd)
    x = torch.randn(n, f)
    weight = cell.initial_state(n, x)
    new = cell(x, adjs[True], weight)
    ref_new, ref_out = reference_evolve(cell, dense[True], x, weight)
    torch.testing.assert_close(new, ref_new)
    torch.testing.assert_close(cell.embed(x, adjs[True], new), ref_out)


def test_spmm_gradient_matches_dense():
    adjs, dense = _graph(20, 60, 3)
    x = torch.randn(20, 4, requires_grad=True)
    (spmm(adjs[False], x) ** 2).sum().backward()
    grad = x.grad.clone()
    x.grad = None
    ((dense[False] @ x) ** 2).sum().backward()
    torch.testing.assert_close(grad, x.grad)


class _Snap:
    def __init__(self, x, cheb, gcn):
        self.x, self.cheb, self.gcn = x, cheb, gcn


@pytest.mark.parametrize("cell", ["gconvgru", "gclstm", "evolvegcn"])
def test_model_carries_state_and_grows(cell):
    torch.manual_seed(0)
    snaps = []
    for t, n in enumerate([10, 10, 14]):
        adjs, _ = _graph(n, 3 * n, t)
        snaps.append(_Snap(torch.randn(n, 3), adjs[False], adjs[True]))
    model = SnapshotModel(cell, 3, 8, k=2)
    outs, state = model(snaps)
    assert [o.shape[0] for o in outs] == [10, 10, 14]
    # The same as one snapshot at a time, state handed on.
    step_outs, s = [], None
    for snap in snaps:
        o, s = model([snap], s)
        step_outs += o
    for a, b in zip(outs, step_outs, strict=True):
        torch.testing.assert_close(a, b)
    sum(o.sum() for o in outs).backward()
    assert all(p.grad is not None for p in model.cell.parameters())
    link = SnapshotModel(cell, 3, 8, task="link")
    (emb,), _ = link(snaps[:1])
    assert emb.shape == (10, 8)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cell", ["gconvgru", "gclstm", "evolvegcn"])
def test_cuda_matches_cpu(cell):
    torch.manual_seed(0)
    snaps_cpu, snaps_gpu = [], []
    for t, n in enumerate([40, 40, 50]):
        rows_cols = [
            normalized_adjacency(np.random.default_rng(t).integers(0, n, (2, 4 * n)), None, n, loops)
            for loops in (False, True)
        ]
        x = torch.randn(n, 3)
        for device, out in (("cpu", snaps_cpu), ("cuda", snaps_gpu)):
            adjs = [SparseAdjacency.from_coo(*rc, n, device) for rc in rows_cols]
            out.append(_Snap(x.to(device), adjs[0], adjs[1]))
    model = SnapshotModel(cell, 3, 8, k=3)
    cpu_out, _ = model(snaps_cpu)
    sum(o.sum() for o in cpu_out).backward()
    cpu_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.cuda()
    gpu_out, _ = model(snaps_gpu)
    sum(o.sum() for o in gpu_out).backward()
    for a, b in zip(cpu_out, gpu_out, strict=True):
        torch.testing.assert_close(a, b.cpu(), rtol=1e-4, atol=1e-5)
    for a, p in zip(cpu_grads, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad.cpu(), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("cls", [GConvGRU, GCLSTM])
def test_a_state_of_none_is_the_zero_state(cls):
    torch.manual_seed(0)
    adjs, _ = _graph(20, 60, 4)
    cell = cls(3, 8, 2)
    with torch.no_grad():
        cell.bias.normal_()
        if isinstance(cell, GCLSTM):
            cell.peephole.normal_()
    x = torch.randn(20, 3)
    grads = []
    for state in (None, cell.initial_state(20, x)):
        cell.zero_grad()
        out = cell(x, adjs[False], state)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads.append((out.detach(), cell.weight_x.grad.clone(), cell.bias.grad.clone()))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)
