"""R-GCN training epoch time on synthetic-mag: distgnn vs DistDGL 1.1.3, on the same graph, same run.

Both sides: 2 simulated machines x ``--trainers-per-machine`` trainers on this host, METIS partitions of the
same ``synthetic_mag`` graph (per-type ids, the papers' ``feat``/``label``/masks), the papers classified,
the other types' inputs learnable embeddings (a DistEmbedding per type, trained by each side's sparse Adam),
the papers' features projected by a linear layer, 2 R-GCN layers (basis decomposition, self loop, mean per
relation summed over relations), the same fanouts per edge type, batch size, hidden size, learning rates,
dropout, the same number of batches per epoch (``--max-batches`` caps it on slow boxes), then sampled
mini-batch inference over each trainer's share of the validation and test papers.

distgnn runs ``examples/rgcn/train_dist.py --local``. DistDGL runs its own ``partition_graph`` of a DGL
heterograph, ``DistGraphServer``, ``DistGraph``, ``DistNodeDataLoader``, ``dgl.distributed.DistEmbedding``
and ``dgl.distributed.optim.SparseAdam``, with a model written as DGL's own distributed R-GCN example
(examples/pytorch/rgcn/experimental/entity_classify_dist.py, v1.1.3) writes it: ``HeteroGraphConv`` of
``GraphConv(norm="right")`` per relation with ``WeightBasis`` weights, a DDP-wrapped embedding layer. Each
simulated DGL machine runs in a private mount namespace (see distdgl_host.py).

    flock /tmp/distgnn-heavy.lock python benchmarks/train_hetero.py --num-papers 20000 --epochs 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from peers.distdgl_host import (
    DGL_IPS,
    free_port,
    in_private_shm,
    pin_dgl_machine,
    run_for_result,
    run_simulated_machines,
)
from stage_split import StepClock, checkout_env, inline_split, print_stage_table

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path("examples", "rgcn", "train_dist.py")  # under a checkout
DGL_GRAPH_NAME = "mag"
NUM_MACHINES = 2
TARGET = "paper"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-papers", type=int, default=20000)
    p.add_argument("--feat-dim", type=int, default=64)
    p.add_argument("--num-classes", type=int, default=8)
    p.add_argument("--fanouts", default="10,10", help="neighbours per edge type per layer, input layer first")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--num-bases", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--eval-batch-size", type=int, default=4096)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--sparse-lr", type=float, default=0.05)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-batches", type=int, default=0, help="cap on batches per epoch (0: full epochs)")
    p.add_argument("--trainers-per-machine", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=str(ROOT / ".work" / "bench-train-hetero"))
    p.add_argument(
        "--baseline",
        default=None,
        help="also run distgnn from this checkout (an older commit's export), row 'distgnn (baseline)'",
    )
    p.add_argument("--skip-dgl", action="store_true")
    p.add_argument("--skip-distgnn", action="store_true")
    p.add_argument("--role", default="main", help=argparse.SUPPRESS)
    p.add_argument("--machine", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--local-rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--master-port", type=int, default=0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# -- distgnn ----------------------------------------------------------------------------------------


def run_distgnn(args, root: Path = ROOT) -> dict:
    cmd = [
        sys.executable,
        str(root / SCRIPT),
        "--local",
        "--dataset=synthetic-mag",
        f"--num-papers={args.num_papers}",
        f"--feat-dim={args.feat_dim}",
        f"--synthetic-classes={args.num_classes}",
        f"--num-parts={NUM_MACHINES}",
        f"--trainers-per-machine={args.trainers_per_machine}",
        "--part-method=metis",
        f"--fanouts={args.fanouts}",
        f"--hidden={args.hidden}",
        f"--num-bases={args.num_bases}",
        f"--batch-size={args.batch_size}",
        f"--eval-batch-size={args.eval_batch_size}",
        f"--lr={args.lr}",
        f"--sparse-lr={args.sparse_lr}",
        "--sparse-optimizer=adam",
        f"--dropout={args.dropout}",
        f"--epochs={args.epochs}",
        f"--max-batches={args.max_batches}",
        f"--seed={args.seed}",
        f"--workdir={Path(args.workdir) / 'distgnn'}",
        "--quiet",
    ]
    return run_for_result(cmd, "distgnn", env=checkout_env(root, ROOT))


# -- DistDGL ----------------------------------------------------------------------------------------


def dgl_paths(args) -> tuple[Path, Path, Path]:
    root = Path(args.workdir) / "dgl"
    return root, root / "parts" / f"{DGL_GRAPH_NAME}.json", root / "ip_config.txt"


def _graph_key(args) -> dict:
    return {k: getattr(args, k) for k in ("num_papers", "feat_dim", "num_classes", "seed")}


def dgl_partition(args) -> None:
    """The DGL heterograph of the same synthetic-mag graph, partitioned by DGL's own METIS path."""
    import dgl
    import torch

    from distgnn.data.synthetic_mag import synthetic_mag

    graph = synthetic_mag(args.num_papers, seed=args.seed, feat_dim=args.feat_dim, num_classes=args.num_classes)
    edges = {etype: (torch.from_numpy(s), torch.from_numpy(d)) for etype, (s, d) in graph.edges.items()}
    g = dgl.heterograph(edges, num_nodes_dict=dict(graph.num_nodes))
    for ntype, arrays in graph.ndata.items():
        for name, arr in arrays.items():
            g.nodes[ntype].data[name] = torch.from_numpy(arr)
    root, part_config, _ = dgl_paths(args)
    t = time.perf_counter()
    dgl.distributed.partition_graph(g, DGL_GRAPH_NAME, NUM_MACHINES, str(part_config.parent), part_method="metis")
    print(f"DGL partition_graph took {time.perf_counter() - t:.1f}s", file=sys.stderr)
    (root / "done.json").write_text(json.dumps(_graph_key(args)))


