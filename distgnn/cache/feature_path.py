"""The feature path of a training loop: how each batch's input features and labels reach the trainer's device.

:class:`FeaturePath` sets up what the flags of :func:`add_feature_args` ask for: a
:class:`~distgnn.cache.dist_feature.CachedFeature` of the hot rows on the GPU (``--cache-gb``; replicated
or sharded over the machine's GPUs; hot set by in-degree or by pre-sampled batches; a CPU share of the
uncached rows), ``feat[ids]`` read through it, and batch t+1 gathered on a side stream while batch t trains
(``--pipeline``, :class:`~distgnn.cache.pipeline.GatherAhead`). It says how to build the loader
(:meth:`FeaturePath.loader_kwargs`), what to iterate (:meth:`FeaturePath.batches`) and how to get a batch's
``(x, y)`` (:meth:`FeaturePath.inputs`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from distgnn.cache.pipeline import GatherAhead
from distgnn.client.tensor import DistTensor
from distgnn.errors import InputError
from distgnn.loader.node import MiniBatch
from distgnn.sampling.block import SelfAndMean
from distgnn.sampling.neighbor import add_sampling_args, derive_seed


def add_feature_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The GPU feature path's flags (``--cache-gb --cache-policy --hot-set --presample-batches
    --host-cpu-share --pipeline --sample-device --graph-memory --structure``); check them with :func:`check_feature_args`."""
    group = parser.add_argument_group("GPU feature path")
    group.add_argument(
        "--cache-gb",
        type=float,
        default=None,
        help="GB of hot feature rows (by in-degree) cached on each trainer's device; 'feat' is then read\n"
        "through distgnn.cache (default: 1.0 with --device cuda, 0 = off on cpu)",
    )
    add_sampling_args(group)
    group.add_argument(
        "--graph-memory",
        default="gpu",
        choices=("gpu", "pinned"),
        help="with --sample-device cuda: the partition's CSC in GPU memory, or page-locked host memory read\nzero-copy",
    )
    group.add_argument(
        "--cache-policy",
        default="replicate",
        choices=("replicate", "clique"),
        help="replicate: every GPU caches the same hot rows; clique: the trainers of a machine shard one cache\n"
        "of --cache-gb per GPU and read each other's shards over NVLink (CUDA IPC)",
    )
    group.add_argument(
        "--hot-set",
        default="degree",
        choices=("degree", "presample"),
        help="which rows the cache holds: the highest in-degrees, or the rows that --presample-batches sampled\n"
        "batches of this trainer's seeds touch most (in-degree breaks ties; a clique sums its trainers' counts)",
    )
    group.add_argument("--presample-batches", type=int, default=200, help="with --hot-set presample")
    group.add_argument(
        "--host-cpu-share",
        type=float,
        default=0.0,
        help="with the cache: fraction of this machine's uncached rows gathered by CPU threads and copied by\n"
        "DMA beside the GPU's zero-copy reads (distgnn.cache.gather's cpu_share; default 0). Pays only where a\n"
        "batch touches a small fraction of a large table; at products scale 0.3 slowed epochs\n"
        "(docs/benchmarks-history.md)",
    )
    group.add_argument(
        "--pipeline",
        action="store_true",
        help="with --device cuda and the cache: copy and gather batch t+1 on a side CUDA stream while batch t "
        "trains (with --prefetch or --num-workers, sampling runs ahead too); off by default: on 2x H200 the epoch "
        "was bound by the sampling servers and the overlap gained nothing (docs/benchmarks-history.md)",
    )
    group.add_argument(
        "--aggregate-inputs",
        default="auto",
        choices=("auto", "trainer", "rows", "owners"),
        help="where a mean-aggregating first layer (GraphSAGE, CPU trainers, features of the servers) gets its\n"
        "[x_dst | mean of neighbours' x]: 'trainer' sums the rows where they lie (this machine's in shared memory,\n"
        "the others' in the pulled replies) with no copy of every input row; 'rows' gathers every sampled row\n"
        "first and the layer averages them; 'owners' has the machines that hold the rows sum them and pulls only\n"
        "the sums and the destinations' own rows. 'auto' (default): 'trainer' where the loop reads the features\n"
        "itself (--prefetch 0), else 'rows' (the prefetching loader gathers them while the step runs)",
    )
    return group


