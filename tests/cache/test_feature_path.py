"""The feature path's set-up: flag checks and defaults, loader options, and a batch's inputs and labels.

The cache itself (replicate, clique, presampled hot set, CPU share, pipeline) is tested in
test_cache_dist_feature.py and test_cache_pipeline.py, also through the example's flags.
"""

from __future__ import annotations

import argparse

import pytest
import torch

from distgnn.cache.feature_path import (
    FeatureOptions,
    FeaturePath,
    SeedLabels,
    add_feature_args,
    check_feature_args,
)
from distgnn.data import synthetic
from distgnn.errors import InputError
from distgnn.loader.node import DistNodeDataLoader
from distgnn.sampling.neighbor import NeighborSampler
from distgnn.sampling.source import InProcessGraph
from distgnn.train import job


def parse(*argv: str, trainers_on_host: int = 1) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    job.add_job_args(p)
    add_feature_args(p)
    args = p.parse_args(list(argv))
    check_feature_args(p, args, trainers_on_host)
    return args


def test_gpu_sampling_is_inline_alone_on_a_host_and_in_a_thread_beside_other_trainers() -> None:
    gpu = ("--device=cuda", "--sample-device=cuda")
    assert parse(*gpu).prefetch == 0
    assert parse(*gpu, trainers_on_host=2).prefetch == 1
    assert parse(*gpu, "--prefetch=0", trainers_on_host=2).prefetch == 0  # asked for: kept
    assert parse(*gpu, "--num-workers=2", trainers_on_host=2).prefetch is None  # workers: the loader's default
    assert parse("--device=cuda", trainers_on_host=2).prefetch is None  # CPU sampling: the loader's default


@pytest.mark.parametrize("flags", [["--sample-device=cuda"], ["--cache-policy=clique"]])
def test_gpu_only_choices_need_a_cuda_device(flags, capsys) -> None:
    with pytest.raises(SystemExit):
        parse(*flags)
    assert "need --device cuda" in capsys.readouterr().err


def test_the_cache_is_on_by_default_only_on_a_gpu_and_options_come_from_the_flags() -> None:
    assert parse().cache_gb == 0.0 and parse("--device=cuda").cache_gb == 1.0
    options = FeatureOptions.from_args(parse("--device=cuda", "--cache-gb=2", "--hot-set=presample", "--pipeline"))
    assert options == FeatureOptions(2.0, "replicate", "presample", 200, 0.0, True, "cpu", "gpu")
    cuda = torch.device("cuda", 1)
    assert options.sampler_kwargs(cuda) == {"device": None, "graph_memory": "gpu", "structure": "partitioned"}
    gpu_sampling = FeatureOptions.from_args(
        parse("--device=cuda", "--sample-device=cuda", "--graph-memory=pinned", "--structure=replicated")
    )
    assert gpu_sampling.sampler_kwargs(cuda) == {"device": cuda, "graph_memory": "pinned", "structure": "replicated"}


@pytest.fixture(scope="module")
def graph() -> InProcessGraph:
    return InProcessGraph(synthetic(200, 4.0, 6, 3, seed=2))


def path_for(graph, prefetching: bool, device: str = "cpu", **options) -> FeaturePath:
    seeds = torch.arange(50)
    return FeaturePath(
        graph,
        torch.device(device),
        FeatureOptions(**options),
        seeds=seeds,
        sampler=None,
        batch_size=16,
        seed=0,
        rank=0,
        prefetching=prefetching,
    )


