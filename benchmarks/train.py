"""GraphSAGE training epoch time: distgnn vs DistDGL 1.1.3, on the same synthetic graph, same run.

Both sides: 2 simulated machines x 1 trainer on this host, METIS partitions,
fanouts 15,10,5, hidden 256, batch 1024, Adam, the same number of batches per
epoch (``--max-batches`` caps it on slow boxes), then layer-wise inference for
validation/test accuracy (as DistDGL's own example does).

distgnn runs ``examples/graphsage/train_dist.py --local``. DistDGL runs its
own ``partition_graph``, ``DistGraphServer`` and ``DistNodeDataLoader`` with its
own ``SAGEConv``. DistDGL names its shared memory by graph and tensor name
only, so two of its "machines" cannot share one /dev/shm: each simulated DGL
machine (server + trainer) runs in a private mount namespace with its own
tmpfs on /dev/shm (``unshare -m``; needs root), on its own loopback address
(127.0.0.1, 127.0.0.2), and the trainer is told its machine by narrowing
DGL's local-address list to that address.

    flock /tmp/distgnn-heavy.lock python benchmarks/train.py --max-batches 20 --epochs 2
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
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
SCRIPT = Path("examples", "graphsage", "train_dist.py")  # under a checkout
DGL_GRAPH_NAME = "bench"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-nodes", type=int, default=1_000_000)
    p.add_argument("--avg-degree", type=float, default=20.0)
    p.add_argument("--feat-dim", type=int, default=100)
    p.add_argument("--num-classes", type=int, default=16)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-batches", type=int, default=0, help="cap on batches per epoch (0: full epochs)")
    p.add_argument("--num-workers", type=int, default=0, help="sampler processes per trainer (both sides)")
    p.add_argument(
        "--distgnn-prefetch",
        default="0,2",
        help="distgnn runs to make, by loader prefetch depth (0 with 0 workers: sample inline; 2: background thread)",
    )
    p.add_argument(
        "--distgnn-aggregate",
        default="auto",
        help="distgnn runs to make, by --aggregate-inputs (comma-separated: auto, trainer, rows, owners): where\n"
        "the first layer's neighbour means are summed (auto: the example's default)",
    )
    p.add_argument(
        "--distgnn-matmul",
        default="highest",
        help="distgnn runs to make, by --matmul-precision (comma-separated: highest, medium): medium takes the\n"
        "GNN layers' products in bfloat16 on a CPU's AMX units (distgnn.nn.matmul)",
    )
    p.add_argument(
        "--also-default-malloc",
        action="store_true",
        help="also run each distgnn variant with glibc malloc left as it is (train_dist.py --no-malloc-tuning)",
    )
    p.add_argument(
        "--also-tuned-dgl",
        action="store_true",
        help="also run DistDGL with its trainers on distgnn.train.allocator.keep_freed_memory() (a like-for-like allocator)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=str(ROOT / ".work" / "bench-train"))
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


def synthetic_graph(args):
    from distgnn.data import synthetic

    return synthetic(args.num_nodes, args.avg_degree, args.feat_dim, args.num_classes, seed=args.seed)


# -- distgnn ----------------------------------------------------------------------------------------


def run_distgnn(
    args,
    prefetch: int,
    malloc_tuning: bool = True,
    root: Path = ROOT,
    aggregate: str | None = None,
    matmul: str | None = None,
) -> dict:
    """One distgnn run; ``aggregate``, ``matmul``: its ``--aggregate-inputs`` and ``--matmul-precision`` (None:
    not passed, for a checkout older than them)."""
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
        f"--batch-size={args.batch_size}",
        f"--lr={args.lr}",
        f"--epochs={args.epochs}",
        f"--max-batches={args.max_batches}",
        f"--num-workers={args.num_workers}",
        f"--prefetch={prefetch}",
        f"--seed={args.seed}",
        f"--workdir={Path(args.workdir) / 'distgnn'}",
        "--quiet",
    ]
    cmd += ["--no-eval"] if args.no_eval else []
    cmd += [] if malloc_tuning else ["--no-malloc-tuning"]
    cmd += [] if aggregate is None else [f"--aggregate-inputs={aggregate}"]
    cmd += [] if matmul is None else [f"--matmul-precision={matmul}"]
    return run_for_result(cmd, "distgnn", env=checkout_env(root, ROOT))


# -- DistDGL (simulated machines: see distdgl_cluster) ----------------------------------------------


def dgl_paths(args) -> tuple[Path, Path, Path]:
    root = Path(args.workdir) / "dgl"
    return root, root / "parts" / f"{DGL_GRAPH_NAME}.json", root / "ip_config.txt"


def dgl_partition(args) -> None:
    """Build the DGLGraph of the same synthetic graph and partition it with DGL's own METIS path."""
    import dgl
    import torch

    graph = synthetic_graph(args)
    g = dgl.graph((torch.from_numpy(graph.src), torch.from_numpy(graph.dst)), num_nodes=graph.num_nodes)
    for name, arr in graph.ndata.items():
        g.ndata[name] = torch.from_numpy(arr)
    del graph
    root, part_config, _ = dgl_paths(args)
    t = time.perf_counter()
    dgl.distributed.partition_graph(
        g, DGL_GRAPH_NAME, 2, str(part_config.parent), part_method="metis", balance_edges=True
    )
    print(f"DGL partition_graph took {time.perf_counter() - t:.1f}s", file=sys.stderr)
    (root / "done.json").write_text(json.dumps(_graph_key(args)))


