"""Distributed GraphSAGE node classification with distgnn and torch DDP.

Three ways to run it:

* ``--local``: the whole job on this host. Partitions the dataset into
  ``--workdir`` (reusing a partition of the same graph, method and part count),
  starts a LocalCluster (``--num-parts`` simulated machines with
  ``--servers-per-machine`` servers each), spawns ``--trainers-per-machine``
  trainers per machine (this script again, with torchrun's environment),
  trains, evaluates and stops everything.
* no flag: one trainer of a job started by ``distgnn-launch`` (or by ``--local``);
  the job's configuration comes from the environment (``distgnn.initialize``).
* ``--single``: the single-process reference: the same sampler, loader and
  model on the whole graph held in this process.

Rank 0 prints one line per epoch (loss, train accuracy, time split into
sampling / feature fetch / compute), a progress bar on stderr, and finally
``RESULT {json}``. Validation and test accuracy come from layer-wise inference
over all nodes: every trainer computes its share of each layer's output into a
DistTensor, then all meet at a barrier before the next layer.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import distgnn
from distgnn import job
from distgnn.cache.pipeline import GatherAhead
from distgnn.dataloader import DistNodeDataLoader
from distgnn.datasets import add_dataset_args
from distgnn.inference import layerwise_inference
from distgnn.nn import GAT, MLP, GraphSAGE
from distgnn.sampling.neighbor import NeighborSampler, derive_seed
from distgnn.training import EpochMeter, TrainingLog, all_reduce


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    add_dataset_args(p)
    job.add_job_args(p)
    p.add_argument("--fanouts", default="10,10", help="per layer, input layer first; -1 = all neighbours")
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--eval-batch-size", type=int, default=10000)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--model", default="sage", choices=("sage", "gat", "mlp"), help="mlp: the graph-free baseline")
    p.add_argument("--heads", type=int, default=4, help="gat: attention heads")
    p.add_argument(
        "--cache-gb",
        type=float,
        default=None,
        help="GB of hot feature rows (by in-degree) cached on each trainer's device; 'feat' is then read\n"
        "through distgnn.cache (default: 1.0 with --device cuda, 0 = off on cpu)",
    )
    p.add_argument(
        "--sample-device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="cuda (with --device cuda): sample this machine's partition on the trainer's GPU (remote seeds\n"
        "still go to their servers); needs --num-workers 0",
    )
    p.add_argument(
        "--graph-memory",
        default="gpu",
        choices=("gpu", "pinned"),
        help="with --sample-device cuda: the partition's CSC in GPU memory, or page-locked host memory read\nzero-copy",
    )
    p.add_argument(
        "--cache-policy",
        default="replicate",
        choices=("replicate", "clique"),
        help="replicate: every GPU caches the same hot rows; clique: the trainers of a machine shard one cache\n"
        "of --cache-gb per GPU and read each other's shards over NVLink (CUDA IPC)",
    )
    p.add_argument(
        "--hot-set",
        default="degree",
        choices=("degree", "presample"),
        help="which rows the cache holds: the highest in-degrees, or the rows that --presample-batches sampled\n"
        "batches of this trainer's seeds touch most (in-degree breaks ties; a clique sums its trainers' counts)",
    )
    p.add_argument("--presample-batches", type=int, default=200, help="with --hot-set presample")
    p.add_argument(
        "--host-cpu-share",
        type=float,
        default=0.0,
        help="with the cache: fraction of this machine's uncached rows gathered by CPU threads and copied by\n"
        "DMA beside the GPU's zero-copy reads (distgnn.cache.gather's cpu_share; default 0). Pays only where a\n"
        "batch touches a small fraction of a large table; at products scale 0.3 slowed epochs (docs/BENCHMARKS.md)",
    )
    p.add_argument("--no-eval", action="store_true", help="skip the final layer-wise inference")
    p.add_argument(
        "--pipeline",
        action="store_true",
        help="with --device cuda and the cache: copy and gather batch t+1 on a side CUDA stream while batch t "
        "trains (with --prefetch or --num-workers, sampling runs ahead too); off by default: on 2x H200 the epoch "
        "was bound by the sampling servers and the overlap gained nothing (docs/BENCHMARKS.md)",
    )
    args = p.parse_args(argv)
    args.fanouts = [int(f) for f in str(args.fanouts).split(",") if f.strip()]
    if args.device != "cuda" and (args.sample_device == "cuda" or args.cache_policy == "clique"):
        p.error("--sample-device cuda and --cache-policy clique need --device cuda")
    if args.cache_gb is None:
        args.cache_gb = 1.0 if args.device == "cuda" else 0.0
    if args.prefetch is None and args.sample_device == "cuda" and args.num_workers == 0:
        # GPU sampling is launch-bound Python: a background thread only shares the GIL with the training loop
        # (products-scale, one H200: 1.27 s per epoch with the thread, 1.09-1.10 s inline; docs/BENCHMARKS.md).
        args.prefetch = 0
    return args


# -- training -------------------------------------------------------------------------------------


def build_model(args: argparse.Namespace, in_feats: int, num_classes: int) -> torch.nn.Module:
    num_layers = len(args.fanouts)
    if args.model == "mlp":
        return MLP(in_feats, args.hidden, num_classes, num_layers, args.dropout)
    if args.model == "gat":
        return GAT(in_feats, args.hidden, num_classes, num_layers, args.heads, args.dropout)
    return GraphSAGE(in_feats, args.hidden, num_classes, num_layers, args.dropout)


def run_trainer(trainer: job.Trainer, args: argparse.Namespace) -> dict:
    """Train and evaluate on ``trainer.g``; the same code for a DistGraph and an InProcessGraph."""
    g, device, machine_group, new_buffer = trainer.g, trainer.device, trainer.machine_group, trainer.new_buffer
    rank, world = trainer.rank, trainer.world_size
    verbose = rank == 0
    train_nids = trainer.seeds("train_mask")
    in_feats = int(g.ndata["feat"].shape[1])
    own = trainer.inference_nodes()
    local_max = int(g.ndata["label"][own].max()) if len(own) else 0
    num_classes = int(all_reduce([local_max], "max")[0]) + 1

    torch.manual_seed(args.seed)  # identical initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = build_model(args, in_feats, num_classes).to(device)
    torch.manual_seed(derive_seed(args.seed, rank, 1))  # dropout differs per trainer, fixed per run
    raw_model = model
    if world > 1:
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    # On a GPU the fused Adam updates every parameter in one kernel (the step is launch-bound at these sizes).
    fused = {"fused": True} if device.type == "cuda" else {}
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, **fused)
    sampler = NeighborSampler(
        args.fanouts, device=device if args.sample_device == "cuda" else None, graph_memory=args.graph_memory
    )
    feat, label = g.ndata["feat"], g.ndata["label"]
    cached = None
    if args.cache_gb > 0 and isinstance(feat, distgnn.DistTensor):
        from distgnn.cache.dist_feature import CachedFeature

        hot_samples = None
        if args.hot_set == "presample":
            picker = torch.Generator().manual_seed(derive_seed(args.seed, rank, 2))

            def hot_samples():  # a clique's members must all sample (their counts are summed), seeds or not
                if len(train_nids) == 0:
                    return torch.empty(0, dtype=torch.int64)
                seeds = train_nids[torch.randperm(len(train_nids), generator=picker)[: args.batch_size]]
                return sampler.sample_blocks(g, seeds, int(torch.randint(2**62, (1,), generator=picker)))[0]

        cached = CachedFeature(
            feat,
            device,
            int(args.cache_gb * 1e9),
            graph=g,
            policy=args.cache_policy,
            group=machine_group,
            cpu_share=args.host_cpu_share,
            hot_samples=hot_samples,
            num_samples=args.presample_batches,
        )
        feat.use_cache(cached)  # feat[ids] now reads through the cache, onto the device
    # With the cache on a GPU, batch t+1 is copied and gathered on a side stream while batch t trains.
    pipeline = cached is not None and device.type == "cuda" and args.pipeline
    loader = DistNodeDataLoader(
        g,
        train_nids,
        sampler,
        args.batch_size,
        shuffle=True,
        num_workers=args.num_workers,
        prefetch=args.prefetch,
        # The pipeline copies CPU-sampled batches itself; a GPU sampler's batches are already on the device.
        device=torch.device("cpu") if pipeline and args.sample_device == "cpu" else device,
        seed=args.seed,
        # With the cache, features are gathered in this loop on the device instead of by the loader.
        input_feats=("feat",) if (args.prefetch or args.num_workers) and cached is None else (),
        output_feats=("label",) if args.prefetch or args.num_workers else (),
    )
    epoch_batches = GatherAhead(loader, cached, device) if pipeline else loader
    num_batches = len(loader) if not args.max_batches else min(len(loader), args.max_batches)

    def inputs(item):
        batch, x = item if pipeline else (item, None)
        input_nodes, seeds, _ = batch
        if x is not None:
            pass  # gathered ahead with the batch
        elif "feat" in batch.input_data:
            x = batch.input_data["feat"]
        elif cached is not None:
            x = feat[input_nodes]  # through the cache
        else:
            x = feat[input_nodes.cpu()].to(device)
        y = batch.output_data["label"] if "label" in batch.output_data else label[seeds.cpu()].to(device)
        return batch, x, y

    log = TrainingLog()
    try:
        for epoch in range(args.epochs):
            model.train()
            meter = EpochMeter(
                epoch, num_batches, device, sync_timing=args.sync_timing, show_progress=trainer.show_progress
            )
            for (_, seeds, blocks), x, y in meter.steps(epoch_batches, inputs):
                logits = model(blocks, x)
                loss = F.cross_entropy(logits, y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                meter.step_done(loss, len(seeds), sum(b.num_edges for b in blocks), (logits.argmax(1) == y).sum())
            summary = log.add(meter.finish(cached))
            if verbose:
                print(summary.line(), flush=True)
    finally:
        loader.close()
        sampler.close()
        if cached is not None:
            cached.close()
    result = {
        "dataset": args.dataset,
        "device": str(device),
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "model": args.model,
        "num_trainers": world,
        "num_parts": g.get_partition_book().num_partitions,
        "epochs": args.epochs,
        "batches_per_epoch": num_batches,
        **log.result(),
        "cache_gb": args.cache_gb if cached is not None else 0.0,
        "cache_policy": args.cache_policy if cached is not None else None,
        "hot_set": args.hot_set if cached is not None else None,
        "sample_device": args.sample_device,
    }
    if not args.no_eval:
        t = time.perf_counter()
        logits = layerwise_inference(raw_model, g, own, g.ndata["feat"], args.eval_batch_size, device, new_buffer)
        pred = logits.argmax(1)
        truth = label[own]
        counts = []
        for mask_name in ("val_mask", "test_mask"):
            mask = g.ndata[mask_name][own].bool()
            counts += [float((pred[mask] == truth[mask]).sum()), float(mask.sum())]
        counts = all_reduce(counts)
        result["val_acc"] = counts[0] / max(counts[1], 1)
        result["test_acc"] = counts[2] / max(counts[3], 1)
        result["eval_time_s"] = time.perf_counter() - t
    return result


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    job.log_to_stderr()
    if args.local:
        return job.run_local(__file__, argv, args)
    with job.start_trainer(args) as trainer:
        result = run_trainer(trainer, args)
    if trainer.rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
