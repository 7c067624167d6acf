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
sampling / feature fetch / compute), a progress bar on a terminal, and finally
``RESULT {json}`` (:mod:`distgnn.train.result`; bad input: one ``error:`` line,
exit code 2). Validation and test accuracy come from layer-wise inference
over all nodes; ``--select best`` (or ``--patience N``) validates after every epoch and reports the
model of the best validation accuracy (``distgnn.train.selection``). ``--checkpoint-dir D --checkpoint-every N`` saves the model, the
optimizer, the loader's position and the RNG states; ``--resume auto`` continues
from the latest (what ``distgnn-launch --max-restarts`` relies on); ``--run-dir``
writes metrics as JSON lines (``distgnn-report RUN_DIR`` plots them). The job,
dataset, feature-path, epoch-accounting and checkpoint pieces live
in distgnn (``distgnn.train.job``, ``distgnn.data.datasets``, ``distgnn.cache.feature_path``,
``distgnn.train.epoch``, ``distgnn.train.bookkeeping``, ``distgnn.train.inference``); this file is the model and its loop.
"""

from __future__ import annotations

import argparse
import functools
import sys

import torch

from distgnn.cache.feature_path import FeatureOptions, FeaturePath, add_feature_args, check_feature_args
from distgnn.data.datasets import add_dataset_args
from distgnn.launch.cpus import local_world_size
from distgnn.loader.node import DistNodeDataLoader
from distgnn.nn import GAT, MLP, GraphSAGE
from distgnn.partition.prepare import job_partition
from distgnn.sampling.neighbor import NeighborSampler, derive_seed
from distgnn.train import job
from distgnn.train.bookkeeping import Bookkeeper, add_bookkeeping_args, check_bookkeeping_args
from distgnn.train.epoch import TrainingLog, all_reduce
from distgnn.train.inference import accuracy_by_mask, layerwise_inference
from distgnn.train.selection import Selection, add_selection_args, check_selection_args
from distgnn.train.step import TrainStep, add_step_args
from distgnn.train.timeline import add_timeline_args, timeline_from_args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    add_dataset_args(p)
    job.add_job_args(p)
    add_feature_args(p)
    model = p.add_argument_group("model and optimiser")
    model.add_argument("--model", default="sage", choices=("sage", "gat", "mlp"), help="mlp: the graph-free baseline")
    model.add_argument("--fanouts", default="10,10", help="per layer, input layer first; -1 = all neighbours")
    model.add_argument("--batch-size", type=int, default=1000)
    model.add_argument("--eval-batch-size", type=int, default=10000)
    model.add_argument("--lr", type=float, default=0.003)
    model.add_argument("--weight-decay", type=float, default=0.0)
    model.add_argument("--hidden", type=int, default=256)
    model.add_argument("--dropout", type=float, default=0.5)
    model.add_argument("--heads", type=int, default=4, help="gat: attention heads")
    add_step_args(p)
    add_bookkeeping_args(p)
    add_selection_args(p, "accuracy")
    add_timeline_args(p)
    args = p.parse_args(argv)
    args.fanouts = [int(f) for f in str(args.fanouts).split(",") if f.strip()]
    check_feature_args(p, args, local_world_size())  # the trainers on this host (torchrun's count)
    check_bookkeeping_args(p, args)
    check_selection_args(p, args)
    if args.checkpoint_dir and args.pipeline:
        p.error("--checkpoint-dir and --pipeline exclude each other: the pipeline takes a batch ahead of the step")
    return args


def build_model(args: argparse.Namespace, in_feats: int, num_classes: int) -> torch.nn.Module:
    num_layers = len(args.fanouts)
    if args.model == "mlp":
        return MLP(in_feats, args.hidden, num_classes, num_layers, args.dropout)
    if args.model == "gat":
        return GAT(in_feats, args.hidden, num_classes, num_layers, args.heads, args.dropout)
    return GraphSAGE(in_feats, args.hidden, num_classes, num_layers, args.dropout)


def run_trainer(trainer: job.Trainer, args: argparse.Namespace) -> dict:
    """Train and evaluate on ``trainer.g``; the same code for a DistGraph and an InProcessGraph."""
    g, device = trainer.g, trainer.device
    train_nids = trainer.seeds("train_mask")
    own = trainer.inference_nodes()
    local_max = int(g.ndata["label"][own].max()) if len(own) else 0
    num_classes = int(all_reduce([local_max], "max")[0]) + 1

    torch.manual_seed(args.seed)  # identical initial weights everywhere (rank 0's are broadcast anyway)
    raw_model = build_model(args, int(g.ndata["feat"].shape[1]), num_classes).to(device)
    # Several trainers: the captured step syncs gradients itself; the eager one wraps the model in DDP.
    step = TrainStep(raw_model, args.step, args.batch_size, args.fanouts, device, distributed=trainer.world_size > 1)
    torch.manual_seed(derive_seed(args.seed, trainer.rank, 1))  # dropout differs per trainer, fixed per run
    model = step.model
    # On a GPU the fused Adam updates every parameter in one kernel (the step is launch-bound at these sizes);
    # a step replayed from a CUDA graph needs it capturable (its step count on the device).
    fused = {"fused": True, "capturable": step.graphed} if device.type == "cuda" else {}
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, **fused)
    step.optimizer = optimizer
    options = FeatureOptions.from_args(args)
    sampler = NeighborSampler(args.fanouts, **options.sampler_kwargs(device))
    features = FeaturePath(
        g,
        device,
        options,
        seeds=train_nids,
        sampler=sampler,
        batch_size=args.batch_size,
        seed=args.seed,
        rank=trainer.rank,
        machine_group=trainer.machine_group,
        prefetching=bool(args.prefetch or args.num_workers),
        first_layer_mean=args.model == "sage",
    )
    loader = DistNodeDataLoader(
        g,
        train_nids,
        sampler,
        args.batch_size,
        shuffle=True,
        num_workers=args.num_workers,
        prefetch=args.prefetch,
        seed=args.seed,
        **features.loader_kwargs(),
    )
    batches = features.batches(loader)
    num_batches = len(loader) if not args.max_batches else min(len(loader), args.max_batches)
    log = TrainingLog()
    timeline = timeline_from_args(args, device, trainer.rank)

    def evaluate() -> dict[str, float]:
        """Validation and test accuracy from layer-wise inference over all nodes (collective)."""
        logits = layerwise_inference(
            raw_model, g, own, g.ndata["feat"], args.eval_batch_size, device, trainer.new_buffer, features.cached
        )
        masks = {name: g.ndata[f"{name}_mask"][own] for name in ("val", "test")}
        accuracy = accuracy_by_mask(logits, g.ndata["label"][own], masks)
        return {"val_acc": accuracy["val"], "test_acc": accuracy["test"]}

    selection = Selection(args, "acc", True, raw_model, evaluate)
    try:
        books = Bookkeeper(args, g, model=model, optimizer=optimizer, loader=loader, batches_per_epoch=num_batches)
        with books:  # resumes from --resume; saves and logs as the flags ask
            for epoch in books.epochs(args.epochs):
                model.train()
                meter = books.meter(epoch, device, trainer.show_progress, timeline)  # fewer batches when resumed
                # In graph mode the cache gathers each batch's features straight into the graph's input buffer.
                inputs = functools.partial(features.inputs, rows=step.input_rows)
                # Across GPUs in graph mode every trainer must replay the graph's all-reduce equally often.
                with step.epoch(books.batches_in(epoch)):
                    for (_, seeds, blocks), x, y in meter.steps(batches, inputs):
                        loss, correct = step(blocks, x, y, meter.mark)
                        edges = sum(b.num_edges for b in blocks)
                        meter.step_done(loss, len(seeds), edges, correct)
                        books.step_done(epoch, loss)
                summary = log.add(meter.finish(features.cached))
                books.epoch_done(summary)
                if trainer.rank == 0:
                    print(summary.line(), flush=True)
                if selection.epoch_done(epoch):
                    break
    finally:
        loader.close()
        sampler.close()
        features.close()
        if timeline is not None:
            timeline.close()  # writes the trace, if any
            timeline.write_json(step=step.mode, prefetch=args.prefetch, rank=trainer.rank)
    result = {
        **trainer.result_fields(args, num_batches),
        "model": args.model,
        "step": step.mode,
        **log.result(),
        **features.result_fields(),
    }
    if not args.no_eval:
        result.update(selection.result())
    return result


def main(argv: list[str] | None = None) -> int:
    # Partitions on the first --local run.
    return job.main(__file__, argv, parse_args, job_partition, run_trainer, kind="node")


if __name__ == "__main__":
    sys.exit(main())