def _graph_key(args) -> dict:
    return {k: getattr(args, k) for k in ("num_nodes", "avg_degree", "feat_dim", "num_classes", "seed")}


DGL_MALLOC_ENV = "DISTGNN_BENCH_DGL_KEEP_FREED_MEMORY"


def run_dgl(args, malloc_tuning: bool = False) -> dict:
    """DistDGL as it ships; with ``malloc_tuning`` its trainers get distgnn's allocator setting too."""
    root, part_config, ip_config = dgl_paths(args)
    done = root / "done.json"
    if not done.exists() or json.loads(done.read_text()) != _graph_key(args):
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        subprocess.run([sys.executable, __file__, *sys.argv[1:], "--role=dgl-partition"], check=True)
    env = {DGL_MALLOC_ENV: "1" if malloc_tuning else "0"}
    return run_machines(__file__, sys.argv[1:], ip_config, env)


def dgl_machine(args) -> int:
    """One simulated DGL machine: its server and its trainer (inside the machine's mount namespace)."""
    _, part_config, ip_config = dgl_paths(args)
    return machine(__file__, sys.argv[1:], args.machine, args.master_port, part_config, ip_config, args.num_workers)


def dgl_server(args) -> int:
    return serve(dgl_paths(args)[2])


def dgl_trainer(args) -> int:
    import dgl
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from dgl.nn import SAGEConv
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    if os.environ.get(DGL_MALLOC_ENV) == "1":
        from distgnn.train.allocator import keep_freed_memory

        keep_freed_memory()
    _, part_config, ip_config = dgl_paths(args)
    join_as_trainer(args.machine, ip_config)
    rank = dist.get_rank()
    g = dgl.distributed.DistGraph(DGL_GRAPH_NAME, part_config=str(part_config))
    book = g.get_partition_book()
    train_nid = dgl.distributed.node_split(g.ndata["train_mask"], book, force_even=True)
    fanouts = [int(f) for f in args.fanouts.split(",")]

    class SAGE(nn.Module):
        def __init__(self, in_feats, hidden, classes, layers, dropout=0.5):
            super().__init__()
            dims = [in_feats] + [hidden] * (layers - 1) + [classes]
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

    torch.manual_seed(args.seed)
    model = SAGE(args.feat_dim, args.hidden, args.num_classes, len(fanouts))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    sampler = dgl.dataloading.NeighborSampler(fanouts)
    loader = dgl.dataloading.DistNodeDataLoader(
        g, train_nid, sampler, batch_size=args.batch_size, shuffle=True, drop_last=False
    )
    # DistDGL's loader does not equalise batch counts; force_even splits differ by at most one node.
    counts = torch.tensor([-(-len(train_nid) // args.batch_size)])
    dist.all_reduce(counts, op=dist.ReduceOp.MIN)
    num_batches = int(counts) if not args.max_batches else min(int(counts), args.max_batches)
    epoch_times, seps, splits = [], [], []
    for epoch in range(args.epochs):
        ddp.train()
        clock = StepClock()
        edges = 0
        loss_sum = correct = seen = 0.0
        start = time.perf_counter()
        it = iter(loader)
        for _ in range(num_batches):
            clock.start()
            input_nodes, seeds, blocks = next(it)
            clock.lap("sample")
            x = g.ndata["feat"][input_nodes]
            y = g.ndata["label"][seeds]
            clock.lap("fetch")
            logits = ddp(blocks, x)
            loss = F.cross_entropy(logits, y)
            clock.lap("forward")
            opt.zero_grad()
            loss.backward()
            clock.lap("backward")
            opt.step()
            clock.lap("optimizer")
            edges += sum(b.num_edges() for b in blocks)
            loss_sum += loss.item() * len(seeds)
            correct += float((logits.argmax(1) == y).sum())
            seen += len(seeds)
        elapsed = time.perf_counter() - start
        if args.num_workers:
            # DistDGL's sampler processes must finish the cut epoch before the next starts (not timed).
            for _ in it:
                pass
        stats = torch.tensor([elapsed, *clock.values()], dtype=torch.float64)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        splits.append(inline_split(stats[1:].tolist()))
        totals = torch.tensor([float(edges), loss_sum, correct, seen], dtype=torch.float64)
        dist.all_reduce(totals)
        epoch_times.append(float(stats[0]))
        seps.append(float(totals[0]) / float(stats[0]))
        if rank == 0:
            print(
                f"epoch {epoch} | loss {totals[1] / totals[3]:.4f} | train acc {totals[2] / totals[3]:.4f} | "
                f"time {stats[0]:.2f}s (sample {stats[1]:.2f}s, fetch {stats[2]:.2f}s, forward {stats[3]:.2f}s, "
                f"backward {stats[4]:.2f}s, optimizer {stats[5]:.2f}s)",
                flush=True,
            )
    result = {
        "num_trainers": dist.get_world_size(),
        "batches_per_epoch": num_batches,
        "epoch_time_s": statistics.median(epoch_times),
        "epoch_times_s": epoch_times,
        "stage_split_s": splits,
        "seps": statistics.median(seps),
        "train_loss": float(totals[1] / totals[3]),
    }
    if not args.no_eval:
        t = time.perf_counter()
        result.update(_dgl_layerwise_eval(g, model, book, args))
        result["eval_time_s"] = time.perf_counter() - t
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    return 0


def _dgl_layerwise_eval(g, model, book, args) -> dict:
    """DistDGL's own example inference: one full-neighbour layer at a time into DistTensors."""
    import dgl
    import torch
    import torch.distributed as dist

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
        pred = x[nodes].argmax(1)
        label = g.ndata["label"][nodes]
        stats = []
        for mask_name in ("val_mask", "test_mask"):
            mask = g.ndata[mask_name][nodes].bool()
            stats += [float((pred[mask] == label[mask]).sum()), float(mask.sum())]
    stats = torch.tensor(stats, dtype=torch.float64)
    dist.all_reduce(stats)
    return {"val_acc": float(stats[0] / stats[1]), "test_acc": float(stats[2] / stats[3])}


# -- table ------------------------------------------------------------------------------------------


def print_table(args, results: dict[str, dict]) -> None:
    cap = f"{args.max_batches} batches/epoch cap" if args.max_batches else "full epochs"
    print(
        f"\nGraphSAGE fanouts {args.fanouts}, hidden {args.hidden}, batch {args.batch_size}, synthetic "
        f"{args.num_nodes:,} nodes / ~{int(args.num_nodes * args.avg_degree):,} edges, "
        f"2 machines x 1 trainer, {args.epochs} epochs, {cap}, {args.num_workers} sampler workers"
    )
    width = max([22, *(len(name) for name in results)])
    header = (
        f"{'system':<{width}} {'batches/epoch':>13} {'epoch s (median)':>17} {'s/batch':>8} {'SEPS':>12} "
        f"{'train loss':>10} {'val acc':>8} {'test acc':>9}"
    )
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        per_batch = r["epoch_time_s"] / max(r["batches_per_epoch"], 1)
        val = f"{r['val_acc']:.4f}" if "val_acc" in r else "-"
        test = f"{r['test_acc']:.4f}" if "test_acc" in r else "-"
        print(
            f"{name:<{width}} {r['batches_per_epoch']:>13} {r['epoch_time_s']:>17.2f} {per_batch:>8.3f} "
            f"{r['seps']:>12,.0f} {r.get('train_loss', float('nan')):>10.4f} {val:>8} {test:>9}"
        )
    for peer, b in results.items():
        if not peer.startswith("DistDGL"):
            continue
        for name, a in results.items():
            if name.startswith("DistDGL"):
                continue
            line = f"{name} epoch time / {peer} epoch time: {a['epoch_time_s'] / b['epoch_time_s']:.2f}"
            if "test_acc" in a and "test_acc" in b:
                line += f"; test accuracy difference: {a['test_acc'] - b['test_acc']:+.4f}"
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
        aggregates = args.distgnn_aggregate.split(",")
        matmuls = args.distgnn_matmul.split(",")
        for prefetch, aggregate, matmul in itertools.product(
            (int(p) for p in args.distgnn_prefetch.split(",")), aggregates, matmuls
        ):
            mode = "inline" if prefetch == 0 and args.num_workers == 0 else f"prefetch {prefetch}"
            mode += "" if aggregates == ["auto"] else f", inputs {aggregate}"
            mode += "" if matmuls == ["highest"] else f", matmul {matmul}"
            results[f"distgnn ({mode})"] = run_distgnn(args, prefetch, aggregate=aggregate, matmul=matmul)
            if args.baseline:  # an older checkout: its own defaults
                results[f"distgnn baseline ({mode})"] = run_distgnn(args, prefetch, root=Path(args.baseline))
            if args.also_default_malloc:
                results[f"distgnn ({mode}, default malloc)"] = run_distgnn(
                    args, prefetch, aggregate=aggregate, malloc_tuning=False, matmul=matmul
                )
    if not args.skip_dgl:
        results["DistDGL"] = run_dgl(args)
        if args.also_tuned_dgl:
            results["DistDGL (malloc tuned)"] = run_dgl(args, malloc_tuning=True)
    print_table(args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
