"""Distributed GraphSAGE link prediction with distgnn and torch DDP.

The dataset's undirected pairs are split (``--val-fraction`` / ``--test-fraction`` held out, both
directions removed from the training graph, fixed by ``--seed``); the model learns to score the
training edges above negative pairs (``--neg-sampler``, ``--num-negs`` per edge), never seeing the
edge it scores (``--exclude``). Evaluation scores every held-out pair against the same
``--eval-negatives`` random destinations, with embeddings from layer-wise inference: each trainer
scores its share of the pairs; MRR, hits@k and AUC are over all of them.

* ``--local``: the whole job on this host: split and partition the training graph into
  ``--workdir`` (reused when there), start a LocalCluster, spawn the trainers, stop everything.
* no flag: one trainer of a job started by ``distgnn-launch`` (or by ``--local``) on a partition
  written by :func:`distgnn.data.link_split.partition_link_split`.
* ``--single``: the same loader, model and evaluation on the whole training graph in this process.

On a heterogeneous graph (``--dataset synthetic-mag`` or ``chunked:...``) ``--target-etype src:rel:dst``
names the edge type to predict: a fraction of its edges is held out (directed pairs; their twins of the
reverse type, ``--reverse-etype`` or synthetic-mag's own, leave the training graph too), evaluation
negatives are nodes of its destination type, and the model is an R-GCN over typed inputs (projected
features, learnable embeddings for featureless types) with a scorer for that edge type. ``--exclude
reverse_id`` then means ``reverse_types`` (``self`` where the type has no reverse); held-out pairs are
scored from sampled blocks (``--fanouts``) rather than layer-wise inference.

Rank 0 prints one line per epoch and finally ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import distgnn
from distgnn import job
from distgnn.data.hetero import HeteroGraph, etype_str, parse_etype
from distgnn.data.link_split import (
    HELD_OUT,
    LINK_DIR,
    load_held_out,
    load_link_partition,
    partition_link_split,
    reverse_edge_ids,
    split_links,
    to_partition_ids,
)
from distgnn.data.synthetic_mag import REVERSE_ETYPES
from distgnn.datasets import DatasetSpec, add_dataset_args, graph_name, load_dataset
from distgnn.edge_dataloader import DistEdgeDataLoader
from distgnn.errors import ConfigError
from distgnn.evaluation import dist_link_metrics
from distgnn.inference import layerwise_inference
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
from distgnn.sampling.negative import SAMPLERS, negative_sampler
from distgnn.sampling.neighbor import InProcessGraph, NeighborSampler, derive_seed, split_by_type


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
    link.add_argument("--val-fraction", type=float, default=0.05)
    link.add_argument("--test-fraction", type=float, default=0.1)
    link.add_argument("--eval-negatives", type=int, default=100, help="negatives per held-out pair (fixed by seed)")
    link.add_argument("--no-eval", action="store_true", help="skip the final evaluation")
    typed = p.add_argument_group("heterogeneous graphs")
    typed.add_argument("--target-etype", help="edge type to predict, src:rel:dst (a typed dataset needs it)")
    typed.add_argument("--reverse-etype", help="its reverse edge type (default: synthetic-mag's, if any)")
    typed.add_argument("--sparse-lr", type=float, default=0.01, help="learning rate of the node embeddings")
    args = p.parse_args(argv)
    args.fanouts = [int(f) for f in str(args.fanouts).split(",") if f.strip()]
    if args.loss == "margin" and args.neg_sampler == "per_source":
        p.error("--loss margin pairs each edge with its own negatives; per_source negatives are shared (use bce)")
    sampler = negative_sampler(args.neg_sampler, args.num_negs)  # a bad k fails here, before any process starts
    if args.target_etype:
        if not sampler.typed:
            p.error(f"--neg-sampler {args.neg_sampler} does not sample typed negatives; use uniform or per_source")
        for flag in ("target_etype", "reverse_etype"):
            if getattr(args, flag) is not None and len(getattr(args, flag).split(":")) != 3:
                p.error(
                    f"--{flag.replace('_', '-')} must be a canonical edge type src:rel:dst, got {getattr(args, flag)!r}"
                )
    return args


# -- data -------------------------------------------------------------------------------------------


def link_split(args: argparse.Namespace):
    """The split, its training graph carrying each edge's reverse as the edge array ``reverse_eid`` (where
    ``exclude="reverse_id"`` looks, in-process and, renumbered by the partitioner, in a partition)."""
    spec = DatasetSpec.from_args(args)
    graph = load_dataset(spec)
    split = split_links(graph, args.val_fraction, args.test_fraction, args.eval_negatives, seed=args.seed)
    split.train.edata["reverse_eid"] = reverse_edge_ids(split.train.src, split.train.dst)
    return split


def prepare_local(args: argparse.Namespace) -> None:
    """Split and partition the training graph where the local runner looks for the partition (reused when there)."""
    name = graph_name(DatasetSpec.from_args(args))
    tag = f"v{args.val_fraction:g}-t{args.test_fraction:g}-k{args.eval_negatives}-s{args.seed}"
    if args.target_etype:
        tag += "-" + args.target_etype.replace(":", "_") + (f"-r{args.reverse_etype}" if args.reverse_etype else "")
    args.workdir = str(Path(args.workdir) / f"split-{tag}")
    out_dir = Path(args.workdir) / f"{name}-{args.part_method}-{args.num_parts}"
    json_path = out_dir / f"{name}.json"
    if args.target_etype:
        if not (json_path.exists() and (out_dir / LINK_DIR / f"{HELD_OUT[-1]}.npy").exists()):
            partition_typed_link_split(args, out_dir, name)
        return
    if json_path.exists() and "reverse_eid" in json.loads(json_path.read_text()).get("edge_feats", {}):
        return
    partition_link_split(link_split(args), args.num_parts, out_dir, name, args.part_method, args.seed)


def reverse_etype_of(args: argparse.Namespace, target: tuple[str, str, str]) -> tuple[str, str, str] | None:
    """``--reverse-etype``, or synthetic-mag's reverse of ``target`` (either way round), or None."""
    if args.reverse_etype:
        return parse_etype(args.reverse_etype)
    if DatasetSpec.from_args(args).kind != "synthetic-mag":
        return None
    pairs = {**REVERSE_ETYPES, **{v: k for k, v in REVERSE_ETYPES.items()}}
    return pairs.get(target)