def run_dgl(args) -> dict:
    root, _, ip_config = dgl_paths(args)
    done = root / "done.json"
    if not done.exists() or json.loads(done.read_text()) != _graph_key(args):
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        subprocess.run([sys.executable, __file__, *sys.argv[1:], "--role=dgl-partition"], check=True)
    ports = [free_port() for _ in range(NUM_MACHINES)]
    ips = DGL_IPS[:NUM_MACHINES]
    ip_config.write_text("".join(f"{ip} {port}\n" for ip, port in zip(ips, ports, strict=True)))
    master_port = free_port()
    machines = [
        in_private_shm(
            [
                sys.executable,
                __file__,
                *sys.argv[1:],
                "--role=dgl-machine",
                f"--machine={m}",
                f"--master-port={master_port}",
            ]
        )
        for m in range(NUM_MACHINES)
    ]
    return run_simulated_machines(machines, "distdgl", dict(os.environ))


def dgl_machine(args) -> int:
    """One simulated DGL machine: its server and its trainers (inside the machine's mount namespace)."""
    _, part_config, ip_config = dgl_paths(args)
    trainers = args.trainers_per_machine
    base = {
        **os.environ,
        "DGL_DIST_MODE": "distributed",
        "DGL_IP_CONFIG": str(ip_config),
        "DGL_NUM_SERVER": "1",
        "DGL_NUM_CLIENT": str(NUM_MACHINES * trainers),
        "DGL_CONF_PATH": str(part_config),
        "DGL_GRAPH_FORMAT": "csc",
        "OMP_NUM_THREADS": "1",
    }
    server = subprocess.Popen(
        [sys.executable, __file__, *sys.argv[1:], "--role=dgl-server"],
        env={**base, "DGL_ROLE": "server", "DGL_SERVER_ID": str(args.machine)},
    )
    procs = []
    for local in range(trainers):
        env = {
            **base,
            "DGL_ROLE": "client",
            "DGL_NUM_SAMPLER": "0",
            "DGL_GROUP_ID": "0",
            "RANK": str(args.machine * trainers + local),
            "WORLD_SIZE": str(NUM_MACHINES * trainers),
            "LOCAL_RANK": str(local),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(args.master_port),
        }
        cmd = [sys.executable, __file__, *sys.argv[1:], "--role=dgl-trainer", f"--local-rank={local}"]
        procs.append(subprocess.Popen(cmd, env=env))
    codes = [p.wait() for p in procs]
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    return next((c for c in codes if c), 0)


def dgl_server(args) -> int:
    import dgl

    _, _, ip_config = dgl_paths(args)
    dgl.distributed.initialize(str(ip_config))  # a server serves inside initialize and exits the process
    return 0


def dgl_init_emb(shape, dtype):
    """DGL's example's embedding initialiser (module level: DistDGL pickles it to the servers)."""
    import torch

    return torch.empty(shape, dtype=dtype).uniform_(-1.0, 1.0)


