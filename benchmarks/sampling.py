"""Multi-layer neighbour sampling throughput: distgnn's C++ sampler vs DGL 1.1.3.

One process, one synthetic graph (distgnn.data.synthetic) held as CSC of
in-edges, the same seed batches for both. A mini-batch samples every layer
like a real loader: pick neighbours of the current seeds, relabel the picked
edges into a block (distgnn.sampling.cpu.to_block / dgl.to_block), and
make the block's source nodes the next layer's seeds. SEPS counts the sampled
edges of all layers per second. Both libraries get the same thread count.

    flock /tmp/distgnn-heavy.lock python benchmarks/sampling.py
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-nodes", type=int, default=1_000_000)
    parser.add_argument("--avg-degree", type=float, default=20.0)
    parser.add_argument("--fanouts", default="15,10,5", help="per layer, seeds' layer first")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--num-batches", type=int, default=60, help="timed batches per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median round counts")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-dgl", action="store_true", help="time distgnn only")
    return parser.parse_args()


def make_csc(num_nodes: int, avg_degree: float, seed: int):
    """In-edge CSC of the synthetic graph: indptr, indices (int64), eids, train node ids."""
    import numpy as np

    from distgnn.data import synthetic

    graph = synthetic(num_nodes, avg_degree, feat_dim=1, num_classes=16, seed=seed)
    order = np.argsort(graph.dst, kind="stable")
    indices = graph.src[order]
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(graph.dst, minlength=num_nodes), out=indptr[1:])
    eids = np.arange(len(indices), dtype=np.int64)
    train_nids = np.flatnonzero(graph.ndata["train_mask"]).astype(np.int64)
    return indptr, indices, eids, train_nids


def distgnn_batch(indptr, indices, eids, seeds, fanouts, rng_seed, threads, relabel=True) -> int:
    from distgnn.sampling import cpu

    sampled = 0
    for layer, fanout in enumerate(fanouts):
        counts, positions, src = cpu.sample_neighbors(
            indptr, indices, seeds, fanout, rng_seed=rng_seed * 64 + layer, num_threads=threads, return_neighbors=True
        )
        edge_ids = cpu.take(eids, positions, num_threads=threads)
        sampled += len(positions)
        seeds = cpu.to_block(seeds, counts, src, edge_ids).src_nids.numpy() if relabel else src
    return sampled


def dgl_batch(dgl_graph, seeds, fanouts, relabel=True) -> int:
    import dgl

    sampled = 0
    for fanout in fanouts:
        frontier = dgl.sampling.sample_neighbors(dgl_graph, seeds, fanout, edge_dir="in")
        sampled += frontier.num_edges()
        if relabel:
            edge_ids = frontier.edata[dgl.EID]
            block = dgl.to_block(frontier, seeds)
            block.edata[dgl.EID] = edge_ids
            seeds = block.srcdata[dgl.NID]
        else:
            seeds = frontier.edges()[0]
    return sampled


def timed(run, batches) -> tuple[float, int]:
    start = time.perf_counter()
    edges = sum(run(i, seeds) for i, seeds in enumerate(batches))
    return time.perf_counter() - start, edges


def main() -> None:
    args = parse_args()
    # Thread counts are read when the OpenMP runtimes start, so set them before importing.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    fanouts = [int(f) for f in args.fanouts.split(",")]

    t0 = time.perf_counter()
    indptr, indices, eids, train_nids = make_csc(args.num_nodes, args.avg_degree, args.seed)
    print(f"graph: {args.num_nodes:,} nodes, {len(indices):,} edges, built in {time.perf_counter() - t0:.1f} s")

    rng = np.random.default_rng(args.seed)
    batches = [np.sort(rng.choice(train_nids, args.batch_size, replace=False)) for _ in range(args.num_batches)]
    warmup = batches[:3]

    runs = {
        "distgnn sample+relabel": lambda i, s: distgnn_batch(indptr, indices, eids, s, fanouts, i, args.threads),
        "distgnn sample only": lambda i, s: distgnn_batch(indptr, indices, eids, s, fanouts, i, args.threads, False),
    }
    if not args.no_dgl:
        import dgl

        dgl_graph = dgl.graph(
            ("csc", (torch.from_numpy(indptr), torch.from_numpy(indices), torch.from_numpy(eids))),
            num_nodes=args.num_nodes,
        ).formats("csc")
        torch_batches = [torch.from_numpy(b) for b in batches]
        torch_warmup = torch_batches[:3]
        runs["DGL 1.1.3 sample+to_block"] = lambda i, s: dgl_batch(dgl_graph, s, fanouts)
        runs["DGL 1.1.3 sample only"] = lambda i, s: dgl_batch(dgl_graph, s, fanouts, False)

    results: dict[str, list[tuple[float, int]]] = {name: [] for name in runs}
    for name, run in runs.items():
        timed(run, torch_warmup if name.startswith("DGL") else warmup)
    load_before = os.getloadavg()[0]
    for _ in range(args.rounds):
        for name, run in runs.items():
            results[name].append(timed(run, torch_batches if name.startswith("DGL") else batches))
    load_after = os.getloadavg()[0]

    print(
        f"\n{platform.machine()}, {os.cpu_count()} cores, threads={args.threads}; fanouts {args.fanouts}, "
        f"batch {args.batch_size}, {args.num_batches} batches x {args.rounds} rounds (median round); "
        f"1-min load average {load_before:.1f} before, {load_after:.1f} after\n"
    )
    header = f"{'sampler':<28}{'edges/batch':>12}{'ms/batch':>10}{'SEPS (M/s)':>12}{'vs DGL':>8}"
    print(header)
    print("-" * len(header))
    seconds = {name: statistics.median(t for t, _ in rounds) for name, rounds in results.items()}
    seps = {name: results[name][0][1] / seconds[name] for name in results}
    for name, rounds in results.items():
        peer = "DGL 1.1.3 " + name.split(" ", 1)[1].replace("sample+relabel", "sample+to_block")
        ratio = f"{seps[name] / seps[peer]:.2f}x" if peer in seps and not name.startswith("DGL") else ""
        print(
            f"{name:<28}{rounds[0][1] / args.num_batches:>12,.0f}{1e3 * seconds[name] / args.num_batches:>10.2f}"
            f"{seps[name] / 1e6:>12.2f}{ratio:>8}"
        )


if __name__ == "__main__":
    main()