def check_feature_args(parser: argparse.ArgumentParser, args: argparse.Namespace, trainers_on_host: int = 1) -> None:
    """Refuse GPU-only choices without ``--device cuda`` and fill in the defaults that depend on the device
    (``--cache-gb``; ``--prefetch`` when a GPU samples in the trainer: 0 with one trainer on the host, 1 with
    several). Needs the job flags too; ``trainers_on_host``: the job's trainers on this host."""
    if args.device != "cuda" and (args.sample_device == "cuda" or args.cache_policy == "clique"):
        parser.error("--sample-device cuda and --cache-policy clique need --device cuda")
    if args.cache_gb is None:
        args.cache_gb = 1.0 if args.device == "cuda" else 0.0
    if args.prefetch is None and args.sample_device == "cuda" and args.num_workers == 0:
        # GPU sampling is launch-bound Python. Alone on a host, a background thread only shares the GIL with the
        # training loop (epochs are faster inline). Beside other GPU trainers, each one's host-bound loop runs
        # slower, and inline the slowest trainer's sampling sets every trainer's pace at the all-reduce; the
        # thread takes sampling off the loop (docs/BENCHMARKS.md, "Many GPUs").
        args.prefetch = 1 if trainers_on_host > 1 else 0


@dataclass(frozen=True)
class FeatureOptions:
    """The choices of :func:`add_feature_args` (see their help)."""

    cache_gb: float = 0.0
    cache_policy: str = "replicate"
    hot_set: str = "degree"
    presample_batches: int = 200
    host_cpu_share: float = 0.0
    pipeline: bool = False
    sample_device: str = "cpu"
    graph_memory: str = "gpu"
    aggregate_inputs: str = "auto"
    structure: str = "partitioned"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> FeatureOptions:
        return cls(
            args.cache_gb,
            args.cache_policy,
            args.hot_set,
            args.presample_batches,
            args.host_cpu_share,
            args.pipeline,
            args.sample_device,
            args.graph_memory,
            args.aggregate_inputs,
            args.structure,
        )

    def sampler_kwargs(self, device: torch.device) -> dict[str, Any]:
        """Where the NeighborSampler samples: ``device`` with ``--sample-device cuda``, else the CPU."""
        return {
            "device": device if self.sample_device == "cuda" else None,
            "graph_memory": self.graph_memory,
            "structure": self.structure,
        }


class SeedLabels:
    """The labels of a fixed set of seeds, held on a device and looked up there by global id (no host sync).

    Args:
        ids: ``(n,)`` int64 global ids of the seeds, ``n >= 1``, unique.
        labels: ``(n,)`` their labels, in the same order.
        device: where the table lives and lookups run.
    """

    def __init__(self, ids: torch.Tensor, labels: torch.Tensor, device: torch.device) -> None:
        ids, labels = torch.as_tensor(ids, dtype=torch.int64), torch.as_tensor(labels)
        if ids.dim() != 1 or ids.numel() == 0 or labels.shape[:1] != ids.shape:
            raise InputError(
                f"SeedLabels needs n >= 1 seed ids and their n labels, got ids {tuple(ids.shape)} and labels "
                f"{tuple(labels.shape)}"
            )
        order = torch.argsort(ids)
        self.keys = ids[order].to(device)
        self.values = labels[order].to(device)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """``(B,)`` labels of ``ids`` (``(B,)`` int64, any device; each one of the seeds) on the table's device.
        An id that is not a seed trips an assert on the device (raises at once on the CPU) instead of a sync."""
        ids = ids.to(self.keys.device, non_blocking=True)
        pos = torch.searchsorted(self.keys, ids).clamp_(max=self.keys.numel() - 1)
        torch._assert_async((self.keys[pos] == ids).all(), "a batch's seed is not one of the training seeds")
        return self.values[pos]