def _dgl_model(args, g, num_classes: int):
    """The embedding layer and R-GCN of DGL's distributed R-GCN example, on DGL's public API."""
    import dgl
    import torch
    import torch.nn.functional as F
    from dgl import nn as dglnn
    from torch import nn

    class RelGraphConvLayer(nn.Module):
        def __init__(self, in_feat, out_feat, rel_names, num_bases, activation=None, dropout=0.0):
            super().__init__()
            self.rel_names = rel_names
            self.activation = activation
            self.conv = dglnn.HeteroGraphConv(
                {rel: dglnn.GraphConv(in_feat, out_feat, norm="right", weight=False, bias=False) for rel in rel_names}
            )
            self.use_basis = num_bases < len(rel_names)
            if self.use_basis:
                self.basis = dglnn.WeightBasis((in_feat, out_feat), num_bases, len(rel_names))
            else:
                self.weight = nn.Parameter(torch.empty(len(rel_names), in_feat, out_feat))
                nn.init.xavier_uniform_(self.weight, gain=nn.init.calculate_gain("relu"))
            self.h_bias = nn.Parameter(torch.zeros(out_feat))
            self.loop_weight = nn.Parameter(torch.empty(in_feat, out_feat))
            nn.init.xavier_uniform_(self.loop_weight, gain=nn.init.calculate_gain("relu"))
            self.dropout = nn.Dropout(dropout)

        def forward(self, block, inputs):
            weight = self.basis() if self.use_basis else self.weight
            wdict = {
                rel: {"weight": w.squeeze(0)} for rel, w in zip(self.rel_names, torch.split(weight, 1, 0), strict=True)
            }
            inputs_dst = {k: v[: block.number_of_dst_nodes(k)] for k, v in inputs.items()}
            hs = self.conv(block, inputs, mod_kwargs=wdict)

            def apply(ntype, h):
                h = h + inputs_dst[ntype] @ self.loop_weight + self.h_bias
                if self.activation:
                    h = self.activation(h)
                return self.dropout(h)

            return {ntype: apply(ntype, h) for ntype, h in hs.items()}

    class EntityClassify(nn.Module):
        def __init__(self, rel_names, num_layers):
            super().__init__()
            dims = [args.hidden] * num_layers + [num_classes]
            self.layers = nn.ModuleList(
                RelGraphConvLayer(
                    dims[i],
                    dims[i + 1],
                    rel_names,
                    args.num_bases,
                    activation=F.relu if i < num_layers - 1 else None,
                    dropout=args.dropout if i < num_layers - 1 else 0.0,
                )
                for i in range(num_layers)
            )

        def forward(self, blocks, h):
            for layer, block in zip(self.layers, blocks, strict=True):
                h = layer(block, h)
            return h

    class DistEmbedLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.g = g
            self.node_projs = nn.ModuleDict()
            self.node_embeds = {}
            for ntype in g.ntypes:
                if "feat" in g.nodes[ntype].data:
                    self.node_projs[ntype] = nn.Linear(g.nodes[ntype].data["feat"].shape[1], args.hidden)
                    nn.init.xavier_uniform_(self.node_projs[ntype].weight)
                else:
                    self.node_embeds[ntype] = dgl.distributed.DistEmbedding(
                        g.num_nodes(ntype),
                        args.hidden,
                        f"node_emb_{ntype}",
                        dgl_init_emb,
                        g.get_node_partition_policy(ntype),
                    )

        def forward(self, node_ids):
            embeds = {}
            for ntype, ids in node_ids.items():
                if ntype in self.node_projs:
                    embeds[ntype] = self.node_projs[ntype](self.g.nodes[ntype].data["feat"][ids])
                else:
                    embeds[ntype] = self.node_embeds[ntype](ids)
            return embeds

    return DistEmbedLayer(), EntityClassify(g.etypes, len(args.fanouts.split(",")))


