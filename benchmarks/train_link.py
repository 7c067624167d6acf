"""GraphSAGE link prediction epoch time and test MRR: distgnn vs DistDGL 1.1.3, same graph, same run.

Both sides: the same synthetic graph and link split (``distgnn.data.link_split.split_links``:
``--test-fraction`` of the undirected pairs held out, each with the same ``--eval-negatives``
destinations), 2 simulated machines x 1 trainer, METIS partitions, the same fanouts, hidden
width, batch of positive edges, uniform negatives per edge, reverse-edge exclusion, dot-product
scorer, BCE loss and Adam, and the same number of batches per epoch (``--max-batches`` caps it
on slow boxes). Then layer-wise inference embeddings score the held-out pairs (MRR, hits@10, AUC
from ``distgnn.train.evaluation`` on both sides).

distgnn runs ``examples/link_prediction/train_dist.py --local``. DistDGL runs its own
``partition_graph``, ``DistGraphServer``, ``edge_split``, ``DistEdgeDataLoader`` (with
``negative_sampler.Uniform`` and ``exclude="reverse_id"``, as DGL 1.1.3's
``train_dist_unsupervised.py``) and ``SAGEConv``, on simulated machines (``distdgl_cluster``).

    flock /tmp/distgnn-heavy.lock python benchmarks/train_link.py --max-batches 20 --epochs 2
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers.distdgl_cluster import join_as_trainer, machine, run_for_result, run_machines, serve  # noqa: E402
from stage_split import StepClock, checkout_env, inline_split, print_stage_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path("examples", "link_prediction", "train_dist.py")  # under a checkout
DGL_GRAPH_NAME = "linkbench"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-nodes", type=int, default=1_000_000)
    p.add_argument("--avg-degree", type=float, default=10.0)
    p.add_argument("--feat-dim", type=int, default=100)
    p.add_argument("--num-classes", type=int, default=16, help="communities of the synthetic graph")
    p.add_argument("--fanouts", default="10,10")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--batch-size", type=int, default=1024, help="positive edges per batch")
    p.add_argument("--num-negs", type=int, default=1, help="uniform negatives per positive edge")
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-batches", type=int, default=0, help="cap on batches per epoch (0: full epochs)")
    p.add_argument("--test-fraction", type=float, default=0.001, help="held-out undirected pairs")
    p.add_argument("--eval-negatives", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=str(ROOT / ".work" / "bench-link"))
    p.add_argument(
        "--baseline",
        default=None,
        help="also run distgnn from this checkout (an older commit's export), row 'distgnn (baseline)'",
    )
    p.add_argument("--skip-dgl", action="store_true")
    p.add_argument("--skip-distgnn", action="store_true")
    p.add_argument("--no-eval", action="store_true")
    p.add_argument("--role", default="main", help=argparse.SUPPRESS)
    p.add_argument("--machine", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--master-port", type=int, default=0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def link_split(args):
    from distgnn.data import synthetic
    from distgnn.data.link_split import split_links

    graph = synthetic(args.num_nodes, args.avg_degree, args.feat_dim, args.num_classes, seed=args.seed)
    return split_links(graph, 0.0, args.test_fraction, args.eval_negatives, seed=args.seed)


# -- distgnn ----------------------------------------------------------------------------------------


def run_distgnn(args, root: Path = ROOT) -> dict:
    cmd = [
        sys.executable,
        str(root / SCRIPT),
        "--local",
        "--dataset=synthetic",
        f"--num-nodes={args.num_nodes}",
        f"--avg-degree={args.avg_degree}",
        f"--feat-dim={args.feat_dim}",
        f"--synthetic-classes={args.num_classes}",
        "--num-parts=2",
        "--trainers-per-machine=1",
        "--part-method=metis",
        f"--fanouts={args.fanouts}",
        f"--hidden={args.hidden}",
        f"--dropout={args.dropout}",
        f"--batch-size={args.batch_size}",
        "--neg-sampler=uniform",
        f"--num-negs={args.num_negs}",
        "--exclude=reverse_id",
        f"--lr={args.lr}",
        f"--epochs={args.epochs}",
        f"--max-batches={args.max_batches}",
        "--val-fraction=0",
        f"--test-fraction={args.test_fraction}",
        f"--eval-negatives={args.eval_negatives}",
        f"--seed={args.seed}",
        f"--workdir={Path(args.workdir) / 'distgnn'}",
        "--quiet",
    ]
    cmd += ["--no-eval"] if args.no_eval else []
    return run_for_result(cmd, "distgnn", env=checkout_env(root, ROOT))


# -- DistDGL ----------------------------------------------------------------------------------------


def dgl_paths(args) -> tuple[Path, Path, Path]:
    root = Path(args.workdir) / "dgl"
    return root, root / "parts" / f"{DGL_GRAPH_NAME}.json", root / "ip_config.txt"


def _graph_key(args) -> dict:
    keys = ("num_nodes", "avg_degree", "feat_dim", "num_classes", "seed", "test_fraction", "eval_negatives")
    return {k: getattr(args, k) for k in keys}


def dgl_partition(args) -> None:
    """Partition the training graph with DGL's METIS path; held-out pairs and reverse ids in DGL's new ids."""
    import dgl
    import numpy as np
    import torch

    from distgnn.data.link_split import reverse_edge_ids, to_partition_ids

    split = link_split(args)
    train = split.train
    g = dgl.graph((torch.from_numpy(train.src), torch.from_numpy(train.dst)), num_nodes=train.num_nodes)
    g.ndata["feat"] = torch.from_numpy(train.ndata["feat"])
    root, part_config, _ = dgl_paths(args)
    t = time.perf_counter()
    orig_nids, orig_eids = dgl.distributed.partition_graph(
        g, DGL_GRAPH_NAME, 2, str(part_config.parent), part_method="metis", balance_edges=True, return_mapping=True
    )
    print(f"DGL partition_graph took {time.perf_counter() - t:.1f}s", file=sys.stderr)
    orig_nids, orig_eids = orig_nids.numpy(), orig_eids.numpy()
    reverse = reverse_edge_ids(train.src, train.dst)
    new_eid_of_orig = np.empty(len(orig_eids), dtype=np.int64)
    new_eid_of_orig[orig_eids] = np.arange(len(orig_eids))
    np.save(root / "reverse_eid.npy", new_eid_of_orig[reverse[orig_eids]])
    np.save(root / "test_pairs.npy", to_partition_ids(orig_nids, split.test_pairs))
    np.save(root / "test_negatives.npy", to_partition_ids(orig_nids, split.test_negatives))
    (root / "done.json").write_text(json.dumps(_graph_key(args)))


def run_dgl(args) -> dict:
    root, _, ip_config = dgl_paths(args)
    done = root / "done.json"
    if not done.exists() or json.loads(done.read_text()) != _graph_key(args):
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        subprocess.run([sys.executable, __file__, *sys.argv[1:], "--role=dgl-partition"], check=True)
    return run_machines(__file__, sys.argv[1:], ip_config)


def dgl_machine(args) -> int:
    _, part_config, ip_config = dgl_paths(args)
    return machine(__file__, sys.argv[1:], args.machine, args.master_port, part_config, ip_config, 0)


def dgl_server(args) -> int:
    return serve(dgl_paths(args)[2])


def dgl_trainer(args) -> int:
    import dgl
    import dgl.function as fn
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from dgl.nn import SAGEConv
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    root, part_config, ip_config = dgl_paths(args)
    join_as_trainer(args.machine, ip_config)
    rank = dist.get_rank()
    g = dgl.distributed.DistGraph(DGL_GRAPH_NAME, part_config=str(part_config))
    book = g.get_partition_book()
    train_eids = dgl.distributed.edge_split(torch.ones(g.num_edges(), dtype=torch.bool), book, force_even=True)
    fanouts = [int(f) for f in args.fanouts.split(",")]

    class SAGE(nn.Module):
        def __init__(self, in_feats, hidden, layers, dropout):
            super().__init__()
            dims = [in_feats] + [hidden] * layers
            self.layers = nn.ModuleList(SAGEConv(a, b, "mean") for a, b in zip(dims[:-1], dims[1:], strict=True))
            self.dropout = nn.Dropout(dropout)
            self.dims = dims[1:]

        def layer(self, i, block, h):
            h = self.layers[i](block, h)
            return self.dropout(F.relu(h)) if i != len(self.layers) - 1 else h

        def forward(self, blocks, x):
            for i, block in enumerate(blocks):
                x = self.layer(i, block, x)
            return x

    def scores(pair_graph, h):
        with pair_graph.local_scope():
            pair_graph.ndata["h"] = h
            pair_graph.apply_edges(fn.u_dot_v("h", "h", "score"))
            return pair_graph.edata["score"].reshape(-1)

    torch.manual_seed(args.seed)
    model = SAGE(args.feat_dim, args.hidden, len(fanouts), args.dropout)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    loader = dgl.dataloading.DistEdgeDataLoader(
        g,
        train_eids,
        dgl.dataloading.NeighborSampler(fanouts),
        negative_sampler=dgl.dataloading.negative_sampler.Uniform(args.num_negs),
        exclude="reverse_id",
        reverse_eids=torch.from_numpy(np.load(root / "reverse_eid.npy")),
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=False,
    )
    # DistDGL's loader does not equalise batch counts; force_even splits differ by at most one edge.
    counts = torch.tensor([-(-len(train_eids) // args.batch_size)])
    dist.all_reduce(counts, op=dist.ReduceOp.MIN)
    num_batches = int(counts) if not args.max_batches else min(int(counts), args.max_batches)
    epoch_times, seps, stage_times, splits = [], [], [], []
    for epoch in range(args.epochs):
        ddp.train()
        edges = 0
        loss_sum = seen = 0.0
        clock = StepClock()
        start = time.perf_counter()
        it = iter(loader)
        for _ in range(num_batches):
            clock.start()
            input_nodes, pos_graph, neg_graph, blocks = next(it)
            clock.lap("sample")
            x = g.ndata["feat"][input_nodes]
            clock.lap("fetch")
            h = ddp(blocks, x)
            pos, neg = scores(pos_graph, h), scores(neg_graph, h)
            loss = F.binary_cross_entropy_with_logits(
                torch.cat([pos, neg]), torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
            )
            clock.lap("forward")
            opt.zero_grad()
            loss.backward()
            clock.lap("backward")
            opt.step()
            clock.lap("optimizer")
            edges += sum(b.num_edges() for b in blocks)
            loss_sum += loss.item() * pos_graph.num_edges()
            seen += pos_graph.num_edges()
        elapsed = time.perf_counter() - start
        stats = torch.tensor([elapsed, *clock.values()], dtype=torch.float64)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        splits.append(inline_split(stats[1:].tolist()))
        totals = torch.tensor([float(edges), loss_sum, seen], dtype=torch.float64)
        dist.all_reduce(totals)
        epoch_times.append(float(stats[0]))
        stage_times.append([round(float(t), 4) for t in (stats[1], stats[2], stats[3:].sum())])
        seps.append(float(totals[0]) / float(stats[0]))
        if rank == 0:
            print(
                f"epoch {epoch} | loss {totals[1] / totals[2]:.4f} | time {stats[0]:.2f}s (sample {stats[1]:.2f}s, "
                f"fetch {stats[2]:.2f}s, forward {stats[3]:.2f}s, backward {stats[4]:.2f}s, optimizer {stats[5]:.2f}s)",
                flush=True,
            )
    result = {
        "num_trainers": dist.get_world_size(),
        "batches_per_epoch": num_batches,
        "epoch_time_s": statistics.median(epoch_times),
        "epoch_times_s": epoch_times,
        "stage_times_s": stage_times,
        "stage_split_s": splits,
        "seps": statistics.median(seps),
        "train_loss": float(totals[1] / totals[2]),
    }
    if not args.no_eval:
        t = time.perf_counter()
        result.update(_dgl_link_eval(g, model, book, root, rank, dist.get_world_size()))
        result["eval_time_s"] = time.perf_counter() - t
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    return 0


def _dgl_link_eval(g, model, book, root: Path, rank: int, world: int) -> dict:
    """Layer-wise embeddings into DistTensors (as DistDGL's example), then this trainer's share of the pairs."""
    import dgl
    import numpy as np
    import torch

    from distgnn.train.evaluation import dist_link_metrics

    model.eval()
    nodes = dgl.distributed.node_split(torch.ones(g.num_nodes(), dtype=torch.bool), book, force_even=True)
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(1)
    x = g.ndata["feat"]
    with torch.no_grad():
        for i, dim in enumerate(model.dims):
            out = dgl.distributed.DistTensor((g.num_nodes(), dim), torch.float32, f"h{i}", persistent=True)
            loader = dgl.dataloading.DistNodeDataLoader(g, nodes, sampler, batch_size=10000, shuffle=False)
            for input_nodes, seeds, blocks in loader:
                out[seeds] = model.layer(i, blocks[0], x[input_nodes])
            g.barrier()
            x = out
        pairs = np.array_split(np.load(root / "test_pairs.npy"), world)[rank]
        negs = np.array_split(np.load(root / "test_negatives.npy"), world)[rank]
        h_src, h_dst = x[torch.from_numpy(pairs[:, 0])], x[torch.from_numpy(pairs[:, 1])]
        h_neg = x[torch.from_numpy(negs.reshape(-1))].view(len(pairs), negs.shape[1], -1)
        pos = (h_src * h_dst).sum(-1)
        neg = (h_src[:, None] * h_neg).sum(-1)
    metrics = dist_link_metrics(pos, neg, hits=(1, 10, 50))
    return {f"test_{k}": v for k, v in metrics.items()}


# -- table ------------------------------------------------------------------------------------------


def print_table(args, results: dict[str, dict]) -> None:
    cap = f"{args.max_batches} batches/epoch cap" if args.max_batches else "full epochs"
    print(
        f"\nGraphSAGE link prediction: fanouts {args.fanouts}, hidden {args.hidden}, batch {args.batch_size} edges, "
        f"{args.num_negs} uniform negative(s)/edge, reverse-edge exclusion, synthetic {args.num_nodes:,} nodes / "
        f"~{int(args.num_nodes * args.avg_degree):,} edges, 2 machines x 1 trainer, {args.epochs} epochs, {cap}"
    )
    header = (
        f"{'system':<10} {'batches/epoch':>13} {'epoch s (median)':>17} {'s/batch':>8} {'sample s':>9} {'fetch s':>8} "
        f"{'compute s':>10} {'SEPS':>12} {'train loss':>10} {'test MRR':>9} {'hits@10':>8} {'test AUC':>9}"
    )
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        per_batch = r["epoch_time_s"] / max(r["batches_per_epoch"], 1)
        metrics = [f"{r[k]:.4f}" if k in r else "-" for k in ("test_mrr", "test_hits@10", "test_auc")]
        # Median over epochs of the slowest trainer's summed stage times (distgnn: [sample, fetch, compute, wait]).
        stages = [statistics.median(epoch[i] for epoch in r["stage_times_s"]) for i in range(3)]
        print(
            f"{name:<10} {r['batches_per_epoch']:>13} {r['epoch_time_s']:>17.2f} {per_batch:>8.3f} {stages[0]:>9.2f} "
            f"{stages[1]:>8.2f} {stages[2]:>10.2f} {r['seps']:>12,.0f} {r['train_loss']:>10.4f} {metrics[0]:>9} "
            f"{metrics[1]:>8} {metrics[2]:>9}"
        )
    if "distgnn" in results and "DistDGL" in results:
        a, b = results["distgnn"], results["DistDGL"]
        line = f"distgnn epoch time / DistDGL epoch time: {a['epoch_time_s'] / b['epoch_time_s']:.2f}"
        if "test_mrr" in a and "test_mrr" in b:
            line += f"; test MRR difference: {a['test_mrr'] - b['test_mrr']:+.4f}"
        print(line)
    print_stage_table(results)


def main(argv=None) -> int:
    args = parse_args(argv)
    roles = {
        "dgl-partition": dgl_partition,
        "dgl-machine": dgl_machine,
        "dgl-server": dgl_server,
        "dgl-trainer": dgl_trainer,
    }
    if args.role in roles:
        return roles[args.role](args) or 0
    results = {}
    if not args.skip_distgnn:
        results["distgnn"] = run_distgnn(args)
        if args.baseline:
            results["distgnn (baseline)"] = run_distgnn(args, Path(args.baseline))
    if not args.skip_dgl:
        results["DistDGL"] = run_dgl(args)
    print_table(args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