class FeaturePath:
    """Input features and labels of a loop's batches on ``device``.

    Args:
        g: a DistGraph or InProcessGraph; its node data ``feature`` ``(N, F)`` and ``label`` ``(N,)``.
        device: the trainer's device.
        options: the feature path's choices.
        seeds: ``(n,)`` int64, this trainer's training seeds (pre-sampling draws its batches from them).
        sampler: the loop's NeighborSampler (pre-sampling uses it).
        batch_size: seeds per batch (of pre-sampled batches too).
        seed, rank: the run's seed and this trainer's rank (pre-sampling's random stream).
        machine_group: the gloo group of this machine's trainers (the clique cache's members).
        prefetching: the loader samples in the background (``--prefetch`` > 0 or sampler workers), so it
            can fetch node data with the batch.
        first_layer_mean: the model's first layer takes its input as
            :class:`~distgnn.sampling.block.SelfAndMean` (GraphSAGE): where the features are a float32 DistTensor
            read without a cache, :meth:`inputs` returns that, summed on the trainer from where the rows lie
            (``aggregate_inputs`` trainer, :meth:`~distgnn.client.tensor.DistTensor.read_self_and_mean`) or by
            the features' owners (owners, :meth:`~distgnn.client.tensor.DistTensor.self_and_mean`).

    The cache exists only for a DistTensor feature and ``cache_gb`` > 0; the pipeline only with the cache
    on a GPU and ``pipeline``. :meth:`close` releases the cache (after the loader closed).
    """

    def __init__(
        self,
        g: Any,
        device: torch.device,
        options: FeatureOptions,
        *,
        seeds: torch.Tensor,
        sampler: Any,
        batch_size: int,
        seed: int,
        rank: int,
        machine_group: Any = None,
        prefetching: bool = False,
        first_layer_mean: bool = False,
        feature: str = "feat",
        label: str = "label",
    ) -> None:
        self.device = torch.device(device)
        self.options = options
        self.feature_name, self.label_name = feature, label
        self.feat, self.label = g.ndata[feature], g.ndata[label]
        self.prefetching = prefetching
        self.cached = None
        if options.cache_gb > 0 and isinstance(self.feat, DistTensor):
            self.cached = self._open_cache(g, seeds, sampler, batch_size, seed, rank, machine_group)
            self.feat.use_cache(self.cached)  # feat[ids] now reads through the cache, onto the device
        # On a GPU, the training seeds' labels wait there: a batch's labels are looked up on the device, with
        # no trip of its seeds through host memory (a host sync per batch that kept the step from being queued).
        # Also with a GPU sampler's prefetch thread: a lookup of a few launches in the trainer's thread instead
        # of a read through the host in the sampling thread, which holds the GIL the trainer's thread waits for.
        self.seed_labels = None
        labels_here = not prefetching or options.sample_device == "cuda"
        if self.device.type == "cuda" and labels_here and len(seeds):
            self.seed_labels = SeedLabels(seeds, self.label[seeds], self.device)
        # With the cache on a GPU, batch t+1 is copied and gathered on a side stream while batch t trains.
        self.pipeline = self.cached is not None and self.device.type == "cuda" and options.pipeline
        self.first_layer = self._first_layer_input(options.aggregate_inputs, first_layer_mean)

    @property
    def at_owners(self) -> bool:
        """Whether the first layer's neighbour means are summed by the features' owners."""
        return self.first_layer == "owners"

    def _first_layer_input(self, choice: str, first_layer_mean: bool) -> str:
        """Where the first layer's ``[x_dst | mean]`` is summed: ``rows`` (the layer averages gathered rows),
        ``trainer`` or ``owners`` (see ``--aggregate-inputs``)."""
        if choice not in ("auto", "trainer", "rows", "owners"):
            raise InputError(f"aggregate_inputs must be 'auto', 'trainer', 'rows' or 'owners', got {choice!r}")
        why_not = None
        if not first_layer_mean:
            why_not = "the model's first layer is not a mean aggregation (GraphSAGE)"
        elif self.device.type != "cpu":
            why_not = "the trainer is not on the CPU (a GPU trainer's step takes the rows themselves)"
        elif not isinstance(self.feat, DistTensor):
            why_not = "the features are not a DistTensor of the servers"
        elif self.cached is not None:
            why_not = "the features are read through the GPU cache"
        elif self.feat.dtype != torch.float32 or len(self.feat.shape) != 2:
            why_not = f"the features are {self.feat.dtype}{list(self.feat.shape)}, not float32 (N, F)"
        if choice in ("trainer", "owners") and why_not is not None:
            raise InputError(f"--aggregate-inputs {choice}: {why_not}")
        if choice == "auto":
            return "trainer" if why_not is None and not self.prefetching else "rows"
        return choice

    def _open_cache(
        self,
        g: Any,
        seeds: torch.Tensor,
        sampler: Any,
        batch_size: int,
        seed: int,
        rank: int,
        machine_group: Any,
    ) -> Any:
        from distgnn.cache.dist_feature import CachedFeature

        hot_samples = None
        if self.options.hot_set == "presample":
            picker = torch.Generator().manual_seed(derive_seed(seed, rank, 2))

            def hot_samples():  # a clique's members must all sample (their counts are summed), seeds or not
                if len(seeds) == 0:
                    return torch.empty(0, dtype=torch.int64)
                chosen = seeds[torch.randperm(len(seeds), generator=picker)[:batch_size]]
                return sampler.sample_blocks(g, chosen, int(torch.randint(2**62, (1,), generator=picker)))[0]

        return CachedFeature(
            self.feat,
            self.device,
            int(self.options.cache_gb * 1e9),
            graph=g,
            policy=self.options.cache_policy,
            group=machine_group,
            cpu_share=self.options.host_cpu_share,
            hot_samples=hot_samples,
            num_samples=self.options.presample_batches,
        )

    def loader_kwargs(self) -> dict[str, Any]:
        """``device``, ``input_feats`` and ``output_feats`` for the loop's DistNodeDataLoader."""
        return {
            # The pipeline copies CPU-sampled batches itself; a GPU sampler's batches are already on the device.
            "device": torch.device("cpu") if self.pipeline and self.options.sample_device == "cpu" else self.device,
            # With the cache, features are gathered in the loop on the device instead of by the loader; summed
            # for the first layer (trainer, owners), they are asked for in the loop too.
            "input_feats": (self.feature_name,)
            if self.prefetching and self.cached is None and self.first_layer == "rows"
            else (),
            "output_feats": (self.label_name,) if self.prefetching and self.seed_labels is None else (),
        }

    def batches(self, loader: Iterable[MiniBatch]) -> Iterable[Any]:
        """What the loop iterates: the loader, or with the pipeline ``(batch, features)`` gathered ahead."""
        return GatherAhead(loader, self.cached, self.device) if self.pipeline else loader

    def inputs(
        self, item: Any, rows: Callable[[int, int, torch.dtype], torch.Tensor | None] | None = None
    ) -> tuple[MiniBatch, torch.Tensor, torch.Tensor]:
        """``(batch, x, y)`` for an item of :meth:`batches`: ``x`` ``(num_inputs, F)`` features and ``y``
        ``(num_seeds,)`` labels on the device.

        ``rows(num_inputs, F, dtype)``, where given, may return a tensor for the cache to gather ``x`` into
        (:meth:`distgnn.train.step.TrainStep.input_rows`: a CUDA graph's input buffer, saving a copy); None
        lets it allocate."""
        batch, x = item if self.pipeline else (item, None)
        input_nodes, seeds = batch[0], batch[1]
        if x is not None:
            pass  # gathered ahead with the batch
        elif self.first_layer == "trainer":
            first = batch[2][0]
            x = SelfAndMean(self.feat.read_self_and_mean(input_nodes.cpu(), first.indptr.cpu(), first.indices.cpu()))
        elif self.at_owners:
            first = batch[2][0]
            ids = input_nodes.cpu().numpy()
            neighbours = np.take(ids, first.indices.cpu().numpy())  # numpy's take: faster than torch's index here
            rows = self.feat.self_and_mean(ids[: first.num_dst], first.indptr.cpu().numpy(), neighbours)
            x = SelfAndMean(rows.to(self.device))
        elif self.feature_name in batch.input_data:
            x = batch.input_data[self.feature_name]
        elif self.cached is not None:  # through the cache
            out = rows(len(input_nodes), self.cached.shape[1], self.cached.dtype) if rows is not None else None
            x = self.cached.fetch(input_nodes, out)
        else:
            x = self.feat[input_nodes.cpu()].to(self.device)
        if self.label_name in batch.output_data:
            y = batch.output_data[self.label_name]
        elif self.seed_labels is not None:
            y = self.seed_labels(seeds)
        else:
            y = self.label[seeds.cpu()].to(self.device)
        return batch, x, y

    def result_fields(self) -> dict[str, Any]:
        """The RESULT keys that describe the feature path: ``aggregate_inputs cache_gb cache_policy hot_set
        sample_device``."""
        on = self.cached is not None
        return {
            "aggregate_inputs": self.first_layer,
            "cache_gb": self.options.cache_gb if on else 0.0,
            "cache_policy": self.options.cache_policy if on else None,
            "hot_set": self.options.hot_set if on else None,
            "sample_device": self.options.sample_device,
        }

    def close(self) -> None:
        if self.cached is not None:
            self.cached.close()