def typed_link_split(args: argparse.Namespace) -> tuple[HeteroGraph, dict[str, np.ndarray]]:
    """The training graph without the held-out ``--target-etype`` edges (nor their reverse-type twins), and
    the held-out arrays (:data:`HELD_OUT`) in the graph's homogeneous ids (types one after the other)."""
    graph = load_dataset(DatasetSpec.from_args(args))
    if not isinstance(graph, HeteroGraph) or graph.is_homogeneous:
        raise ConfigError(f"--target-etype needs a heterogeneous dataset; {args.dataset} has one edge type")
    target = parse_etype(args.target_etype)
    reverse = reverse_etype_of(args, target)
    for etype in (target, reverse):
        if etype is not None and etype not in graph.canonical_etypes:
            raise ConfigError(f"no edge type {etype_str(etype)} in {args.dataset}; it has {graph.canonical_etypes}")
    if reverse is not None and (reverse[0], reverse[2]) != (target[2], target[0]):
        raise ConfigError(f"--reverse-etype {etype_str(reverse)} does not lead back along {etype_str(target)}")
    src, dst = (np.asarray(a, dtype=np.int64) for a in graph.edges[target])
    n_dst = graph.num_nodes[target[2]]
    keys = np.unique(src * n_dst + dst)  # directed pairs, repeats once
    rng = np.random.default_rng(args.seed)
    keys = keys[rng.permutation(len(keys))]
    num_val, num_test = int(len(keys) * args.val_fraction), int(len(keys) * args.test_fraction)
    held = keys[: num_val + num_test]
    edges = dict(graph.edges)
    keep = ~np.isin(src * n_dst + dst, held)
    edges[target] = (src[keep], dst[keep])
    if reverse is not None:
        rsrc, rdst = (np.asarray(a, dtype=np.int64) for a in graph.edges[reverse])
        keep = ~np.isin(rdst * n_dst + rsrc, held)
        edges[reverse] = (rsrc[keep], rdst[keep])
    # Edge arrays of the thinned types would no longer line up with their edges: only the others stay.
    edata = {e: arrays for e, arrays in graph.edata.items() if e not in (target, reverse)}
    train = HeteroGraph(graph.name, graph.num_nodes, edges, graph.ndata, edata, graph.num_classes)
    offsets = graph.node_offsets()
    pairs = np.stack([held // n_dst + offsets[target[0]], held % n_dst + offsets[target[2]]], axis=1)
    negatives = rng.integers(0, n_dst, size=(len(held), args.eval_negatives), dtype=np.int64) + offsets[target[2]]
    held_out = {
        "val_pairs": pairs[:num_val],
        "val_negatives": negatives[:num_val],
        "test_pairs": pairs[num_val:],
        "test_negatives": negatives[num_val:],
    }
    return train, held_out


def partition_typed_link_split(args: argparse.Namespace, out_dir: Path, name: str) -> None:
    """Partition the typed training graph and write the held-out arrays, in the partition's new ids, beside it."""
    from distgnn.partition import partition_graph
    from distgnn.partition.format import load_orig_ids, read_meta

    train, held_out = typed_link_split(args)
    json_path = partition_graph(
        train, args.num_parts, out_dir, graph_name=name, method=args.part_method, seed=args.seed, overwrite=True
    )
    orig_nid, _ = load_orig_ids(read_meta(Path(json_path)), mmap=False)
    link_dir = Path(json_path).parent / LINK_DIR
    link_dir.mkdir(parents=True, exist_ok=True)
    for key, arr in held_out.items():
        np.save(link_dir / f"{key}.npy", to_partition_ids(orig_nid, arr), allow_pickle=False)


# -- model ------------------------------------------------------------------------------------------


class LinkModel(nn.Module):
    """A GraphSAGE encoder to ``hidden``-wide embeddings and a pair scorer, trained as one module (DDP)."""

    def __init__(self, args: argparse.Namespace, in_feats: int):
        super().__init__()
        self.encoder = GraphSAGE(in_feats, args.hidden, args.hidden, len(args.fanouts), args.dropout)
        self.predictor = DotPredictor() if args.predictor == "dot" else MLPPredictor(args.hidden, args.hidden)

    def forward(self, blocks, x, pos, neg) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.encoder(blocks, x)
        return score_pairs(self.predictor, h, pos), score_pairs(self.predictor, h, neg)


def all_reduce(values: list[float], op=None) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return t.tolist()


def evaluate(raw: LinkModel, trainer: job.Trainer, args, held_out: dict[str, np.ndarray]) -> dict:
    """Validation and test metrics from layer-wise inference embeddings (collective)."""
    g, device = trainer.g, trainer.device
    nodes = trainer.inference_nodes()
    emb = trainer.new_buffer(raw.encoder.num_layers, args.hidden)
    out = layerwise_inference(raw.encoder, g, nodes, g.ndata["feat"], args.eval_batch_size, device, trainer.new_buffer)
    emb[nodes] = out
    if dist.is_initialized():
        dist.barrier()  # every trainer's embeddings written before any are read
    result = {}
    raw.predictor.eval()
    for split in ("val", "test"):
        if len(held_out[f"{split}_pairs"]) == 0:
            continue
        pairs = np.array_split(held_out[f"{split}_pairs"], trainer.world_size)[trainer.rank]
        negs = np.array_split(held_out[f"{split}_negatives"], trainer.world_size)[trainer.rank]
        pos_scores, neg_scores = [], []
        step = max(1, args.eval_batch_size // (negs.shape[1] + 2))  # pairs per step: rows read stay bounded
        with torch.no_grad():
            for start in range(0, len(pairs), step):
                p, n = pairs[start : start + step], negs[start : start + step]
                ids, inverse = np.unique(np.concatenate([p[:, 0], p[:, 1], n.reshape(-1)]), return_inverse=True)
                h = emb[torch.from_numpy(ids)].to(device)[torch.from_numpy(inverse).to(device)]
                h_src, h_dst, h_neg = h[: len(p)], h[len(p) : 2 * len(p)], h[2 * len(p) :].view(len(p), -1, h.shape[1])
                pos_scores.append(raw.predictor(h_src, h_dst).cpu())
                neg_scores.append(raw.predictor(h_src[:, None], h_neg).cpu())
        pos = torch.cat(pos_scores) if pos_scores else torch.zeros(0)
        neg = torch.cat(neg_scores) if neg_scores else torch.zeros(0, negs.shape[1])
        metrics = dist_link_metrics(pos, neg, hits=(1, 10, 50))
        result.update({f"{split}_{k}": v for k, v in metrics.items()})
    return result


def run_trainer(trainer: job.Trainer, args: argparse.Namespace, held_out: dict) -> dict:
    g, device, rank, world = trainer.g, trainer.device, trainer.rank, trainer.world_size
    if trainer.distributed:
        seeds = distgnn.edge_split(np.ones(g.num_edges(), bool), g.get_partition_book(), force_even=True)
    else:
        seeds = torch.arange(g.num_edges())
    feat = g.ndata["feat"]
    torch.manual_seed(args.seed)  # identical initial weights everywhere
    raw = LinkModel(args, int(feat.shape[1])).to(device)
    torch.manual_seed(derive_seed(args.seed, rank, 1))  # dropout differs per trainer, fixed per run
    model = (
        raw
        if world == 1
        else DistributedDataParallel(raw, device_ids=[device.index] if device.type == "cuda" else None)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = bce_loss if args.loss == "bce" else margin_loss
    background = bool(args.prefetch or args.num_workers)
    loader = DistEdgeDataLoader(
        g,
        seeds,
        NeighborSampler(args.fanouts),
        negative_sampler(args.neg_sampler, args.num_negs),
        exclude=None if args.exclude == "none" else args.exclude,  # reverse_id: g.edata["reverse_eid"]
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.num_workers,
        prefetch=args.prefetch,
        device=device,
        seed=args.seed,
        input_feats=("feat",) if background else (),
    )
    num_batches = len(loader) if not args.max_batches else min(len(loader), args.max_batches)
    epoch_times, seps_list, stage_times = [], [], []
    loss_sum = seen = 0.0
    try:
        for epoch in range(args.epochs):
            model.train()
            loss_total = torch.zeros((), dtype=torch.float64, device=device)
            seen = edges = 0.0
            t_wait = t_sample = t_fetch = t_compute = 0.0
            start = time.perf_counter()
            batches = iter(loader)
            for _ in range(num_batches):
                t0 = time.perf_counter()
                batch = next(batches)
                input_nodes, pos, neg, blocks = batch
                t1 = time.perf_counter()
                x = batch.input_data["feat"] if "feat" in batch.input_data else feat[input_nodes.cpu()].to(device)
                t2 = time.perf_counter()
                pos_score, neg_score = model(blocks, x, pos, neg)
                loss = loss_fn(pos_score, neg_score)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                loss_total += loss.detach() * pos.num_edges
                seen += pos.num_edges
                edges += sum(b.num_edges for b in blocks)
                # On a GPU, compute is the launch time plus whatever the next host sync waits for.
                t_wait, t_sample = t_wait + t1 - t0, t_sample + batch.timing["sample"]
                t_fetch, t_compute = t_fetch + batch.timing["fetch"] + t2 - t1, t_compute + time.perf_counter() - t2
            del batches  # an epoch cut short by --max-batches: the loader cancels the rest
            elapsed = time.perf_counter() - start
            loss_sum, seen, edges = all_reduce([float(loss_total), seen, edges])
            slowest = all_reduce(
                [elapsed, t_sample, t_fetch, t_compute, t_wait], dist.ReduceOp.MAX if dist.is_initialized() else None
            )
            epoch_times.append(slowest[0])
            stage_times.append(slowest[1:])
            seps_list.append(edges / slowest[0] if slowest[0] > 0 else 0.0)
            if rank == 0:
                print(
                    f"epoch {epoch:3d} | loss {loss_sum / max(seen, 1):.4f} | time {slowest[0]:.2f}s (sample "
                    f"{slowest[1]:.2f}s, fetch {slowest[2]:.2f}s, compute {slowest[3]:.2f}s, waited for batches "
                    f"{slowest[4]:.2f}s) | {seps_list[-1]:,.0f} sampled edges/s",
                    flush=True,
                )
    finally:
        loader.close()
    result = {
        "dataset": args.dataset,
        "device": str(device),
        "num_trainers": world,
        "num_parts": g.get_partition_book().num_partitions,
        "epochs": args.epochs,
        "batches_per_epoch": num_batches,
        "neg_sampler": args.neg_sampler,
        "num_negs": args.num_negs,
        "exclude": args.exclude,
        "predictor": args.predictor,
        "loss": args.loss,
        "train_loss": loss_sum / max(seen, 1) if epoch_times else None,
        "epoch_time_s": statistics.median(epoch_times) if epoch_times else None,
        "epoch_times_s": [round(t, 4) for t in epoch_times],
        # Per epoch, the slowest trainer's [sample, fetch, compute, waited for batches] seconds.
        "stage_times_s": [[round(t, 4) for t in stages] for stages in stage_times],
        "seps": statistics.median(seps_list) if seps_list else None,
    }
    if not args.no_eval:
        start = time.perf_counter()
        metrics = evaluate(raw, trainer, args, held_out)
        result.update(metrics)
        for key in ("mrr", "hits@10", "auc"):
            result[f"test_{key}"] = metrics[f"test_{key}"]
        result["eval_time_s"] = time.perf_counter() - start
    return result


# -- heterogeneous graphs ---------------------------------------------------------------------------


class TypedLinkModel(nn.Module):
    """Typed inputs, an R-GCN encoder to ``hidden``-wide embeddings, and a scorer of the target edge type."""

    def __init__(self, g, args: argparse.Namespace, target: tuple[str, str, str]):
        super().__init__()
        self.inputs = TypedInput(g, args.hidden)
        self.encoder = RGCN(
            args.hidden, args.hidden, args.hidden, len(g.canonical_etypes), len(args.fanouts), dropout=args.dropout
        )
        make = DotPredictor if args.predictor == "dot" else (lambda: MLPPredictor(args.hidden, args.hidden))
        self.scorer = TypedPredictor([target], make)

    def embed(self, input_nodes, blocks, device) -> torch.Tensor:
        return self.encoder(blocks, self.inputs(input_nodes, blocks[0].src_ntypes, device))

    def forward(self, input_nodes, blocks, pos, neg, device):
        h = self.embed(input_nodes, blocks, device)
        return self.scorer(h, pos), self.scorer(h, neg)


def typed_seeds(trainer: job.Trainer, target) -> torch.Tensor:
    """This trainer's share of the target type's edges, as per-type ids (its own machine's first)."""
    g = trainer.g
    if not trainer.distributed:
        return torch.arange(g.num_edges(target))
    book = g.get_partition_book()
    mask = np.zeros(g.num_edges(), dtype=bool)
    for start, end in book.edges.type_ranges[:, book.etype_id(target)].tolist():
        mask[start:end] = True
    _, per_type = book.map_to_per_etype(distgnn.edge_split(mask, book, force_even=True))
    return per_type


def evaluate_typed(raw: TypedLinkModel, trainer: job.Trainer, args, held_out: dict, target) -> dict:
    """Validation and test metrics of the target edge type, from sampled blocks of each step's nodes (collective)."""
    g, device = trainer.g, trainer.device
    book = g.get_partition_book()
    sampler = NeighborSampler(args.fanouts)
    predictor = raw.scorer.predictors[etype_str(target)]
    raw.eval()
    result = {}
    for split in ("val", "test"):
        if len(held_out[f"{split}_pairs"]) == 0:
            continue
        pairs = np.array_split(held_out[f"{split}_pairs"], trainer.world_size)[trainer.rank]
        negs = np.array_split(held_out[f"{split}_negatives"], trainer.world_size)[trainer.rank]
        pos_scores, neg_scores = [], []
        step = max(1, args.eval_batch_size // (negs.shape[1] + 2))
        with torch.no_grad():
            for start in range(0, len(pairs), step):
                p, n = pairs[start : start + step], negs[start : start + step]
                nodes, inverse = np.unique(np.concatenate([p[:, 0], p[:, 1], n.reshape(-1)]), return_inverse=True)
                input_nodes, _, blocks = sampler.sample_blocks(g, nodes, derive_seed(args.seed, 2, start))
                input_nodes = {t: ids.to(device) for t, ids in split_by_type(book, input_nodes).items()}
                h = raw.embed(input_nodes, [b.to(device) for b in blocks], device)
                h = h[torch.from_numpy(inverse).to(device)]
                h_src, h_dst, h_neg = h[: len(p)], h[len(p) : 2 * len(p)], h[2 * len(p) :].view(len(p), -1, h.shape[1])
                pos_scores.append(predictor(h_src, h_dst).cpu())
                neg_scores.append(predictor(h_src[:, None], h_neg).cpu())
        pos = torch.cat(pos_scores) if pos_scores else torch.zeros(0)
        neg = torch.cat(neg_scores) if neg_scores else torch.zeros(0, negs.shape[1])
        metrics = dist_link_metrics(pos, neg, hits=(1, 10, 50))
        result.update({f"{split}_{k}": v for k, v in metrics.items()})
    return result


def run_typed_trainer(trainer: job.Trainer, args: argparse.Namespace, held_out: dict) -> dict:
    g, device, rank, world = trainer.g, trainer.device, trainer.rank, trainer.world_size
    book = g.get_partition_book()
    target = book.to_canonical_etype(parse_etype(args.target_etype))
    reverse = reverse_etype_of(args, target)
    exclude = None if args.exclude == "none" else args.exclude
    if exclude == "reverse_id":
        exclude = "reverse_types" if reverse is not None else "self"
    torch.manual_seed(args.seed)
    raw = TypedLinkModel(g, args, target).to(device)
    torch.manual_seed(derive_seed(args.seed, rank, 1))
    model = raw if world == 1 else DistributedDataParallel(raw)  # every parameter takes part in a step
    dense = [p for name, p in raw.named_parameters() if not name.startswith("inputs.local_embeddings")]
    optimizer = torch.optim.Adam(dense, lr=args.lr)
    sparse = raw.inputs.sparse_optimizer("adam", args.sparse_lr)
    loss_fn = bce_loss if args.loss == "bce" else margin_loss
    loader = DistEdgeDataLoader(
        g,
        {target: typed_seeds(trainer, target)},
        NeighborSampler(args.fanouts),
        negative_sampler(args.neg_sampler, args.num_negs),
        exclude=exclude,
        reverse_etypes={target: reverse} if exclude == "reverse_types" else None,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.num_workers,
        prefetch=args.prefetch,
        device=device,
        seed=args.seed,
    )
    num_batches = len(loader) if not args.max_batches else min(len(loader), args.max_batches)
    epoch_times, loss_sum, seen = [], 0.0, 0.0
    try:
        for epoch in range(args.epochs):
            model.train()
            loss_total = torch.zeros((), dtype=torch.float64, device=device)
            seen = 0.0
            start = time.perf_counter()
            batches = iter(loader)
            for _ in range(num_batches):
                input_nodes, pos, neg, blocks = next(batches)
                pos_score, neg_score = model(input_nodes, blocks, pos, neg, device)
                loss = loss_fn(pos_score, neg_score)
                optimizer.zero_grad()
                if sparse is not None:
                    sparse.zero_grad()
                loss.backward()
                optimizer.step()
                if sparse is not None:
                    sparse.step()
                loss_total += loss.detach() * pos[target].num_edges
                seen += pos[target].num_edges
            del batches
            loss_sum, seen = all_reduce([float(loss_total), seen])
            epoch_times.append(all_reduce([time.perf_counter() - start], dist.ReduceOp.MAX if world > 1 else None)[0])
            if rank == 0:
                print(
                    f"epoch {epoch:3d} | loss {loss_sum / max(seen, 1):.4f} | time {epoch_times[-1]:.2f}s", flush=True
                )
    finally:
        loader.close()
    result = {
        "dataset": args.dataset,
        "target_etype": etype_str(target),
        "exclude": exclude,
        "device": str(device),
        "num_trainers": world,
        "num_parts": book.num_partitions,
        "epochs": args.epochs,
        "batches_per_epoch": num_batches,
        "neg_sampler": args.neg_sampler,
        "num_negs": args.num_negs,
        "predictor": args.predictor,
        "loss": args.loss,
        "train_loss": loss_sum / max(seen, 1) if epoch_times else None,
        "epoch_time_s": statistics.median(epoch_times) if epoch_times else None,
    }
    if not args.no_eval:
        start = time.perf_counter()
        metrics = evaluate_typed(raw, trainer, args, held_out, target)
        result.update(metrics)
        result["eval_time_s"] = time.perf_counter() - start
    return result


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    job.log_to_stderr()
    if args.local:
        prepare_local(args)
        return job.run_local(__file__, argv, args)
    if args.single and args.target_etype:
        train, held_out = typed_link_split(args)
        trainer = job.Trainer(InProcessGraph(train), torch.device(args.device), 0, 1, None, False)
        torch.set_num_threads(job.torch_threads(args, 1))
        result = run_typed_trainer(trainer, args, held_out)
    elif args.single:
        split = link_split(args)
        trainer = job.Trainer(InProcessGraph(split.train), torch.device(args.device), 0, 1, None, False)
        torch.set_num_threads(job.torch_threads(args, 1))
        result = run_trainer(trainer, args, split.held_out())
    else:
        with job.start_trainer(args) as trainer:
            if args.target_etype:
                result = run_typed_trainer(trainer, args, load_held_out(Path(trainer.g.part_config).parent / LINK_DIR))
            else:
                held_out = load_link_partition(trainer.g.part_config)
                result = run_trainer(trainer, args, held_out)
    if trainer.rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
