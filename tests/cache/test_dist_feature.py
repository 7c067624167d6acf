"""CachedFeature on a 2-machine cluster: rows equal the plain DistTensor's; counters split hits/local/remote."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from serving_graphs import child_processes, job_files, small_graph

import distgnn
from distgnn.cache.dist_feature import CachedFeature
from distgnn.client.context import connect
from distgnn.client.tensor import DistTensor
from distgnn.errors import ConfigError, InputError
from distgnn.partition.format import read_meta
from distgnn.train.cluster import LocalCluster
from distgnn.train.result import read_result

NUM_NODES = 500


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    graph = small_graph(tmp_path_factory.mktemp("cached") / "out", num_parts=2, num_nodes=NUM_NODES, num_edges=4000)
    with LocalCluster(graph.json_path, servers_per_machine=1, rpc_timeout_s=20, num_trainers=1) as cluster:
        contexts = [connect(cluster.config(m), rank=m, world_size=2) for m in range(2)]
        try:
            yield graph, contexts
        finally:
            for ctx in contexts:
                ctx.close()
    assert job_files(cluster.job_id) == []
    assert child_processes() == []


def _feat(graph, ctx) -> DistTensor:
    return DistTensor.attach(graph.ndata["feat"].shape, torch.float32, "feat", "node", ctx)


def _cases(graph, machine, rng):
    start, end = graph.node_map[machine]
    other = np.concatenate([np.arange(0, start), np.arange(end, graph.num_nodes)])
    return {
        "random_with_repeats": rng.integers(0, graph.num_nodes, 700),
        "unsorted_unique": rng.permutation(graph.num_nodes)[:300],
        "empty": np.zeros(0, np.int64),
        "all_local": rng.integers(start, end, 120),
        "all_remote": rng.choice(other, 150),
        "single": np.array([graph.num_nodes - 1]),
    }


@pytest.mark.parametrize("machine", [0, 1])
@pytest.mark.parametrize("cached_rows", [0, 37, NUM_NODES])
def test_rows_equal_the_plain_dist_tensor(served, machine, cached_rows):
    graph, contexts = served
    feat = _feat(graph, contexts[machine])
    rng = np.random.default_rng(10 * machine + cached_rows)
    hot = torch.from_numpy(rng.permutation(graph.num_nodes)[:cached_rows])
    row_bytes = 4 * feat.shape[1]
    with CachedFeature(feat, "cpu", cached_rows * row_bytes, hot_ids=hot) as cf:
        for case, ids in _cases(graph, machine, rng).items():
            ids = torch.from_numpy(ids.astype(np.int64))
            got = cf[ids]
            assert got.shape == (len(ids), feat.shape[1]) and got.dtype == torch.float32, case
            torch.testing.assert_close(got, feat[ids], rtol=0, atol=0, msg=case)
            np.testing.assert_array_equal(got.numpy(), graph.ndata["feat"][ids.numpy()], err_msg=case)


def test_fetch_writes_into_the_given_rows(served):
    graph, contexts = served
    feat = _feat(graph, contexts[0])
    ids = torch.from_numpy(np.random.default_rng(5).integers(0, NUM_NODES, 90))
    with CachedFeature(feat, "cpu", 37 * 4 * feat.shape[1], hot_ids=torch.arange(37)) as cf:
        buffer = torch.full((120, feat.shape[1]), float("nan"))
        got = cf.fetch(ids, buffer[:90])
        assert got.data_ptr() == buffer.data_ptr()
        np.testing.assert_array_equal(buffer[:90].numpy(), graph.ndata["feat"][ids.numpy()])
        assert torch.isnan(buffer[90:]).all()
        with pytest.raises(InputError, match="out must be a contiguous"):
            cf.fetch(ids, buffer[:89])


def test_counters_split_hits_local_and_remote(served):
    graph, contexts = served
    machine = 0
    feat = _feat(graph, contexts[machine])
    start, end = graph.node_map[machine]
    rng = np.random.default_rng(3)
    hot = rng.permutation(graph.num_nodes)[:60]
    cf = CachedFeature(feat, "cpu", 60 * 4 * feat.shape[1], hot_ids=torch.from_numpy(hot))
    ids = rng.integers(0, graph.num_nodes, 900)  # repeats on purpose: every lookup counts
    cf[torch.from_numpy(ids)]
    cf[ids[:100].tolist()]  # a plain list works too
    looked_up = np.concatenate([ids, ids[:100]])
    hit = np.isin(looked_up, hot)
    local = ~hit & (looked_up >= start) & (looked_up < end)
    remote = ~hit & ~local
    assert cf.lookups == len(looked_up)
    assert cf.cache_hits == int(hit.sum())
    assert cf.local_rows == int(local.sum())
    assert cf.remote_rows == int(remote.sum())
    fetched = len(np.unique(ids[~np.isin(ids, hot) & ((ids < start) | (ids >= end))]))
    fetched += len(np.unique(ids[:100][~np.isin(ids[:100], hot) & ((ids[:100] < start) | (ids[:100] >= end))]))
    assert cf.remote_fetched == fetched
    assert cf.hit_rate() == pytest.approx(hit.mean())
    cf.reset_stats()
    assert cf.stats() == {
        "lookups": 0,
        "cache_hits": 0,
        "peer_hits": 0,
        "local_rows": 0,
        "remote_rows": 0,
        "remote_fetched": 0,
        "hit_rate": 0.0,
    }


def test_hot_set_by_in_degree_from_the_dist_graph(served):
    graph, contexts = served
    machine = 1
    g = distgnn.DistGraph(read_meta(graph.json_path).graph_name, graph.json_path, context=contexts[machine])
    degree = np.bincount(graph.dst, minlength=graph.num_nodes)
    k = 25
    cf = CachedFeature(g.ndata["feat"], "cpu", k * 4 * 8 + 3, graph=g)  # a partial row's bytes buy nothing
    top = np.lexsort((np.arange(graph.num_nodes), -degree))[:k]
    ids = torch.from_numpy(top)
    torch.testing.assert_close(cf[ids], g.ndata["feat"][ids], rtol=0, atol=0)
    assert cf.cache.capacity == k and cf.cache_hits == k and cf.hit_rate() == 1.0
    rest = torch.from_numpy(np.setdiff1d(np.arange(graph.num_nodes), top))
    torch.testing.assert_close(cf[rest], g.ndata["feat"][rest], rtol=0, atol=0)
    assert cf.cache_hits == k


def test_hot_set_by_pre_sampled_frequency_with_degree_behind(served):
    graph, contexts = served
    g = distgnn.DistGraph(read_meta(graph.json_path).graph_name, graph.json_path, context=contexts[0])
    degree = np.bincount(graph.dst, minlength=graph.num_nodes)
    batches = [torch.tensor([7, 7, 7, 401, 401, 3]), torch.tensor([401, 12, 12, 12, 12])]
    calls = iter(batches)
    cf = CachedFeature(g.ndata["feat"], "cpu", 6 * 4 * 8, graph=g, hot_samples=lambda: next(calls), num_samples=2)
    # 12 (4 hits), 401 (3), 7 (3; 401 and 7 by in-degree, then id), 3 (1), then the unsampled by in-degree.
    unsampled = np.setdiff1d(np.lexsort((np.arange(graph.num_nodes), -degree)), [3, 7, 12, 401], assume_unique=True)
    ties = sorted([7, 401], key=lambda v: (-degree[v], v))
    assert cf.cache.capacity == 6
    cached = torch.nonzero(cf.cache.slot_table >= 0).flatten()
    assert sorted(cached.tolist()) == sorted([12, *ties, 3, *unsampled[:2].tolist()])
    assert cf.cache.slot_table[12] == 0 and cf.cache.slot_table[3] == 3


@pytest.mark.parametrize("machine", [0, 1])
@pytest.mark.parametrize("choice", ["trainer", "owners"])
def test_feature_path_with_the_first_layer_summed_before_the_layer_equals_the_layers_mean(served, machine, choice):
    # The same sampled batches through FeaturePath: 'trainer' (sums where the rows lie) and 'owners' (sums by
    # the rows' owners) hand the first SAGE layer the [self | mean] rows that the layer's own aggregation of
    # the read rows ('rows') gives, and the layer's output agrees.
    from distgnn.cache.feature_path import FeatureOptions, FeaturePath
    from distgnn.loader.node import DistNodeDataLoader
    from distgnn.nn import SAGEConv
    from distgnn.nn.aggregate import self_and_mean, self_and_mean_reference
    from distgnn.sampling.block import SelfAndMean
    from distgnn.sampling.neighbor import NeighborSampler

    graph, contexts = served
    g = distgnn.DistGraph(read_meta(graph.json_path).graph_name, graph.json_path, context=contexts[machine])
    seeds = torch.arange(*graph.node_map[machine])[:96]

    def path(choice: str, prefetching: bool = False) -> FeaturePath:
        options = FeatureOptions(aggregate_inputs=choice)
        kwargs = {"seeds": seeds, "sampler": None, "batch_size": 32, "seed": 0, "rank": machine}
        return FeaturePath(g, torch.device("cpu"), options, first_layer_mean=True, prefetching=prefetching, **kwargs)

    summed, rows = path(choice), path("rows")
    assert summed.first_layer == choice and rows.first_layer == "rows"
    assert (path("auto").first_layer, path("auto", prefetching=True).first_layer) == ("trainer", "rows")
    assert summed.loader_kwargs()["input_feats"] == () == path(choice, prefetching=True).loader_kwargs()["input_feats"]
    layer = SAGEConv(8, 5)
    sampler = NeighborSampler([4, 3])
    loader = DistNodeDataLoader(g, seeds, sampler, 32, seed=3, prefetch=0)
    try:
        for batch in loader:
            _, x, y = summed.inputs(batch)
            _, raw, y_raw = rows.inputs(batch)
            first = batch[2][0]
            assert isinstance(x, SelfAndMean) and torch.equal(y, y_raw)
            torch.testing.assert_close(x.rows, self_and_mean_reference(first, raw), rtol=1e-5, atol=1e-6)
            if choice == "trainer":  # the same adds in the same order as the layer's own mean: bitwise equal
                assert torch.equal(x.rows, self_and_mean(first, raw))
            torch.testing.assert_close(layer(first, x), layer(first, raw), rtol=1e-5, atol=1e-5)
    finally:
        loader.close()
        sampler.close()
    assert summed.result_fields()["aggregate_inputs"] == choice


def test_bad_input_raises(served):
    graph, contexts = served
    feat = _feat(graph, contexts[0])
    with pytest.raises(ConfigError, match="hot_ids or a graph"):
        CachedFeature(feat, "cpu", 1 << 20)
    with pytest.raises(ConfigError, match="clique cache policy .* needs a CUDA device"):
        CachedFeature(feat, "cpu", 0, policy="clique")  # needs CUDA IPC
    label = DistTensor.attach((NUM_NODES,), torch.int64, "label", "node", contexts[0])
    with pytest.raises(InputError, match="node tensor"):
        CachedFeature(label, "cpu", 0)
    cf = CachedFeature(feat, "cpu", 0)
    assert cf.cache is None
    with pytest.raises(InputError, match="out of range"):
        cf[torch.tensor([0, NUM_NODES])]
    with pytest.raises(InputError, match="1-d integer"):
        cf[torch.tensor([0.5])]


def test_dist_tensor_reads_go_through_an_attached_cache(served):
    graph, contexts = served
    feat = _feat(graph, contexts[0])
    ids = torch.from_numpy(np.random.default_rng(5).integers(0, NUM_NODES, 200))
    plain = feat[ids]
    cf = CachedFeature(feat, "cpu", 50 * 4 * feat.shape[1], hot_ids=torch.arange(50))
    feat.use_cache(cf)
    try:
        assert torch.equal(feat[ids], plain) and cf.lookups == 200 and cf.cache_hits == int((ids < 50).sum())
        assert torch.equal(feat.read(ids), plain) and cf.lookups == 200  # read() bypasses the cache
        with pytest.raises(InputError, match="use_cache"):
            feat[ids[:3]] = torch.zeros(3, feat.shape[1])
        other = _feat(graph, contexts[1])
        with pytest.raises(InputError, match="not"):
            other.use_cache(cf)
    finally:
        cf.close()
    assert feat._cache is None  # close detaches it
    assert torch.equal(feat[ids], plain) and cf.lookups == 200


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("impl", ["auto", "torch"])
def test_cuda_rows_equal_the_plain_dist_tensor(served, impl):
    graph, contexts = served
    machine = 1
    feat = _feat(graph, contexts[machine])
    rng = np.random.default_rng(7)
    hot = torch.from_numpy(rng.permutation(graph.num_nodes)[:90])
    with CachedFeature(feat, "cuda", 90 * 4 * feat.shape[1], hot_ids=hot, impl=impl) as cf:
        if impl == "auto":
            assert distgnn.cache.gather_available(), "the CUDA gather extension did not build"
            assert cf._registration is not None and cf._registration.registered
        for case, ids in _cases(graph, machine, rng).items():
            for ids_device in ("cpu", "cuda"):
                ids_t = torch.from_numpy(ids.astype(np.int64)).to(ids_device)
                got = cf[ids_t]
                assert got.device.type == "cuda", case
                np.testing.assert_array_equal(got.cpu().numpy(), graph.ndata["feat"][ids], err_msg=case)
        assert 0 < cf.hit_rate() < 1


def _train(tmp_path, cache_gb: str, *extra: str) -> tuple[dict, list[str]]:
    root = Path(__file__).resolve().parents[2]
    args = ["--local", "--dataset=synthetic", "--num-nodes=1000", "--feat-dim=16", "--synthetic-classes=4"]
    args += ["--num-parts=2", "--part-method=random", "--epochs=1", "--max-batches=2", "--batch-size=64"]
    args += ["--fanouts=5,5", "--hidden=16", "--no-eval", "--quiet", f"--workdir={tmp_path}", f"--cache-gb={cache_gb}"]
    args += list(extra)
    script = root / "examples" / "graphsage" / "train_dist.py"
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    result = read_result(proc.stdout)
    return result, [line for line in lines if line.startswith("epoch")]


def test_train_dist_chooses_the_hot_set_by_pre_sampling(tmp_path):
    result, epochs = _train(tmp_path, "0.00002", "--hot-set=presample", "--presample-batches=5")  # 312 rows
    assert result["hot_set"] == "presample" and 0 < result["cache_hit_rate"] < 1
    assert len(epochs) == 1 and "cache hit" in epochs[0]


def test_train_dist_reads_feat_through_the_cache(tmp_path):
    # Row equality is the tests above; here the example's flag wires the cache in and reports its hit rate.
    result, epochs = _train(tmp_path, "0.00005")  # 50 KB: 781 of the 1000 rows of 16 float32
    assert 0.5 < result["cache_hit_rate"] < 1 and result["cache_gb"] == 0.00005
    assert len(epochs) == 1 and f"cache hit {result['cache_hit_rate']:.1%}" in epochs[0]
    assert result["train_loss"] == pytest.approx(float(epochs[0].split("|")[1].split()[1]), abs=1e-4)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_train_dist_clique_cache_reads_peer_shards(tmp_path):
    # One machine, two trainers on two GPUs: each caches half of the hot rows and reads the other half from
    # its peer. 30 KB per GPU = 468 rows each, 936 of the 1000 rows in the clique.
    extra = ["--device=cuda", "--num-parts=1", "--trainers-per-machine=2", "--cache-policy=clique", "--max-batches=4"]
    result, _ = _train(tmp_path, "0.00003", *extra)
    assert result["cache_policy"] == "clique" and result["num_trainers"] == 2
    assert 0.3 < result["cache_peer_hit_rate"] < result["cache_hit_rate"] < 1
    replicated, _ = _train(tmp_path, "0.00003", *extra[:-2], "--max-batches=4")
    assert replicated["cache_peer_hit_rate"] == 0 and replicated["cache_hit_rate"] < result["cache_hit_rate"]
    assert result["train_loss"] == pytest.approx(replicated["train_loss"], rel=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_ids_are_checked_and_counted_on_the_gpu_like_cpu_ids(served):
    graph, contexts = served
    feat = _feat(graph, contexts[0])
    rng = np.random.default_rng(21)
    hot = torch.from_numpy(rng.permutation(graph.num_nodes)[:120])
    with CachedFeature(feat, "cuda", 120 * 4 * feat.shape[1], hot_ids=hot) as cf:
        for ids in _cases(graph, 0, rng).values():
            ids = torch.from_numpy(ids.astype(np.int64))
            cf.reset_stats()
            on_cpu = cf[ids]
            cpu_stats = cf.stats()
            cf.reset_stats()
            on_gpu = cf[ids.cuda()]
            assert torch.equal(on_cpu, on_gpu)
            assert cf.stats() == cpu_stats
        with pytest.raises(InputError, match="out of range"):
            cf[torch.tensor([0, NUM_NODES], device="cuda")]
        with pytest.raises(InputError, match="out of range"):
            cf[torch.tensor([-1, 3], device="cuda")]
        with pytest.raises(InputError, match="1-d integer"):
            cf[torch.tensor([0.5], device="cuda")]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_ids_through_a_cache_of_every_row_need_no_host_sync(served, monkeypatch):
    graph, contexts = served
    feat = _feat(graph, contexts[0])
    rng = np.random.default_rng(23)
    with CachedFeature(feat, "cuda", NUM_NODES * 4 * feat.shape[1], hot_ids=torch.arange(NUM_NODES)) as cf:
        assert distgnn.cache.gather_available(), "the CUDA gather extension did not build"
        assert cf.cache.covers_all

        def synced(*args):
            raise AssertionError("looked for misses with a host sync")

        monkeypatch.setattr(cf, "_misses_on_device", synced)
        ids = rng.integers(0, NUM_NODES, 700)
        got = cf[torch.from_numpy(ids).cuda()]
        np.testing.assert_array_equal(got.cpu().numpy(), graph.ndata["feat"][ids])
        assert cf.stats()["cache_hits"] == cf.lookups == 700
        buffer = torch.full((800, feat.shape[1]), float("nan"), device="cuda")  # a CUDA graph's input rows
        assert cf.fetch(torch.from_numpy(ids).cuda(), buffer[:700]).data_ptr() == buffer.data_ptr()
        np.testing.assert_array_equal(buffer[:700].cpu().numpy(), graph.ndata["feat"][ids])
        cf[torch.tensor([0, NUM_NODES], device="cuda")]
        with pytest.raises(InputError, match="outside the slot table"):
            cf.cache.check()
