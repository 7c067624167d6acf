"""SAGEConv and GATConv against dense reference implementations on random Blocks."""

from __future__ import annotations

import pytest
import torch

from distgnn.nn import GAT, GATConv, GraphSAGE, SAGEConv
from distgnn.nn.convert import to_dgl_block, to_pyg
from distgnn.sampling.block import Block


def random_block(num_dst: int, num_src: int, max_deg: int, gen: torch.Generator, unique: bool = False) -> Block:
    """A Block whose destinations have 0..max_deg in-edges from random sources."""
    degrees = torch.randint(0, max_deg + 1, (num_dst,), generator=gen)
    degrees[0] = 0  # always one destination without in-edges
    indices = []
    for d in degrees.tolist():
        if unique:
            indices.append(torch.randperm(num_src, generator=gen)[: min(d, num_src)])
        else:
            indices.append(torch.randint(0, num_src, (d,), generator=gen))
    indices = torch.cat(indices).long()
    degrees = (
        torch.tensor([len(i) for i in indices.split(degrees.tolist())]) if not unique else degrees.clamp(max=num_src)
    )
    indptr = torch.zeros(num_dst + 1, dtype=torch.long)
    indptr[1:] = torch.cumsum(degrees, 0)
    src_nids = torch.randperm(10 * num_src, generator=gen)[:num_src]
    eids = torch.randperm(10 * len(indices) + 1, generator=gen)[: len(indices)]
    return Block(src_nids, num_dst, indptr, indices, eids)


def dense_adjacency(block: Block) -> torch.Tensor:
    """``(num_dst, num_src)`` edge multiplicities."""
    adj = torch.zeros(block.num_dst, block.num_src)
    adj.index_put_((block.dst_index(), block.indices), torch.ones(block.num_edges), accumulate=True)
    return adj


def dense_sage(conv: SAGEConv, block: Block, x: torch.Tensor) -> torch.Tensor:
    adj = dense_adjacency(block)
    mean = adj @ x / adj.sum(1, keepdim=True).clamp(min=1)
    return x[: block.num_dst] @ conv.fc_self.weight.T + mean @ conv.fc_neigh.weight.T + conv.bias


def dense_gat(conv: GATConv, block: Block, x: torch.Tensor) -> torch.Tensor:
    mask = dense_adjacency(block) > 0
    heads, out = conv.num_heads, conv.out_feats
    z = (x @ conv.fc.weight.T).view(-1, heads, out)
    el = (z * conv.attn_l).sum(-1)  # (num_src, H)
    er = (z[: block.num_dst] * conv.attn_r).sum(-1)  # (num_dst, H)
    scores = torch.nn.functional.leaky_relu(er[:, None, :] + el[None, :, :], conv.negative_slope)
    scores = scores.masked_fill(~mask[:, :, None], float("-inf"))
    alpha = torch.softmax(scores, dim=1).nan_to_num(0.0)  # rows without edges -> 0
    return torch.einsum("dsh,sho->dho", alpha, z) + conv.bias


@pytest.mark.parametrize("in_feats,out_feats", [(8, 5), (5, 8)])
def test_sage_matches_dense_reference_and_gradients(in_feats: int, out_feats: int) -> None:
    gen = torch.Generator().manual_seed(1)
    block = random_block(num_dst=30, num_src=70, max_deg=6, gen=gen)
    conv = SAGEConv(in_feats, out_feats)
    torch.nn.init.normal_(conv.bias)
    x = torch.randn(block.num_src, in_feats, generator=gen, requires_grad=True)
    got = conv(block, x)
    want = dense_sage(conv, block, x)
    assert got.shape == (block.num_dst, out_feats)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    weight = torch.randn(got.shape, generator=gen)
    grads = torch.autograd.grad((got * weight).sum(), [x, conv.fc_neigh.weight, conv.fc_self.weight])
    grads_ref = torch.autograd.grad((want * weight).sum(), [x, conv.fc_neigh.weight, conv.fc_self.weight])
    for g, r in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5)


def test_sage_block_without_edges_uses_self_term_only() -> None:
    block = Block(
        torch.arange(4),
        4,
        torch.zeros(5, dtype=torch.long),
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0, dtype=torch.long),
    )
    conv = SAGEConv(3, 2)
    x = torch.randn(4, 3)
    torch.testing.assert_close(conv(block, x), x @ conv.fc_self.weight.T + conv.bias)


