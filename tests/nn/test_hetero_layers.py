"""RelGraphConv against a per-destination, per-relation loop; TypedInput builds rows from features and
embeddings with gradients to both."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hetero_graphs import toy_hetero

from distgnn.nn.hetero import RGCN, RelGraphConv, TypedInput
from distgnn.sampling.block import Block


def _typed_block(rng: np.random.Generator, num_dst: int, num_src: int, num_edges: int, num_rels: int) -> Block:
    dst = np.sort(rng.integers(0, num_dst, num_edges))
    indptr = np.zeros(num_dst + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=num_dst), out=indptr[1:])
    return Block(
        src_nids=torch.arange(num_src),
        num_dst=num_dst,
        indptr=torch.from_numpy(indptr),
        indices=torch.from_numpy(rng.integers(0, num_src, num_edges)),
        eids=torch.arange(num_edges),
        etypes=torch.from_numpy(rng.integers(0, num_rels, num_edges)),
        src_ntypes=torch.zeros(num_src, dtype=torch.int64),
    )


def _per_relation_reference(conv: RelGraphConv, block: Block, x: torch.Tensor) -> torch.Tensor:
    weights = conv.relation_weights()
    out = weights.new_zeros(block.num_dst, conv.out_feats)
    if conv.loop_weight is not None:
        out = out + x[: block.num_dst] @ conv.loop_weight
    if conv.bias is not None:
        out = out + conv.bias
    rows = [out]
    dst = block.dst_index()
    for r in range(conv.num_rels):
        per_rel = []
        for d in range(block.num_dst):
            edges = torch.nonzero((dst == d) & (block.etypes == r)).flatten()
            per_rel.append(
                (x[block.indices[edges]] @ weights[r]).mean(0) if len(edges) else weights.new_zeros(conv.out_feats)
            )
        rows.append(torch.stack(per_rel))
    return torch.stack(rows).sum(0)


# (5, 4): sources projected first (out < in); (4, 6): inputs averaged first. Every combination of the
# self-loop and the bias (the messages are added into the self-loop product where there is one).
@pytest.mark.parametrize("num_bases", [None, 2])
@pytest.mark.parametrize("in_feats, out_feats", [(5, 4), (4, 6)])
@pytest.mark.parametrize("self_loop, bias", [(True, True), (True, False), (False, True), (False, False)])
def test_rel_graph_conv_matches_per_relation_means(num_bases, in_feats, out_feats, self_loop, bias):
    rng = np.random.default_rng(in_feats * 10 + (num_bases or 0))
    block = _typed_block(rng, 7, 20, 60, 3)
    conv = RelGraphConv(in_feats, out_feats, num_rels=3, num_bases=num_bases, self_loop=self_loop, bias=bias)
    if bias:
        with torch.no_grad():
            conv.bias.normal_()
    x = torch.randn(20, in_feats, requires_grad=True)
    out = conv(block, x)
    upstream = torch.randn_like(out)
    params = [t for t in (x, conv.bases, conv.coefficients, conv.loop_weight, conv.bias) if t is not None]
    grads = torch.autograd.grad((out * upstream).sum(), params)
    expect = _per_relation_reference(conv, block, x)
    expect_grads = torch.autograd.grad((expect * upstream).sum(), params)
    torch.testing.assert_close(out, expect, rtol=1e-4, atol=1e-5)
    for got, want in zip(grads, expect_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("num_edges", [0, 40])
def test_rel_graph_conv_with_relations_that_have_no_edges(num_edges):
    # Edges of relations 0-2 only, of 6 (or none at all): the empty relations have no groups; output and
    # gradients still equal the per-relation loop's (zero where nothing was used).
    rng = np.random.default_rng(num_edges)
    block = _typed_block(rng, 9, 25, num_edges, 3)
    conv = RelGraphConv(4, 6, num_rels=6, num_bases=2)
    x = torch.randn(25, 4, requires_grad=True)
    out = conv(block, x)
    expect = _per_relation_reference(conv, block, x)
    torch.testing.assert_close(out, expect, rtol=1e-4, atol=1e-5)
    params = [x, conv.coefficients]
    grad, want = (
        [
            torch.zeros_like(p) if g is None else g
            for g, p in zip(torch.autograd.grad(y.sum(), params, allow_unused=True), params, strict=True)
        ]
        for y in (out, expect)
    )
    for got, ref in zip(grad, want, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_rel_graph_conv_needs_a_typed_block():
    block = _typed_block(np.random.default_rng(0), 2, 4, 3, 1)
    with pytest.raises(ValueError, match="typed block"):
        RelGraphConv(2, 2, 1)(Block(block.src_nids, 2, block.indptr, block.indices, block.eids), torch.randn(4, 2))


def test_typed_input_and_rgcn_train_features_and_embeddings_in_one_process():
    from distgnn.loader.node import DistNodeDataLoader
    from distgnn.sampling.neighbor import NeighborSampler
    from distgnn.sampling.source import InProcessGraph

    graph = toy_hetero(2)
    g = InProcessGraph(graph)
    inputs = TypedInput(g, 8)
    assert set(inputs.features) == {"a", "b"} and set(inputs.embeddings) == {"c"}
    model = RGCN(8, 8, 3, num_rels=len(g.canonical_etypes), num_layers=2, num_bases=2)
    dense = torch.optim.Adam([*model.parameters(), *inputs.dense_parameters()], lr=0.01)
    sparse = inputs.sparse_optimizer("adam", 0.01)
    loader = DistNodeDataLoader(g, {"b": torch.arange(40)}, NeighborSampler([3, 3]), batch_size=10, rank=0)
    before = inputs.local_embeddings["c"].weight.detach().clone()
    labels = torch.from_numpy(graph.ndata["a"]["label"])
    for input_nodes, output_nodes, blocks in loader:
        x = inputs(input_nodes, blocks[0].src_ntypes, "cpu")
        assert x.shape == (blocks[0].num_src, 8)
        logits = model(blocks, x)
        assert logits.shape == (len(output_nodes["b"]), 3)
        loss = torch.nn.functional.cross_entropy(logits, labels[: len(logits)])
        dense.zero_grad()
        sparse.zero_grad()
        loss.backward()
        dense.step()
        sparse.step()
    assert not torch.equal(before, inputs.local_embeddings["c"].weight)
    assert inputs.projections["a"].weight.grad is not None


def test_typed_layerwise_inference_equals_full_neighbour_forward():
    from distgnn.sampling.neighbor import NeighborSampler
    from distgnn.sampling.source import InProcessGraph, split_by_type
    from distgnn.train.inference import layerwise_inference, typed_input_rows

    g = InProcessGraph(toy_hetero(4))
    inputs = TypedInput(g, 6)
    model = RGCN(6, 5, 3, num_rels=len(g.canonical_etypes), num_layers=2, num_bases=3).eval()
    nodes = torch.arange(g.num_nodes())
    out = layerwise_inference(
        model, g, nodes, typed_input_rows(g, inputs, "cpu"), 17, "cpu", lambda layer, dim: torch.zeros(len(nodes), dim)
    )
    seeds = torch.tensor([0, 5, 61, 99, 110])
    input_nodes, _, blocks = NeighborSampler([-1, -1]).sample_blocks(g, seeds)
    with torch.no_grad():
        x = inputs(split_by_type(g.get_partition_book(), input_nodes), blocks[0].src_ntypes, "cpu")
        expect = model(blocks, x)
    torch.testing.assert_close(out[seeds], expect, rtol=1e-4, atol=1e-5)


def test_typed_input_puts_each_types_rows_at_its_sources():
    from distgnn.sampling.neighbor import NeighborSampler
    from distgnn.sampling.source import InProcessGraph, split_by_type

    g = InProcessGraph(toy_hetero(5))
    inputs = TypedInput(g, 4)
    input_nodes, _, blocks = NeighborSampler([3, 3]).sample_blocks(g, torch.tensor([0, 5, 61, 99, 110]))
    by_type = split_by_type(g.get_partition_book(), input_nodes)
    src_ntypes = blocks[0].src_ntypes
    x = inputs(by_type, src_ntypes, "cpu")
    assert len(set(src_ntypes.tolist())) > 1, "the batch must mix node types"
    for t, ntype in enumerate(inputs.ntypes):
        ids = by_type.get(ntype)
        if ids is None or len(ids) == 0:
            continue
        if ntype in inputs.features:
            expect = inputs.projections[ntype](inputs.features[ntype][ids].float())
        else:
            expect = inputs.embeddings[ntype](ids)
        torch.testing.assert_close(x[src_ntypes == t], expect)
    # Gradients: those of the same rows put in place by a plain index_put, under a random upstream.
    upstream = torch.randn_like(x)
    params = list(inputs.parameters())
    got = torch.autograd.grad((x * upstream).sum(), params)
    ref = torch.zeros_like(x)
    for t, ntype in enumerate(inputs.ntypes):
        ids = by_type.get(ntype)
        if ids is None or len(ids) == 0:
            continue
        rows = (
            inputs.projections[ntype](inputs.features[ntype][ids].float())
            if ntype in inputs.features
            else inputs.embeddings[ntype](ids)
        )
        ref = ref.index_put((torch.nonzero(src_ntypes == t).flatten(),), rows)
    want = torch.autograd.grad((ref * upstream).sum(), params)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.to_dense(), w.to_dense())
