"""Distributed GraphSAGE link prediction with distgnn.

The dataset's undirected pairs are split (``--val-fraction`` / ``--test-fraction`` held out, both directions
removed from the training graph, fixed by ``--seed``); the model learns to score the training edges above negative
pairs (``--neg-sampler``, ``--num-negs`` per edge), never seeing the edge it scores (``--exclude``). Evaluation
scores every held-out pair against the same ``--eval-negatives`` random destinations, with embeddings from
layer-wise inference; each trainer scores its share of the pairs, MRR, hits@k and AUC are over all of them.
Job flags as in every example (``--local`` splits and partitions the training graph once into ``--workdir``).

On a typed graph (``--dataset synthetic-mag`` or ``chunked:...``) ``--target-etype src:rel:dst`` names the edge
type to predict: a fraction of its edges is held out (their reverse-type twins, ``--reverse-etype`` or
synthetic-mag's own, leave the training graph too), negatives are nodes of its destination type, the model is an
R-GCN over typed inputs, and held-out pairs are scored from sampled blocks (``--exclude reverse_id`` means
``reverse_types``).

Rank 0 prints a line per epoch and ``RESULT {json}``; ``--select best`` (or ``--patience N``) reports the model of
the best validation MRR; checkpoints hold the model, the optimizers, a typed graph's embeddings, the loader's
position and the RNG states. Split, evaluation and checkpoints live in distgnn; this file is the models and loop.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
from torch import nn

import distgnn
from distgnn.data.datasets import add_dataset_args, add_link_split_args, link_reverse_etype, load_link_split
from distgnn.data.hetero import CanonicalEtype, etype_str, parse_etype
from distgnn.data.link_split import load_link_partition
from distgnn.loader.edge import DistEdgeDataLoader
from distgnn.nn import (
    RGCN,
    DotPredictor,
    GraphSAGE,
    MLPPredictor,
    TypedInput,
    TypedPredictor,
    bce_loss,
    margin_loss,
    score_pairs,
)
from distgnn.partition.prepare import link_job_partition
from distgnn.sampling.negative import SAMPLERS, negative_sampler
from distgnn.sampling.neighbor import NeighborSampler, derive_seed
from distgnn.train import job
from distgnn.train.bookkeeping import Bookkeeper, add_bookkeeping_args, check_bookkeeping_args
from distgnn.train.epoch import TrainingLog
from distgnn.train.evaluation import held_out_metrics
from distgnn.train.grad_sync import EagerSync
from distgnn.train.inference import embedding_lookup, sampled_embedding_lookup
from distgnn.train.selection import Selection, add_selection_args, check_selection_args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    add_dataset_args(p)
    job.add_job_args(p, epochs=20)
    p.set_defaults(workdir=".work/link")
    link = p.add_argument_group("link prediction")
    link.add_argument("--fanouts", default="10,10", help="per layer, input layer first; -1 = all neighbours")
    link.add_argument("--batch-size", type=int, default=512, help="positive edges per batch")
    link.add_argument("--eval-batch-size", type=int, default=10000)
    link.add_argument("--lr", type=float, default=0.005)
    link.add_argument("--hidden", type=int, default=128, help="hidden and embedding width")
    link.add_argument("--dropout", type=float, default=0.2)
    link.add_argument("--neg-sampler", default="uniform", choices=sorted(SAMPLERS))
    link.add_argument("--num-negs", type=int, default=1, help="negatives per positive edge (per source: per_source)")
    link.add_argument("--exclude", default="reverse_id", choices=("reverse_id", "self", "none"))
    link.add_argument("--predictor", default="dot", choices=("dot", "mlp"))
    link.add_argument("--loss", default="bce", choices=("bce", "margin"))
    link.add_argument("--sparse-lr", type=float, default=0.01, help="learning rate of a typed graph's node embeddings")
    add_link_split_args(p)
    add_bookkeeping_args(p)
    add_selection_args(p, "MRR")
    args = p.parse_args(argv)
    check_bookkeeping_args(p, args)
    check_selection_args(p, args)
    args.fanouts = [int(f) for f in str(args.fanouts).split(",") if f.strip()]
    if args.loss == "margin" and args.neg_sampler == "per_source":
        p.error("--loss margin pairs each edge with its own negatives; per_source negatives are shared (use bce)")
    negative_sampler(args.neg_sampler, args.num_negs)  # a bad k fails here, before any process starts
    return args


class LinkModel(nn.Module):
    """A GraphSAGE encoder to ``hidden``-wide embeddings and a pair scorer, trained as one module."""

    def __init__(self, args: argparse.Namespace, in_feats: int):
        super().__init__()
        self.encoder = GraphSAGE(in_feats, args.hidden, args.hidden, len(args.fanouts), args.dropout)
        self.predictor = DotPredictor() if args.predictor == "dot" else MLPPredictor(args.hidden, args.hidden)

    def forward(self, x, blocks, pos, neg) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.encoder(blocks, x)
        return score_pairs(self.predictor, h, pos), score_pairs(self.predictor, h, neg)


class TypedLinkModel(nn.Module):
    """Typed inputs, an R-GCN encoder to ``hidden``-wide embeddings, and a scorer of the target edge type."""

    def __init__(self, g, args: argparse.Namespace, target: CanonicalEtype):
        super().__init__()
        self.inputs = TypedInput(g, args.hidden)
        num_rels = len(g.canonical_etypes)
        self.encoder = RGCN(args.hidden, args.hidden, args.hidden, num_rels, len(args.fanouts), dropout=args.dropout)
        make = DotPredictor if args.predictor == "dot" else (lambda: MLPPredictor(args.hidden, args.hidden))
        self.scorer = TypedPredictor([target], make)
        self.target = target

    @property
    def predictor(self) -> nn.Module:
        """The target type's pair scorer (for the held-out pairs)."""
        return self.scorer.predictors[etype_str(self.target)]

    def embed(self, input_nodes: dict[str, torch.Tensor], blocks) -> torch.Tensor:
        device = blocks[0].indptr.device
        return self.encoder(blocks, self.inputs(input_nodes, blocks[0].src_ntypes, device))

    def forward(self, input_nodes, blocks, pos, neg):
        h = self.embed(input_nodes, blocks)
        return self.scorer(h, pos), self.scorer(h, neg)


