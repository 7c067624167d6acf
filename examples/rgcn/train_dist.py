"""Distributed R-GCN node classification on a heterogeneous graph with distgnn.

One node type (``--target-ntype``, by default the one with labels) is classified; its features are
projected, and every node type without features gets a learnable embedding (a DistEmbedding trained by
distgnn's SparseAdam or SparseAdagrad). Sampling is typed: ``--fanouts`` neighbours per edge type per layer.

Run it like the GraphSAGE example: ``--local`` (the whole job on this host, partitioning on the fly),
no flag (one trainer of a job started by ``distgnn-launch``), or ``--single`` (the same loop in one process).
``--dataset synthetic-mag`` (``--num-papers``) or ``chunked:PATH/metadata.json`` (DGL's chunked format,
the target type's ``feat``, ``label``, ``train_mask``, ``val_mask``, ``test_mask``). ``--model mlp`` is the
graph-free baseline (the target type's own features only). Validation and test accuracy come from sampled
mini-batch inference over each trainer's share of the held-out nodes (``--eval sampled``, as DGL's example
does), or from layer-wise inference over every node with all neighbours (``--eval layerwise``); ``--select
best`` (or ``--patience N``) validates after every epoch and reports the model of the best validation accuracy.
Rank 0 prints ``RESULT {json}``. ``--checkpoint-dir D --checkpoint-every N`` saves the model, the optimizers, the
node embeddings with their sparse optimizer state, the loader's position and the RNG states; ``--resume auto``
continues from the latest (what ``distgnn-launch --max-restarts`` relies on). ``--run-dir`` writes metrics
as JSON lines (``distgnn-report RUN_DIR`` plots them).
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch import nn

from distgnn.data.datasets import add_dataset_args
from distgnn.errors import ConfigError
from distgnn.loader.node import DistNodeDataLoader
from distgnn.nn import RGCN, TypedInput
from distgnn.partition.prepare import job_partition
from distgnn.sampling.neighbor import NeighborSampler, add_sampling_args
from distgnn.train import job
from distgnn.train.bookkeeping import Bookkeeper, add_bookkeeping_args, check_bookkeeping_args
from distgnn.train.epoch import TrainingLog, all_reduce
from distgnn.train.grad_sync import EagerSync
from distgnn.train.inference import layerwise_inference, typed_input_rows
from distgnn.train.selection import Selection, add_selection_args, check_selection_args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    add_dataset_args(p)
    job.add_job_args(p, epochs=5)
    p.set_defaults(dataset="synthetic-mag", feat_dim=64, synthetic_classes=8)
    p.add_argument("--target-ntype", help="node type to classify (default: the one with a 'label')")
    p.add_argument("--fanouts", default="10,10", help="neighbours per edge type per layer, input layer first")
    p.add_argument("--eval-fanouts", help="fanouts of the evaluation (default: --fanouts)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--eval-batch-size", type=int, default=4096)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--sparse-lr", type=float, default=0.05, help="learning rate of the node embeddings")
    p.add_argument("--sparse-optimizer", default="adam", choices=("adam", "adagrad"))
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--num-bases", type=int, default=2, help="R-GCN basis decomposition (0: one per relation)")
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--model", default="rgcn", choices=("rgcn", "mlp"))
    p.add_argument("--eval", default="sampled", choices=("sampled", "layerwise"))
    add_sampling_args(p)
    add_bookkeeping_args(p)
    add_selection_args(p, "accuracy")
    args = p.parse_args(argv)
    check_bookkeeping_args(p, args)
    check_selection_args(p, args)
    if args.sample_device == "cuda" and (args.device != "cuda" or args.num_workers):
        p.error("--sample-device cuda needs --device cuda and --num-workers 0")
    return args


class Net(nn.Module):
    """Typed inputs, then the R-GCN stack; or, as the baseline, an MLP on the target nodes' features."""

    def __init__(self, g, args: argparse.Namespace, target: str, num_classes: int):
        super().__init__()
        self.target = target
        self.mlp_only = args.model == "mlp"
        self.inputs = TypedInput(g, args.hidden)
        num_rels = len(g.canonical_etypes)
        num_layers = len(args.fanouts.split(","))
        if self.mlp_only:
            self.head = nn.Sequential(nn.ReLU(), nn.Dropout(args.dropout), nn.Linear(args.hidden, num_classes))
        else:
            bases = args.num_bases or None
            self.head = RGCN(args.hidden, args.hidden, num_classes, num_rels, num_layers, bases, args.dropout)

    def forward(self, input_nodes, output_nodes, blocks, device) -> torch.Tensor:
        if self.mlp_only:
            ids = output_nodes[self.target]
            feats = self.inputs.features[self.target][ids.cpu()].to(device, torch.float32)
            return self.head(self.inputs.projections[self.target](feats))
        return self.head(blocks, self.inputs(input_nodes, blocks[0].src_ntypes, device))