@pytest.mark.parametrize("heads", [1, 3])
def test_gat_matches_dense_reference(heads: int) -> None:
    gen = torch.Generator().manual_seed(2)
    block = random_block(num_dst=25, num_src=60, max_deg=7, gen=gen, unique=True)
    conv = GATConv(6, 4, num_heads=heads)
    torch.nn.init.normal_(conv.bias)
    x = torch.randn(block.num_src, 6, generator=gen, requires_grad=True)
    got = conv(block, x)
    want = dense_gat(conv, block, x)
    assert got.shape == (block.num_dst, heads, 4)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    gx = torch.autograd.grad(got.square().sum(), x)[0]
    gx_ref = torch.autograd.grad(want.square().sum(), x)[0]
    torch.testing.assert_close(gx, gx_ref, atol=1e-4, rtol=1e-4)


def test_gat_attention_is_invariant_to_a_constant_score_shift() -> None:
    """Large scores must not overflow the softmax (the max is subtracted per destination)."""
    gen = torch.Generator().manual_seed(3)
    block = random_block(num_dst=10, num_src=20, max_deg=5, gen=gen, unique=True)
    conv = GATConv(4, 3, num_heads=2)
    x = torch.randn(block.num_src, 4, generator=gen) * 1e3
    out = conv(block, x)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, dense_gat(conv, block, x), atol=1e-2, rtol=1e-4)


@pytest.mark.parametrize("model_cls", [GraphSAGE, GAT])
def test_model_stack_runs_layer_by_layer_like_forward(model_cls) -> None:
    gen = torch.Generator().manual_seed(4)
    top = random_block(num_dst=8, num_src=20, max_deg=4, gen=gen, unique=True)
    bottom = random_block(num_dst=20, num_src=50, max_deg=4, gen=gen, unique=True)
    model = model_cls(7, 16, 3, num_layers=2).eval()
    x = torch.randn(bottom.num_src, 7, generator=gen)
    out = model([bottom, top], x)
    assert out.shape == (8, 3)
    step = model.forward_layer(1, top, model.forward_layer(0, bottom, x))
    torch.testing.assert_close(out, step)
    with pytest.raises(ValueError, match="blocks"):
        model([top], x)


def test_sage_agrees_with_dgl_sageconv_on_converted_block() -> None:
    dgl = pytest.importorskip("dgl")
    from dgl.nn import SAGEConv as DGLSAGEConv

    gen = torch.Generator().manual_seed(5)
    block = random_block(num_dst=15, num_src=40, max_deg=5, gen=gen)
    ours = SAGEConv(6, 4)
    theirs = DGLSAGEConv(6, 4, "mean")
    with torch.no_grad():
        theirs.fc_self.weight.copy_(ours.fc_self.weight)
        theirs.fc_neigh.weight.copy_(ours.fc_neigh.weight)
        theirs.fc_self.bias.copy_(torch.randn(4, generator=gen))
        ours.bias.copy_(theirs.fc_self.bias)
    x = torch.randn(block.num_src, 6, generator=gen)
    dgl_block = to_dgl_block(block)
    assert dgl_block.num_src_nodes() == block.num_src and dgl_block.num_dst_nodes() == block.num_dst
    torch.testing.assert_close(dgl_block.edata[dgl.EID], block.eids)
    torch.testing.assert_close(dgl_block.srcdata[dgl.NID], block.src_nids)
    torch.testing.assert_close(ours(block, x), theirs(dgl_block, (x, x[: block.num_dst])), atol=1e-5, rtol=1e-5)


def test_pyg_edge_index_lists_every_edge() -> None:
    gen = torch.Generator().manual_seed(6)
    block = random_block(num_dst=12, num_src=30, max_deg=4, gen=gen)
    edge_index, size = to_pyg(block)
    assert size == (block.num_src, block.num_dst)
    adj = torch.zeros(block.num_dst, block.num_src)
    adj.index_put_((edge_index[1], edge_index[0]), torch.ones(edge_index.shape[1]), accumulate=True)
    torch.testing.assert_close(adj, dense_adjacency(block))
