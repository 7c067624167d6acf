"""A GraphSAGE first layer's ``[x_dst | neighbour mean]`` on a CPU trainer: gathered rows, then the mean ('rows')
against the sums over the rows where they lie ('trainer', ``DistTensor.read_self_and_mean``'s kernel), one thread.

The batch is the one ``benchmarks/train.py`` trains on (fanouts 15,10,5 input layer first, batch 1024, on
``synthetic(1_000_000, avg_degree=20, feat_dim=100)``); the feature table stands for the two machines' shares:
rows of ids below ``--local-rows`` are this machine's (read in place, as from shared memory), the others arrive as
one pulled reply in the batch's order. Per batch, milliseconds (min and median over ``--batches`` fresh batches,
a 400 MB buffer written between runs so that no run starts with the rows in cache):

* rows: the local rows copied into a ``(num_src, F)`` matrix (``copy_rows``), the reply's rows scattered into it,
  then the C++ mean (``mean_aggregate``), what ``--aggregate-inputs rows`` does;
* trainer: ``mean_aggregate_tables`` over both tables at once, what ``read_self_and_mean`` runs once the
  replies are in (bitwise the same result as 'rows').

    python benchmarks/first_layer_inputs.py [--batches 6]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from distgnn.data import synthetic
from distgnn.native.cpu import extension
from distgnn.sampling.neighbor import NeighborSampler
from distgnn.sampling.source import InProcessGraph


@dataclass
class Batch:
    """One batch's first layer: source ids, CSR, the local table, the reply and the positions of each."""

    ext: Any
    ids: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    num_dst: int
    local_table: np.ndarray
    reply: np.ndarray
    local: np.ndarray
    remote: np.ndarray

    def rows_path(self) -> np.ndarray:
        width = self.reply.shape[1]
        x = np.empty((len(self.ids), width), dtype=np.float32)
        self.ext.copy_rows(self.local_table, self.ids[self.local], x, self.local, 1)
        self.ext.copy_rows(self.reply, None, x, self.remote, 1)
        out = np.empty((self.num_dst, 2 * width), dtype=np.float32)
        self.ext.mean_aggregate(self.indptr, self.indices, x, out, width, 0, 1)
        return out

    def tables(self) -> np.ndarray:
        width = self.reply.shape[1]
        out = np.empty((self.num_dst, 2 * width), dtype=np.float32)
        row_index = np.zeros(len(self.ids), dtype=np.int64)
        row_index[self.local], row_index[self.remote] = self.ids[self.local], np.arange(len(self.remote))
        row_table = np.zeros(len(self.ids), dtype=np.int64)
        row_table[self.remote] = 1
        tables = [self.local_table, self.reply]
        self.ext.mean_aggregate_tables(self.indptr, self.indices, tables, row_table, row_index, out, width, 0, 1)
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-nodes", type=int, default=1_000_000)
    p.add_argument("--local-rows", type=int, default=500_000)
    p.add_argument("--batches", type=int, default=6)
    args = p.parse_args()
    torch.set_num_threads(1)
    ext = extension()
    g = InProcessGraph(synthetic(args.num_nodes, 20, feat_dim=100, num_classes=16, seed=0))
    feat = g.ndata["feat"].numpy()
    local_table = np.ascontiguousarray(feat[: args.local_rows])
    sampler = NeighborSampler([15, 10, 5])
    flush = np.empty(400 << 20, dtype=np.uint8)
    times: dict[str, list[float]] = {"rows": [], "trainer": []}
    torch.manual_seed(0)
    for batch in range(args.batches):
        input_nodes, _, blocks = sampler.sample_blocks(g, torch.randperm(args.num_nodes)[:1024])
        ids, first = input_nodes.numpy(), blocks[0]
        indptr, indices = first.indptr.numpy(), first.indices.numpy()
        local = np.flatnonzero(ids < args.local_rows)
        remote = np.flatnonzero(ids >= args.local_rows)
        reply = np.ascontiguousarray(feat[ids[remote]])
        outputs = {}

        b = Batch(ext, ids, indptr, indices, first.num_dst, local_table, reply, local, remote)
        for name, fn in (("rows", b.rows_path), ("trainer", b.tables)):
            flush[:] = batch
            began = time.perf_counter()
            outputs[name] = fn()
            times[name].append((time.perf_counter() - began) * 1e3)
        assert np.array_equal(outputs["trainer"], outputs["rows"]), "the two paths differ"
    print(
        f"first layer inputs: {first.num_edges:,} edges, {len(ids):,} sources ({len(local):,} local), "
        f"{first.num_dst:,} destinations, F={feat.shape[1]}; one thread; {platform.processor() or platform.machine()}"
    )
    print(f"{'path':<22}{'min ms':>10}{'median ms':>12}{'vs rows (median)':>18}")
    base = statistics.median(times["rows"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<22}{min(values):>10.1f}{median:>12.1f}{median / base:>18.2f}")


if __name__ == "__main__":
    main()
