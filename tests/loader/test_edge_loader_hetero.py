"""Heterogeneous link prediction: typed seed edges, per-type pairs and negatives, exclude="reverse_types",
per-type scorers; in-process on synthetic-mag and on a 2-machine LocalCluster of the toy typed graph."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hetero_graphs import ETYPES, toy_hetero

from distgnn.data.hetero import HeteroGraph
from distgnn.data.synthetic_mag import CITES, REVERSE_ETYPES, WRITES, synthetic_mag
from distgnn.errors import ConfigError, InputError
from distgnn.loader.edge import DistEdgeDataLoader
from distgnn.nn import RGCN, DotPredictor, MLPPredictor, TypedInput, TypedPredictor, bce_loss, margin_loss
from distgnn.sampling.negative import DegreeBiased, NegativeSampler, PerSourceUniform, Uniform, type_in_degrees
from distgnn.sampling.neighbor import InProcessGraph, NeighborSampler, split_by_type
from distgnn.train.evaluation import auc

REV_WRITES = REVERSE_ETYPES[WRITES]


@pytest.fixture(scope="module")
def mag() -> tuple[HeteroGraph, InProcessGraph]:
    # Strong class signal and homophily: citations a model can learn from features within seconds.
    graph = synthetic_mag(2000, seed=1, feat_dim=16, num_classes=8, homophily=0.9, signal=3.0)
    return graph, InProcessGraph(graph)


def _typed_edges(graph: HeteroGraph, g, etype) -> tuple[np.ndarray, np.ndarray]:
    book = g.get_partition_book()
    src, dst = graph.edges[etype]
    return book.map_to_homo_nid(src, etype[0]), book.map_to_homo_nid(dst, etype[2])


def _reverse_homo_eids(graph: HeteroGraph, g, etype, rev_etype, per_type: np.ndarray) -> np.ndarray:
    """Homogeneous ids of every edge of ``rev_etype`` that reverses one of ``per_type`` edges of ``etype``."""
    src, dst = graph.edges[etype]
    rsrc, rdst = graph.edges[rev_etype]
    wanted = {(int(v), int(u)) for u, v in zip(src[per_type], dst[per_type], strict=True)}
    hits = np.array([i for i, pair in enumerate(zip(rsrc.tolist(), rdst.tolist(), strict=True)) if pair in wanted])
    return g.get_partition_book().map_to_homo_eid(hits.astype(np.int64), rev_etype)


@pytest.mark.parametrize("negative", [Uniform(2), PerSourceUniform(3), DegreeBiased(2)], ids=repr)
def test_typed_pairs_are_the_seed_edges_with_negatives_of_their_type(mag, negative):
    graph, g = mag
    book = g.get_partition_book()
    seeds = {WRITES: torch.arange(0, g.num_edges(WRITES), 9), "cites": torch.arange(0, g.num_edges(CITES), 7)}
    loader = DistEdgeDataLoader(g, seeds, NeighborSampler([3, 3]), negative, batch_size=200, shuffle=True)
    seen = {WRITES: [], CITES: []}
    for input_nodes, pos, neg, blocks in loader:
        assert list(pos) == [WRITES, CITES] and list(neg) == [WRITES, CITES]
        out = blocks[-1].dst_nids
        for etype in (WRITES, CITES):
            p, n = pos[etype], neg[etype]
            torch.testing.assert_close(p.node_ids, out)
            types, per_type = book.map_to_per_etype(p.eids.numpy())
            assert (types == book.etype_id(etype)).all()
            src, dst = _typed_edges(graph, g, etype)
            got_src, got_dst = p.global_edges()
            np.testing.assert_array_equal(got_src.numpy(), src[per_type])
            np.testing.assert_array_equal(got_dst.numpy(), dst[per_type])
            neg_src, neg_dst = (t.numpy() for t in n.global_edges())
            if not isinstance(negative, PerSourceUniform):
                np.testing.assert_array_equal(neg_src, np.repeat(got_src.numpy(), negative.k))
            else:
                assert n.num_edges == negative.k * len(np.unique(got_src.numpy()))
            # Negatives of an edge type end at its destination type.
            dst_types, _ = book.map_to_per_ntype(neg_dst)
            assert (dst_types == book.ntype_id(etype[2])).all() and n.eids is None
            seen[etype].append(per_type)
        # Input nodes as the node loader gives them: per type, in the first block's source order.
        expected = split_by_type(book, blocks[0].src_nids)
        assert input_nodes.keys() == expected.keys()
        for t in expected:
            torch.testing.assert_close(input_nodes[t], expected[t])
    np.testing.assert_array_equal(np.sort(np.concatenate(seen[WRITES])), seeds[WRITES].numpy())
    np.testing.assert_array_equal(np.sort(np.concatenate(seen[CITES])), seeds["cites"].numpy())


@pytest.mark.parametrize("exclude", [None, "self", "reverse_types"])
def test_reverse_types_removes_each_seed_and_its_reverse_from_the_blocks(mag, exclude):
    graph, g = mag
    book = g.get_partition_book()
    seeds = torch.arange(0, g.num_edges(WRITES), 3)
    loader = DistEdgeDataLoader(
        g,
        {WRITES: seeds},
        NeighborSampler([-1, -1]),
        Uniform(1),
        exclude=exclude,
        reverse_etypes={"writes": "paper:rev_writes:author"},
        batch_size=400,
        shuffle=True,
    )
    seed_hits = reverse_hits = num_reverses = 0
    for _, pos, _, blocks in loader:
        assert all(b.etypes is not None and len(b.etypes) == b.num_edges for b in blocks)
        in_blocks = np.concatenate([b.eids.numpy() for b in blocks])
        batch_seeds = pos[WRITES].eids.numpy()
        _, per_type = book.map_to_per_etype(batch_seeds)
        reverses = _reverse_homo_eids(graph, g, WRITES, REV_WRITES, per_type)
        assert len(reverses) >= len(batch_seeds)  # synthetic-mag lists every writes edge reversed
        seed_hits += np.isin(batch_seeds, in_blocks).sum()
        reverse_hits += np.isin(reverses, in_blocks).sum()
        num_reverses += len(reverses)
    # With every neighbour taken, the blocks hold each seed edge (an in-edge of an output paper) and its
    # reverses (in-edges of an output author) unless they are excluded.
    assert seed_hits == (len(seeds) if exclude is None else 0)
    assert reverse_hits == (0 if exclude == "reverse_types" else num_reverses)


def test_typed_degree_biased_negatives_follow_the_in_degree_under_their_relation(mag):
    graph, g = mag
    book = g.get_partition_book()
    sampler = DegreeBiased(50, power=0.75)
    src, _ = _typed_edges(graph, g, WRITES)
    etype = book.etype_id(WRITES)
    _, neg_dst, neg_etypes = sampler.sample_typed(
        g, src[:2000], src[:2000], np.full(2000, etype, np.int64), np.random.default_rng(0)
    )
    assert (neg_etypes == etype).all()
    types, per_type = book.map_to_per_ntype(neg_dst)
    assert (types == book.ntype_id("paper")).all()
    # Expected: papers by their number of authors (in-degree under writes) ** 0.75, not by all in-edges.
    degree = np.bincount(graph.edges[WRITES][1], minlength=graph.num_nodes["paper"]).astype(np.float64)
    expected = degree**0.75 / (degree**0.75).sum()
    seen = np.bincount(per_type, minlength=len(expected)) / len(per_type)
    assert seen[degree == 0].sum() == 0
    # Share of the draws per in-degree value (few bins, so 100k draws pin each share to ~0.5%).
    _, bins = np.unique(degree, return_inverse=True)
    seen_share, expected_share = np.bincount(bins, seen), np.bincount(bins, expected)
    np.testing.assert_allclose(seen_share, expected_share, atol=0.01)
    np.testing.assert_allclose(sampler.type_cdf(g, etype), np.cumsum(expected), rtol=1e-9)


def test_bad_typed_input_fails_before_sampling(mag):
    _, g = mag
    sampler = NeighborSampler([2])
    seeds = {WRITES: torch.arange(10)}
    with pytest.raises(ConfigError, match="needs reverse_etypes"):
        DistEdgeDataLoader(g, seeds, sampler, Uniform(1), exclude="reverse_types")
    with pytest.raises(ConfigError, match="unknown edge type"):
        DistEdgeDataLoader(g, seeds, sampler, exclude="reverse_types", reverse_etypes={WRITES: "paper:wrote:author"})
    with pytest.raises(ConfigError, match="does not lead back"):
        DistEdgeDataLoader(g, seeds, sampler, exclude="reverse_types", reverse_etypes={WRITES: CITES})
    with pytest.raises(ConfigError, match="no reverse for the seed edge types"):
        DistEdgeDataLoader(
            g, {**seeds, CITES: torch.arange(3)}, sampler, exclude="reverse_types", reverse_etypes={WRITES: REV_WRITES}
        )
    with pytest.raises(InputError, match="unknown edge type"):
        DistEdgeDataLoader(g, {"paper:reads:paper": torch.arange(3)}, sampler)
    with pytest.raises(InputError, match="out of range"):
        DistEdgeDataLoader(g, {CITES: torch.tensor([g.num_edges(CITES)])}, sampler)
    with pytest.raises(ConfigError, match="typed seed edges"):
        DistEdgeDataLoader(g, torch.arange(5), sampler, exclude="reverse_types", reverse_etypes={WRITES: REV_WRITES})
    with pytest.raises(ConfigError, match="reverse_types"):
        DistEdgeDataLoader(g, seeds, sampler, exclude="reverse_id")

    class UntypedNegatives(Uniform):
        sample_typed = NegativeSampler.sample_typed  # a user's sampler that never learnt typed graphs

    with pytest.raises(ConfigError, match="typed negatives"):
        DistEdgeDataLoader(g, seeds, sampler, UntypedNegatives(1))


def test_typed_predictor_scores_each_type_with_its_own_scorer_and_losses_take_dicts():
    from distgnn.loader.edge import PairGraph

    torch.manual_seed(0)
    h = torch.randn(6, 4)
    nodes = torch.arange(6)
    pairs = {
        WRITES: PairGraph(torch.tensor([0, 1]), torch.tensor([2, 3]), nodes),
        CITES: PairGraph(torch.tensor([4]), torch.tensor([5]), nodes),
    }
    scorer = TypedPredictor([WRITES, CITES], lambda: MLPPredictor(4, 8))
    scores = scorer(h, pairs)
    assert list(scores) == [WRITES, CITES]
    for etype, p in pairs.items():
        torch.testing.assert_close(scores[etype], scorer.predictors[":".join(etype)](h[p.src], h[p.dst]))
    dot = TypedPredictor([WRITES, CITES], DotPredictor)(h, pairs)
    torch.testing.assert_close(dot[CITES], (h[4] * h[5]).sum()[None])
    with pytest.raises(InputError, match="no scorer"):
        TypedPredictor([WRITES], DotPredictor)(h, pairs)
    neg = {WRITES: torch.tensor([0.5, -1.0]), CITES: torch.tensor([2.0])}
    flat_pos, flat_neg = torch.cat(list(dot.values())), torch.cat(list(neg.values()))
    torch.testing.assert_close(bce_loss(dot, neg), bce_loss(flat_pos, flat_neg))
    torch.testing.assert_close(margin_loss(dot, neg), margin_loss(flat_pos, flat_neg))
    with pytest.raises(InputError, match="same edge types"):
        margin_loss(dot, {CITES: neg[CITES], WRITES: neg[WRITES]})


def _held_out(graph: HeteroGraph, etype, fraction: float, seed: int) -> tuple[HeteroGraph, np.ndarray, np.ndarray]:
    """``graph`` without a random ``fraction`` of ``etype``'s edges, and those edges' (src, dst) per-type ids."""
    src, dst = graph.edges[etype]
    test = np.random.default_rng(seed).random(len(src)) < fraction
    edges = dict(graph.edges)
    edges[etype] = (src[~test], dst[~test])
    train = HeteroGraph(graph.name, graph.num_nodes, edges, graph.ndata, {}, graph.num_classes)
    return train, src[test], dst[test]


def test_rgcn_with_a_dot_scorer_learns_held_out_citations(mag):
    graph, _ = mag
    train, test_src, test_dst = _held_out(graph, CITES, 0.1, seed=0)
    g = InProcessGraph(train)
    book = g.get_partition_book()
    torch.manual_seed(0)
    inputs = TypedInput(g, 32)
    encoder = RGCN(32, 32, 32, len(g.canonical_etypes), num_layers=2, dropout=0.0)
    scorer = TypedPredictor([CITES], DotPredictor)
    dense = torch.optim.Adam([*inputs.dense_parameters(), *encoder.parameters()], lr=0.01)
    sparse = inputs.sparse_optimizer("adam", 0.01)
    sampler = NeighborSampler([5, 5])

    def embed(input_nodes, blocks) -> torch.Tensor:
        return encoder(blocks, inputs(input_nodes, blocks[0].src_ntypes, "cpu"))

    def held_out_auc() -> float:
        rng = np.random.default_rng(1)
        src = book.map_to_homo_nid(test_src, "paper")
        dst = book.map_to_homo_nid(test_dst, "paper")
        neg = book.map_to_homo_nid(rng.integers(0, g.num_nodes("paper"), len(src)), "paper")
        nodes = np.unique(np.concatenate([src, dst, neg]))
        encoder.eval()
        with torch.no_grad():
            input_nodes, _, blocks = sampler.sample_blocks(g, nodes, 7)
            h = embed(split_by_type(book, input_nodes), blocks)
        encoder.train()
        at = {name: torch.from_numpy(np.searchsorted(nodes, ids)) for name, ids in (("s", src), ("d", dst), ("n", neg))}
        pos = (h[at["s"]] * h[at["d"]]).sum(-1)
        return auc(pos, (h[at["s"]] * h[at["n"]]).sum(-1)[:, None])

    before = held_out_auc()
    loader = DistEdgeDataLoader(
        g, {CITES: torch.arange(g.num_edges(CITES))}, sampler, Uniform(2), exclude="self", batch_size=512, shuffle=True
    )
    losses = []
    for _ in range(6):
        for input_nodes, pos, neg, blocks in loader:
            h = embed(input_nodes, blocks)
            loss = bce_loss(scorer(h, pos), scorer(h, neg))
            dense.zero_grad()
            sparse.zero_grad()
            loss.backward()
            dense.step()
            sparse.step()
            losses.append(loss.item())
    after = held_out_auc()
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    assert after > 0.75 and after > before + 0.1, (before, after)


# -- a typed partition on a 2-machine LocalCluster -----------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from distgnn.partition import partition_graph
    from distgnn.train.cluster import LocalCluster

    graph = toy_hetero(5)
    json_path = partition_graph(graph, 2, tmp_path_factory.mktemp("hetero-link") / "g", graph_name="g")
    with LocalCluster(json_path, rpc_timeout_s=30) as cluster:
        yield graph, json_path, cluster


def _dist_graph(cluster, json_path, machine: int):
    from distgnn.client.context import connect
    from distgnn.client.graph import DistGraph

    return DistGraph("g", json_path, context=connect(cluster.config(machine), rank=machine, world_size=2))


def test_cluster_typed_seeds_resolve_remote_edges_and_exclude_reverse_types(served):
    graph, json_path, cluster = served
    g = _dist_graph(cluster, json_path, 1)
    try:
        _check_cluster_typed_loader(graph, json_path, g)
    finally:
        g.context.close()


def _check_cluster_typed_loader(graph, json_path, g) -> None:
    from distgnn.partition.format import load_orig_ids, read_meta
    from distgnn.sampling.edges import find_edges

    book = g.get_partition_book()
    orig_nid, orig_eid = (np.asarray(a) for a in load_orig_ids(read_meta(json_path)))
    offsets = {"a": 0, "b": 60, "c": 100}
    edge_offsets = dict(zip(ETYPES, np.cumsum([0] + [len(graph.edges[e][0]) for e in ETYPES]).tolist(), strict=False))
    # Every edge of every type, both machines' (machine 1 reads machine 0's edges remotely).
    eids = np.arange(g.num_edges())
    src, dst = (t.numpy() for t in find_edges(g, eids))
    types, _ = book.map_to_per_etype(eids)
    for t, etype in enumerate(ETYPES):
        mine = types == t
        orig = orig_eid[eids[mine]] - edge_offsets[etype]
        np.testing.assert_array_equal(orig_nid[src[mine]] - offsets[etype[0]], graph.edges[etype][0][orig])
        np.testing.assert_array_equal(orig_nid[dst[mine]] - offsets[etype[2]], graph.edges[etype][1][orig])
    # a:r1:b reversed is b:r2:a; exclusion by endpoints, checked against a brute-force list of reverse ids.
    r1 = ETYPES[0]
    kwargs = dict(exclude="reverse_types", reverse_etypes={"r1": "r2"}, batch_size=16, shuffle=True, seed=3)
    seeds = {"r1": torch.arange(g.num_edges(r1))}
    sampler = NeighborSampler([-1, -1])
    r2_mask = types == book.etype_id("r2")
    r2_pairs = {}
    for e, u, v in zip(eids[r2_mask].tolist(), src[r2_mask].tolist(), dst[r2_mask].tolist(), strict=True):
        r2_pairs.setdefault((u, v), []).append(e)
    found_reverse = 0
    inline = DistEdgeDataLoader(g, seeds, sampler, Uniform(2), **kwargs)
    with DistEdgeDataLoader(g, seeds, sampler, Uniform(2), num_workers=1, **kwargs) as workers:
        for (_, pos, neg, blocks), (_, w_pos, w_neg, w_blocks) in zip(inline, workers, strict=True):
            # A sampler worker process makes the same typed batches.
            np.testing.assert_array_equal(pos[r1].eids.numpy(), w_pos[r1].eids.numpy())
            np.testing.assert_array_equal(neg[r1].dst.numpy(), w_neg[r1].dst.numpy())
            for block, w_block in zip(blocks, w_blocks, strict=True):
                np.testing.assert_array_equal(block.eids.numpy(), w_block.eids.numpy())
                np.testing.assert_array_equal(block.etypes.numpy(), w_block.etypes.numpy())
            in_blocks = np.concatenate([b.eids.numpy() for b in blocks])
            u, v = (t.numpy() for t in pos[r1].global_edges())
            reverses = [e for a, b in zip(u.tolist(), v.tolist(), strict=True) for e in r2_pairs.get((b, a), [])]
            found_reverse += len(reverses)
            assert not np.isin(pos[r1].eids.numpy(), in_blocks).any()
            assert not np.isin(np.asarray(reverses, dtype=np.int64), in_blocks).any()
            dst_types, _ = book.map_to_per_ntype(neg[r1].global_edges()[1].numpy())
            assert (dst_types == book.ntype_id("b")).all()
    assert found_reverse > 0  # the toy graph has some a->b edges reversed by chance
    # Degree-biased negatives read each edge type's in-degrees from both machines.
    for t, etype in enumerate(ETYPES):
        dst_type = book.ntype_id(etype[2])
        nodes = book.map_to_homo_nid(np.arange(book.nodes.type_counts[dst_type]), etype[2])
        expected = np.bincount(graph.edges[etype][1], minlength=graph.num_nodes[etype[2]])
        np.testing.assert_array_equal(type_in_degrees(g, t), expected[orig_nid[nodes] - offsets[etype[2]]])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_typed_batches_sampled_on_the_gpu_keep_their_pairs_types_and_exclusion(mag):
    graph, g = mag
    book = g.get_partition_book()
    seeds = {WRITES: torch.arange(0, g.num_edges(WRITES), 5)}
    kwargs = dict(exclude="reverse_types", reverse_etypes={WRITES: REV_WRITES}, batch_size=300, shuffle=True, seed=2)
    on_cpu = DistEdgeDataLoader(g, seeds, NeighborSampler([-1, 4]), Uniform(2), **kwargs)
    gpu_sampler = NeighborSampler([-1, 4], device="cuda")
    on_gpu = DistEdgeDataLoader(g, seeds, gpu_sampler, Uniform(2), prefetch=1, **kwargs)
    try:
        for (_, pos, neg, _), (input_nodes, g_pos, g_neg, blocks) in zip(on_cpu, on_gpu, strict=True):
            assert blocks[-1].eids.is_cuda and g_pos[WRITES].src.is_cuda and input_nodes["paper"].is_cuda
            # Pairs and negatives are drawn on the host from the batch's stream: the same on either device.
            for a, b in ((pos, g_pos), (neg, g_neg)):
                torch.testing.assert_close(a[WRITES].src, b[WRITES].src.cpu())
                torch.testing.assert_close(a[WRITES].dst, b[WRITES].dst.cpu())
            torch.testing.assert_close(g_pos[WRITES].node_ids, blocks[-1].dst_nids)
            in_blocks = torch.cat([b.eids for b in blocks]).cpu().numpy()
            _, per_type = book.map_to_per_etype(pos[WRITES].eids.numpy())
            reverses = _reverse_homo_eids(graph, g, WRITES, REV_WRITES, per_type)
            assert not np.isin(pos[WRITES].eids.numpy(), in_blocks).any() and not np.isin(reverses, in_blocks).any()
            for block in blocks:
                assert block.etypes.is_cuda and len(block.etypes) == block.num_edges
                src_types = block.src_ntypes[block.indices]
                torch.testing.assert_close(src_types, torch.from_numpy(book.etype_src).cuda()[block.etypes])
    finally:
        on_gpu.close()
        gpu_sampler.close()