def dgl_trainer(args) -> int:
    import dgl
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    pin_dgl_machine(args.machine)
    torch.set_num_threads(1)
    _, part_config, ip_config = dgl_paths(args)
    dgl.distributed.initialize(str(ip_config))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g = dgl.distributed.DistGraph(DGL_GRAPH_NAME, part_config=str(part_config))
    book = g.get_partition_book()

    def split(mask_name):
        return dgl.distributed.node_split(g.nodes[TARGET].data[mask_name], book, ntype=TARGET, force_even=True)

    train_nid = split("train_mask")
    labels = g.nodes[TARGET].data["label"]
    num_classes = args.num_classes
    torch.manual_seed(args.seed)
    embed_layer, model = _dgl_model(args, g, num_classes)
    model = DistributedDataParallel(model)
    embed_layer = DistributedDataParallel(embed_layer)
    emb_optimizer = dgl.distributed.optim.SparseAdam(list(embed_layer.module.node_embeds.values()), lr=args.sparse_lr)
    optimizer = torch.optim.Adam(
        list(model.parameters()) + list(embed_layer.module.node_projs.parameters()), lr=args.lr
    )
    fanouts = [int(f) for f in args.fanouts.split(",")]
    sampler = dgl.dataloading.MultiLayerNeighborSampler(fanouts)
    loader = dgl.dataloading.DistNodeDataLoader(
        g, {TARGET: train_nid}, sampler, batch_size=args.batch_size, shuffle=True, drop_last=False
    )
    counts = torch.tensor([-(-len(train_nid) // args.batch_size)])
    dist.all_reduce(counts, op=dist.ReduceOp.MIN)
    num_batches = int(counts) if not args.max_batches else min(int(counts), args.max_batches)
    epoch_times, seps, splits = [], [], []
    for epoch in range(args.epochs):
        model.train()
        embed_layer.train()
        clock = StepClock()
        edges = 0
        loss_sum = correct = seen = 0.0
        start = time.perf_counter()
        it = iter(loader)
        for _ in range(num_batches):
            clock.start()
            input_nodes, seeds, blocks = next(it)
            clock.lap("sample")
            feats = embed_layer(input_nodes)
            y = labels[seeds[TARGET]]
            clock.lap("fetch")
            logits = model(blocks, feats)[TARGET]
            loss = F.cross_entropy(logits, y)
            clock.lap("forward")
            optimizer.zero_grad()
            emb_optimizer.zero_grad()
            loss.backward()
            clock.lap("backward")
            optimizer.step()
            emb_optimizer.step()
            clock.lap("optimizer")
            edges += sum(b.num_edges(etype) for b in blocks for etype in b.canonical_etypes)
            loss_sum += loss.item() * len(y)
            correct += float((logits.argmax(1) == y).sum())
            seen += len(y)
        elapsed = time.perf_counter() - start
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
    t = time.perf_counter()
    model.eval()
    embed_layer.eval()
    eval_counts = []
    with torch.no_grad():
        for mask_name in ("val_mask", "test_mask"):
            eval_loader = dgl.dataloading.DistNodeDataLoader(
                g, {TARGET: split(mask_name)}, sampler, batch_size=args.eval_batch_size, shuffle=False
            )
            right = total = 0
            for input_nodes, seeds, blocks in eval_loader:
                pred = model(blocks, embed_layer(input_nodes))[TARGET].argmax(1)
                y = labels[seeds[TARGET]]
                right, total = right + int((pred == y).sum()), total + len(y)
            eval_counts += [float(right), float(total)]
    eval_counts = torch.tensor(eval_counts, dtype=torch.float64)
    dist.all_reduce(eval_counts)
    result = {
        "num_trainers": dist.get_world_size(),
        "batches_per_epoch": num_batches,
        "epoch_time_s": statistics.median(epoch_times),
        "epoch_times_s": epoch_times,
        "stage_split_s": splits,
        "seps": statistics.median(seps),
        "train_loss": float(totals[1] / totals[3]),
        "val_acc": float(eval_counts[0] / eval_counts[1]),
        "test_acc": float(eval_counts[2] / eval_counts[3]),
        "eval_time_s": time.perf_counter() - t,
    }
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    return 0


# -- table ------------------------------------------------------------------------------------------


def print_table(args, results: dict[str, dict]) -> None:
    cap = f"{args.max_batches} batches/epoch cap" if args.max_batches else "full epochs"
    trainers = NUM_MACHINES * args.trainers_per_machine
    print(
        f"\nR-GCN fanouts {args.fanouts} per edge type, hidden {args.hidden}, {args.num_bases} bases, batch "
        f"{args.batch_size}, synthetic-mag {args.num_papers:,} papers (seed {args.seed}), {NUM_MACHINES} machines x "
        f"{args.trainers_per_machine} trainers ({trainers}), {args.epochs} epochs, {cap}"
    )
    header = (
        "| system | batches/epoch | epoch s (median) | s/batch | SEPS | train loss | val acc | test acc |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    print(header)
    for name, r in results.items():
        per_batch = r["epoch_time_s"] / max(r["batches_per_epoch"], 1)
        print(
            f"| {name} | {r['batches_per_epoch']} | {r['epoch_time_s']:.2f} | {per_batch:.3f} | {r['seps']:,.0f} | "
            f"{r.get('train_loss', float('nan')):.4f} | {r['val_acc']:.4f} | {r['test_acc']:.4f} |"
        )
    if "distgnn" in results and "DistDGL" in results:
        a, b = results["distgnn"], results["DistDGL"]
        print(
            f"\ndistgnn epoch time / DistDGL epoch time: {a['epoch_time_s'] / b['epoch_time_s']:.2f} (goal <= 0.5); "
            f"test accuracy difference: {a['test_acc'] - b['test_acc']:+.4f}"
        )
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