def target_ntype(g, requested: str | None) -> str:
    labelled = [t for t in g.ntypes if "label" in g.nodes[t].data]
    target = requested or (labelled[0] if len(labelled) == 1 else None)
    if target is None or target not in labelled:
        raise ConfigError(f"--target-ntype must name a node type with a 'label'; labelled types: {labelled}")
    for name in ("feat", "train_mask", "val_mask", "test_mask"):
        if name not in g.nodes[target].data:
            raise ConfigError(f"node type {target!r} has no {name!r} (has {sorted(g.nodes[target].data)})")
    return target


def evaluate(net: Net, trainer: job.Trainer, target: str, fanouts: list[int], args) -> tuple[float, float]:
    """Accuracy on the validation and test nodes, every trainer scoring its share (collective)."""
    net.eval()
    sampler = NeighborSampler(fanouts)
    label = trainer.g.nodes[target].data["label"]
    counts = []
    with torch.no_grad():
        for mask_name in ("val_mask", "test_mask"):
            seeds = {target: trainer.seeds(mask_name, target)}
            loader = DistNodeDataLoader(
                trainer.g, seeds, sampler, args.eval_batch_size, device=trainer.device, seed=args.seed + 1
            )
            correct = total = 0
            for input_nodes, output_nodes, blocks in loader:
                logits = net(input_nodes, output_nodes, blocks, trainer.device)
                truth = label[output_nodes[target].cpu()].to(trainer.device)
                correct += int((logits.argmax(1) == truth).sum())
                total += len(truth)
            loader.close()
            counts += [correct, total]
    counts = all_reduce([float(c) for c in counts])
    return counts[0] / max(counts[1], 1), counts[2] / max(counts[3], 1)


def evaluate_layerwise(net: Net, trainer: job.Trainer, target: str, args) -> tuple[float, float]:
    """Accuracy from every node's output, one layer at a time with all neighbours (collective)."""
    g, device = trainer.g, trainer.device
    nodes = trainer.inference_nodes()
    rows = typed_input_rows(g, net.inputs, device)
    with torch.no_grad():
        logits = layerwise_inference(net.head, g, nodes, rows, args.eval_batch_size, device, trainer.new_buffer)
    types, per_type = g.get_partition_book().map_to_per_ntype(nodes)
    mine = types == g.ntypes.index(target)
    ids, pred = per_type[mine], logits[mine].argmax(1)
    truth = g.nodes[target].data["label"][ids]
    counts = []
    for mask_name in ("val_mask", "test_mask"):
        mask = torch.as_tensor(g.nodes[target].data[mask_name][ids]).bool()
        counts += [float((pred[mask] == truth[mask]).sum()), float(mask.sum())]
    counts = all_reduce(counts)
    return counts[0] / max(counts[1], 1), counts[2] / max(counts[3], 1)