def run_trainer(trainer: job.Trainer, args: argparse.Namespace) -> dict:
    """Train and evaluate on ``trainer.g``: GraphSAGE on a homogeneous graph, R-GCN with ``--target-etype``."""
    g, device, rank, world = trainer.g, trainer.device, trainer.rank, trainer.world_size
    book = g.get_partition_book()
    torch.manual_seed(args.seed)  # identical initial weights everywhere
    exclude = None if args.exclude == "none" else args.exclude
    if args.target_etype:
        target = book.to_canonical_etype(parse_etype(args.target_etype))
        reverse = link_reverse_etype(args, target)
        if exclude == "reverse_id":
            exclude = "reverse_types" if reverse is not None else "self"
        raw = TypedLinkModel(g, args, target).to(device)
        loader_args = {"reverse_etypes": {target: reverse} if exclude == "reverse_types" else None}
    else:
        target = None
        raw = LinkModel(args, int(g.ndata["feat"].shape[1])).to(device)
        # reverse_id excludes g.edata["reverse_eid"]; in the background the loader fetches the features too.
        loader_args = {"input_feats": ("feat",) if args.prefetch or args.num_workers else ()}
    seeds = torch.arange(g.num_edges(target))  # this trainer's share of the (target type's) edges, its own first
    if trainer.distributed:
        seeds = distgnn.edge_split(np.ones(len(seeds), bool), book, force_even=True, etype=target)
    torch.manual_seed(derive_seed(args.seed, rank, 1))  # dropout differs per trainer, fixed per run
    dense = [p for name, p in raw.named_parameters() if not name.startswith("inputs.local_embeddings")]
    # Several trainers average the dense gradients: one flat buffer and one all-reduce on GPUs, DDP on CPUs.
    sync = EagerSync(raw, dense, world > 1)
    model = sync.model
    optimizer = torch.optim.Adam(dense, lr=args.lr)
    sparse = raw.inputs.sparse_optimizer("adam", args.sparse_lr) if target else None
    optimizers = [optimizer, *([sparse] if sparse else [])]
    loss_fn = bce_loss if args.loss == "bce" else margin_loss
    loader = DistEdgeDataLoader(
        g,
        {target: seeds} if target else seeds,
        NeighborSampler(args.fanouts),
        negative_sampler(args.neg_sampler, args.num_negs),
        exclude=exclude,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.num_workers,
        prefetch=args.prefetch,
        device=device,
        seed=args.seed,
        **loader_args,
    )
    num_batches = len(loader) if not args.max_batches else min(len(loader), args.max_batches)

    def inputs(batch):
        """The model's input: the typed loader's input nodes, or their features (the loader's, if it fetched)."""
        if target:
            return batch, batch[0], None
        x = batch.input_data.get("feat")
        return batch, g.ndata["feat"][batch[0].cpu()].to(device) if x is None else x, None

    def evaluate() -> dict[str, float]:
        raw.eval()
        if target:  # an R-GCN over typed inputs has no layer-wise form here: each step's nodes are sampled
            embed = sampled_embedding_lookup(raw.embed, g, args.fanouts, args.seed, device)
        else:
            nodes, feat = trainer.inference_nodes(), g.ndata["feat"]
            embed = embedding_lookup(raw.encoder, g, nodes, feat, args.eval_batch_size, device, trainer.new_buffer)
        # The held-out pairs: written beside the partition, or split again (the same, by seed) with --single.
        held_out = load_link_partition(g.part_config) if trainer.distributed else load_link_split(args).held_out()
        return held_out_metrics(embed, raw.predictor, held_out, rank, world, args.eval_batch_size)

    selection = Selection(args, "mrr", True, raw, evaluate)
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
                model.train()
                meter = books.meter(epoch, device, trainer.show_progress)  # fewer batches in a resumed epoch
                with sync.epoch(books.batches_in(epoch), optimizer):  # every trainer averages equally often
                    for (_, pos, neg, blocks), x, _ in meter.steps(loader, inputs):
                        loss = loss_fn(*model(x, blocks, pos, neg))
                        meter.mark("forward")
                        sync.step(loss, optimizers, meter.mark)
                        positives = pos[target].num_edges if target else pos.num_edges
                        meter.step_done(loss, positives, sum(b.num_edges for b in blocks))
                        books.step_done(epoch, loss)
                summary = log.add(meter.finish())
                books.epoch_done(summary)
                if rank == 0:
                    print(summary.line(), flush=True)
                if selection.epoch_done(epoch):
                    break
    finally:
        loader.close()
    result = {
        **trainer.result_fields(args, num_batches),
        **({"target_etype": etype_str(target)} if target else {}),
        "neg_sampler": args.neg_sampler,
        "num_negs": args.num_negs,
        "exclude": exclude or "none",
        "predictor": args.predictor,
        "loss": args.loss,
        **log.result(),
    }
    if not args.no_eval:
        result.update(selection.result())
    return result


def main(argv: list[str] | None = None) -> int:
    train_graph = lambda args: load_link_split(args).train  # noqa: E731  (--single trains on the split's graph)
    return job.main(__file__, argv, parse_args, link_job_partition, run_trainer, train_graph, kind="link")


if __name__ == "__main__":
    sys.exit(main())
