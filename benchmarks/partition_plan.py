"""docs/scale.md's plan for papers100M and MAG240M: memory per machine from ``partition/memory.py``'s estimate,
bytes each rank sends and the expected time of the distributed partition job, from counts alone.

    python benchmarks/partition_plan.py --throughput 1330000

``--throughput``: edges per CPU-second per rank, measured (docs/BENCHMARKS.md, "Distributed partitioning,
round three"); the network at ``--gbits``. One rank per machine, P = machines.
"""

from __future__ import annotations

import argparse
import math
from types import SimpleNamespace

import numpy as np

from distgnn.partition.distributed import uses_table
from distgnn.partition.memory import estimate_ranks

GIB = 1 << 30
# name: (nodes with features, nodes without, edges, feature row shape, feature dtype)
GRAPHS = {
    "papers100M": (111_059_956, 0, 1_615_685_872, (128,), "float32"),
    "MAG240M": (121_751_666, 244_160_499 - 121_751_666, 1_728_364_232, (768,), "float16"),
}


def _chunks(total: int, size: int) -> list[int]:
    n = -(-total // size)
    return [total // n + (1 if i < total % n else 0) for i in range(n)]


class _Layout(SimpleNamespace):
    """What ``estimate_ranks`` reads of a chunked layout."""

    @property
    def ntypes(self) -> list[str]:
        return list(self.num_nodes)

    def num_edges(self, etype) -> int:
        return sum(self.edge_chunks[etype])


def _layout(featured: int, other: int, edges: int, shape, dtype, node_chunk: int, edge_chunk: int) -> _Layout:
    etype = ("n", "e", "n")
    feat = SimpleNamespace(row_shape=shape, dtype=np.dtype(dtype))
    num_nodes, node_chunks, ndata = {"p": featured}, {"p": _chunks(featured, node_chunk)}, {"p": {"feat": feat}}
    if other:
        num_nodes["o"], node_chunks["o"], ndata["o"] = other, _chunks(other, node_chunk), {}
    return _Layout(
        num_nodes=num_nodes,
        node_chunks=node_chunks,
        etypes=[etype],
        edge_chunks={etype: _chunks(edges, edge_chunk)},
        ndata=ndata,
        edata={},
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--throughput", type=float, required=True, help="edges per CPU-second per rank")
    p.add_argument("--gbits", type=float, default=10.0)
    p.add_argument("--machines", default="8,16,100")
    p.add_argument("--node-chunk", type=int, default=500_000)
    p.add_argument("--edge-chunk", type=int, default=10_000_000)
    p.add_argument("--coarse-edges", type=int, default=50_000_000)
    args = p.parse_args()
    print("| graph | machines | edges per rank | memory per machine (random / metis, rank 0 of metis) | bytes each "
          "rank sends (renumber + edges + features) | rounds per exchange (dispatch) | expected time (random) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, (featured, other, edges, shape, dtype) in GRAPHS.items():
        layout = _layout(featured, other, edges, shape, dtype, args.node_chunk, args.edge_chunk)
        nodes = featured + other
        row = int(np.prod(shape)) * np.dtype(dtype).itemsize + 8
        for w in (int(m) for m in args.machines.split(",")):
            random = max(e.peak_bytes for e in estimate_ranks(layout, w, w, "random"))
            metis = estimate_ranks(layout, w, w, "metis", coarse_edges=args.coarse_edges)
            per_rank = edges / w
            table = uses_table("auto", nodes, edges, w)
            renumber = 4 * nodes * (w - 1) / w if table else 32 * per_rank
            dispatch, feats = 12 * per_rank, row * featured / w
            rounds = math.ceil(dispatch / (256 << 20))
            seconds = per_rank / args.throughput
            network = (renumber + dispatch + feats) * 8 / (args.gbits * 1e9)
            time = f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"
            print(
                f"| {name} | {w} | {per_rank / 1e6:.1f}M | {random / GIB:.1f} GiB / "
                f"{max(e.peak_bytes for e in metis[1:]) / GIB:.1f} GiB, {metis[0].peak_bytes / GIB:.1f} GiB | "
                f"{'table' if table else 'lookups'} {renumber / 1e9:.1f} GB + {dispatch / 1e9:.1f} GB + "
                f"{feats / 1e9:.1f} GB | {rounds} | {time} + {network:.0f} s |"
            )


if __name__ == "__main__":
    main()