@pytest.mark.parametrize("prefetching", [False, True])
def test_batches_get_their_input_rows_and_seed_labels_whoever_fetches_them(graph, prefetching) -> None:
    # A plain tensor is never cached, and a CPU device never pipelines, whatever the options.
    path = path_for(graph, prefetching, cache_gb=1.0, pipeline=True)
    assert path.cached is None and not path.pipeline
    kwargs = path.loader_kwargs()
    assert kwargs == {
        "device": torch.device("cpu"),
        "input_feats": ("feat",) if prefetching else (),
        "output_feats": ("label",) if prefetching else (),
    }
    sampler = NeighborSampler([3, 3])
    loader = DistNodeDataLoader(graph, torch.arange(50), sampler, 16, prefetch=2 if prefetching else 0, **kwargs)
    try:
        assert path.batches(loader) is loader
        for item in path.batches(loader):
            batch, x, y = path.inputs(item)
            assert torch.equal(x, graph.ndata["feat"][batch[0]])
            assert torch.equal(y, graph.ndata["label"][batch[1]])
            assert (bool(batch.input_data), bool(batch.output_data)) == (prefetching, prefetching)
    finally:
        loader.close()
        sampler.close()
        path.close()
    assert path.result_fields() == {
        "aggregate_inputs": "rows",
        "cache_gb": 0.0,
        "cache_policy": None,
        "hot_set": None,
        "sample_device": "cpu",
    }


def test_the_first_layer_is_summed_by_the_trainer_or_the_owners_only_where_it_applies(graph) -> None:
    # The trainer or the owners sum only where they can (features in the servers' DistTensor, a model whose
    # first layer is a mean); asked for where they cannot, the error names why; auto falls back to rows.
    def path(choice: str, first_layer_mean: bool, device: str = "cpu") -> FeaturePath:
        # Prefetching: no labels table on the device, so a CUDA device is named but never touched.
        return FeaturePath(
            graph,
            torch.device(device),
            FeatureOptions(aggregate_inputs=choice),
            seeds=torch.arange(50),
            sampler=None,
            batch_size=16,
            seed=0,
            rank=0,
            prefetching=True,
            first_layer_mean=first_layer_mean,
        )

    assert path("auto", True).first_layer == "rows" and not path("rows", True).at_owners
    for choice in ("trainer", "owners"):
        with pytest.raises(InputError, match=f"{choice}: the features are not a DistTensor"):
            path(choice, True)
        with pytest.raises(InputError, match=f"{choice}: the model's first layer is not a mean"):
            path(choice, False)
        with pytest.raises(InputError, match=f"{choice}: the trainer is not on the CPU"):
            path(choice, True, device="cuda")
    with pytest.raises(InputError, match="aggregate_inputs must be"):
        path("everywhere", True)


def test_seed_labels_are_looked_up_by_id_and_refuse_other_ids() -> None:
    gen = torch.Generator().manual_seed(4)
    ids = torch.randperm(1000, generator=gen)[:300]
    labels = torch.randint(0, 40, (300,), generator=gen)
    table = SeedLabels(ids, labels, torch.device("cpu"))
    pick = torch.randint(0, 300, (128,), generator=gen)
    assert torch.equal(table(ids[pick]), labels[pick])
    other = torch.tensor(sorted(set(range(1000)) - set(ids.tolist()))[:1])
    with pytest.raises(RuntimeError, match="not one of the training seeds"):
        table(torch.cat([ids[:3], other]))
    with pytest.raises(InputError, match="n >= 1 seed ids"):
        SeedLabels(torch.zeros(0, dtype=torch.int64), torch.zeros(0), torch.device("cpu"))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_labels_come_from_the_gpu_table_when_the_loop_fetches_them(graph) -> None:
    path = path_for(graph, False, device="cuda")
    assert path.seed_labels is not None
    sampler = NeighborSampler([3, 3])
    loader = DistNodeDataLoader(graph, torch.arange(50), sampler, 16, prefetch=0, **path.loader_kwargs())
    try:
        for item in path.batches(loader):
            batch, x, y = path.inputs(item)
            assert y.is_cuda and torch.equal(y.cpu(), graph.ndata["label"][batch[1].cpu()])
            assert torch.equal(x.cpu(), graph.ndata["feat"][batch[0].cpu()])
    finally:
        loader.close()
        sampler.close()
        path.close()