def run_trainer(trainer: job.Trainer, args: argparse.Namespace) -> dict:
    g, device = trainer.g, trainer.device
    target = target_ntype(g, args.target_ntype)
    num_classes = (
        int(all_reduce([float(g.nodes[target].data["label"][torch.arange(g.num_nodes(target))].max())], "max")[0]) + 1
    )
    torch.manual_seed(args.seed)
    net = Net(g, args, target, num_classes).to(device)
    dense = [p for name, p in net.named_parameters() if not name.startswith("inputs.local_embeddings")]
    # Several trainers average the dense gradients: one flat buffer and one all-reduce on GPUs (the typed step
    # sizes its relation groups on the host: not captured), DDP on CPUs (the MLP leaves other types' projections out).
    sync = EagerSync(net, dense, trainer.distributed, find_unused_parameters=net.mlp_only)
    model = sync.model
    optimizer = torch.optim.Adam(dense, lr=args.lr)
    sparse = None if args.model == "mlp" else net.inputs.sparse_optimizer(args.sparse_optimizer, args.sparse_lr)
    optimizers = [optimizer, *([sparse] if sparse else [])]
    fanouts = [int(f) for f in args.fanouts.split(",")]
    sampler = NeighborSampler(
        fanouts, device=device if args.sample_device == "cuda" else None, structure=args.structure
    )
    loader = DistNodeDataLoader(
        g,
        {target: trainer.seeds("train_mask", target)},
        sampler,
        args.batch_size,
        shuffle=True,
        drop_last=False,
        num_workers=args.num_workers,
        prefetch=args.prefetch,
        device=device,
        seed=args.seed,
    )
    label = g.nodes[target].data["label"]
    num_batches = len(loader) if not args.max_batches else min(len(loader), args.max_batches)

    def inputs(batch):
        input_nodes, output_nodes, _ = batch
        return batch, None, label[output_nodes[target].cpu()].to(device)

    def figures() -> dict[str, float]:
        if args.eval == "layerwise" and args.model == "rgcn":
            val_acc, test_acc = evaluate_layerwise(net, trainer, target, args)
        else:
            eval_fanouts = [int(f) for f in (args.eval_fanouts or args.fanouts).split(",")]
            val_acc, test_acc = evaluate(net, trainer, target, eval_fanouts, args)
        return {"val_acc": val_acc, "test_acc": test_acc}

    selection = Selection(args, "acc", True, net, figures)
    log = TrainingLog()
    try:
        books = Bookkeeper(
            args,
            g,
            model=model,
            optimizer=optimizer,
            loader=loader,
            batches_per_epoch=num_batches,
            sparse_optimizers=[sparse] if sparse else [],  # with their embeddings
        )
        with books:  # resumes from --resume; saves and logs as the flags ask
            for epoch in books.epochs(args.epochs):
                net.train()
                meter = books.meter(epoch, device, trainer.show_progress)  # fewer batches in a resumed epoch
                with sync.epoch(books.batches_in(epoch), optimizer):  # every trainer averages equally often
                    for (input_nodes, output_nodes, blocks), _, y in meter.steps(loader, inputs):
                        logits = model(input_nodes, output_nodes, blocks, device)
                        loss = F.cross_entropy(logits, y)
                        meter.mark("forward")
                        sync.step(loss, optimizers, meter.mark)
                        correct = (logits.argmax(1) == y).sum()
                        meter.step_done(loss, len(y), sum(b.num_edges for b in blocks), correct)
                        books.step_done(epoch, loss)
                summary = log.add(meter.finish())
                books.epoch_done(summary)
                if trainer.rank == 0:
                    print(summary.line(), flush=True)
                if selection.epoch_done(epoch):
                    break
    finally:
        loader.close()
        sampler.close()
    result = {**trainer.result_fields(args, num_batches), "model": args.model, "target_ntype": target, **log.result()}
    if not args.no_eval:
        result.update(selection.result())
    return result


def main(argv: list[str] | None = None) -> int:
    # Partitions on the first --local run.
    return job.main(__file__, argv, parse_args, job_partition, run_trainer, kind="node")


if __name__ == "__main__":
    sys.exit(main())
