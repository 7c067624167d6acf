"""Checkpoint cost: save and resume of a job with a large DistEmbedding, against pulling the rows to rank 0.

A synthetic graph (default 1M nodes, average in-degree 10) in 2 random partitions served by a LocalCluster
(2 simulated machines, one main server each) and one trainer: GraphSAGE (fanouts 15,10,5, hidden 256) over
the node features concatenated with a learnable DistEmbedding (default 1M x 128 float32) trained with
SparseAdagrad, whose per-row state is another 1M x 128 table; dense Adam. Measured:

* ``distgnn.train.checkpoint`` save: every main server writes its own rows of both tables in parallel, rank 0
  the dense state; then resume (every server checks the sha256 of its files, then loads them);
* the peer in the same run: rank 0 pulls every row through RPC and writes the tables itself (what a
  trainer-side checkpoint without server ops would do), with the same checksummed writer;
* a training step's time (median over ``--steps`` steps), to express a save as a fraction of an epoch of
  ``ceil(train seeds / batch)`` steps (the epoch is estimated from the median step, not run in full).

    flock /tmp/distgnn-heavy.lock python benchmarks/checkpoint.py [--num-nodes 1000000] [--dim 128]
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from distgnn.client.context import connect
from distgnn.client.embedding import DistEmbedding, SparseAdagrad
from distgnn.client.graph import DistGraph
from distgnn.data import synthetic
from distgnn.loader.node import DistNodeDataLoader
from distgnn.nn import GraphSAGE
from distgnn.partition import partition_graph
from distgnn.sampling.neighbor import NeighborSampler
from distgnn.store import checkpoint_files as cio
from distgnn.train.checkpoint import Checkpointer
from distgnn.train.checkpoint_pieces import training_pieces
from distgnn.train.cluster import LocalCluster

PULL_ROWS = 200_000


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-nodes", type=int, default=1_000_000)
    p.add_argument("--avg-degree", type=float, default=10.0)
    p.add_argument("--feat-dim", type=int, default=32)
    p.add_argument("--dim", type=int, default=128, help="embedding width")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=8, help="training steps timed (after 2 warm-up steps)")
    p.add_argument("--repeats", type=int, default=2, help="saves (and peer saves) timed")
    p.add_argument("--workdir", default=None, help="partition and checkpoints go here (default: a temp dir)")
    return p.parse_args(argv)


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def pull_and_write(tensors, out: Path) -> int:
    """The peer: rank 0 reads every row through RPC and writes each table as one .npy."""
    out.mkdir(parents=True)
    total = 0
    for t in tensors:
        rows = np.empty(t.shape, dtype=np.float32)
        for begin in range(0, t.shape[0], PULL_ROWS):
            ids = torch.arange(begin, min(begin + PULL_ROWS, t.shape[0]))
            rows[begin : begin + len(ids)] = t.read(ids).numpy()
        total += cio.write_new_file(out / f"{t.name}.npy", rows)["bytes"]
    return total


def main(argv=None) -> None:
    args = parse_args(argv)
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="distgnn-ckpt-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        run(args, work)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> None:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    t = time.perf_counter()
    graph = synthetic(args.num_nodes, args.avg_degree, args.feat_dim, 16, seed=0)
    json_path = partition_graph(graph, 2, work / "parts", graph_name="bench", method="random", overwrite=True)
    num_train = int(np.asarray(graph.ndata["train_mask"]).sum())
    del graph
    print(f"graph and partition: {time.perf_counter() - t:.1f}s")
    with LocalCluster(json_path, rpc_timeout_s=120) as cluster, connect(cluster.config(0)) as ctx:
        g = DistGraph("bench", json_path, context=ctx)
        emb = DistEmbedding(args.num_nodes, args.dim, "bench_emb", context=ctx)
        sparse = SparseAdagrad([emb], lr=0.05)
        model = GraphSAGE(args.feat_dim + args.dim, 256, 16, num_layers=3, dropout=0.5)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
        train_ids = torch.nonzero(g.ndata["train_mask"][torch.arange(args.num_nodes)]).flatten()
        loader = DistNodeDataLoader(g, train_ids, NeighborSampler([15, 10, 5]), args.batch_size, shuffle=True)
        step_times = []
        batches = (batch for _ in iter(int, 1) for batch in loader)  # epoch after epoch
        for i in range(args.steps + 2):
            start = time.perf_counter()
            input_nodes, seeds, blocks = next(batches)
            x = torch.cat([g.ndata["feat"][input_nodes], emb(input_nodes)], 1)
            loss = F.cross_entropy(model(blocks, x), g.ndata["label"][seeds])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            sparse.step()
            if i >= 2:
                step_times.append(time.perf_counter() - start)
        step_s = statistics.median(step_times)
        epoch_steps = math.ceil(num_train / args.batch_size)
        epoch_s = step_s * epoch_steps
        state = {"model": model, "optimizer": optimizer, "loader": loader, "sparse_optimizers": [sparse]}

        saves, loads, peers = [], [], []
        ckpt = Checkpointer(work / "ckpt", every_n_steps=0, keep=1)
        size = 0
        for r in range(args.repeats):
            start = time.perf_counter()
            path = ckpt.save(r + 1, 0, training_pieces(**state))
            saves.append(time.perf_counter() - start)
            size = dir_bytes(path)
            start = time.perf_counter()
            ckpt.resume(str(path), training_pieces(**state))
            loads.append(time.perf_counter() - start)
            peer_dir = work / f"peer{r}"
            start = time.perf_counter()
            peer_bytes = pull_and_write([emb.weight, sparse.state[emb.name]], peer_dir)
            peers.append(time.perf_counter() - start)
            shutil.rmtree(peer_dir)
        loader.close()

    gb, peer_gb = size / 1e9, peer_bytes / 1e9
    save_s, load_s, peer_s = min(saves), min(loads), min(peers)
    print()
    print(
        f"graph {args.num_nodes:,} nodes, 2 machines; DistEmbedding {args.num_nodes:,} x {args.dim} + "
        f"SparseAdagrad state; train seeds {num_train:,}, batch {args.batch_size} -> {epoch_steps} steps/epoch"
    )
    print(f"training step (median of {len(step_times)}): {step_s:.3f}s -> epoch ~{epoch_s:.1f}s")
    print()
    print(f"| what | seconds (best of {args.repeats}) | GB | GB/s | fraction of an epoch | speed vs peer |")
    print("|---|---|---|---|---|---|")
    print(
        f"| save (servers write their rows in parallel) | {save_s:.2f} | {gb:.2f} | {gb / save_s:.2f} | "
        f"{save_s / epoch_s:.1%} | {peer_s / save_s:.2f}x |"
    )
    print(
        f"| resume (verify sha256, then load) | {load_s:.2f} | {gb:.2f} | {gb / load_s:.2f} | {load_s / epoch_s:.1%} | |"
    )
    print(
        f"| peer: rank 0 pulls both tables' rows, writes them | {peer_s:.2f} | {peer_gb:.2f} | {peer_gb / peer_s:.2f} | "
        f"{peer_s / epoch_s:.1%} | 1.0x |"
    )
    print(
        f"\nall times: save {[round(s, 2) for s in saves]}, resume {[round(s, 2) for s in loads]}, peer {[round(s, 2) for s in peers]}"
    )


if __name__ == "__main__":
    main()
