"""One GraphSAGE training step on the CPU: distgnn's layer kernels vs its torch path vs DGL 1.1.3's SAGEConv.

The batch is the one ``benchmarks/train.py`` trains on: fanouts 15,10,5 (input
layer first), batch 1024, on ``synthetic(1_000_000, avg_degree=20,
feat_dim=100, num_classes=16)``; the model is a 3-layer GraphSAGE (mean),
hidden 256, ReLU + dropout 0.5 between layers, Adam; one torch thread (as each
trainer of the training benchmark has). Every variant runs in its own process
(glibc malloc settings are per process), with and without
``distgnn.train.allocator.keep_freed_memory()``:

* ``distgnn kernels``: ``distgnn.nn.GraphSAGE`` as shipped (C++ mean aggregation
  and fused ReLU + dropout on the CPU);
* ``distgnn torch path``: the same model on its torch reference ops (CSR
  ``torch.sparse.mm`` mean, ``F.dropout(F.relu(.))``): what it ran before the kernels;
* ``DGL 1.1.3``: ``dgl.nn.SAGEConv(aggregator_type="mean")`` layers on the same
  blocks (converted with ``distgnn.nn.convert.to_dgl_block``), skipped without dgl.

It also prints how much resident memory the steps added (the price of keeping freed memory), after the
timed steps and over ``--varied-steps`` more on batches of 256-1536 seeds (whether the heap creeps).

    python benchmarks/nn_step.py [--steps 10] [--num-nodes 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from distgnn.train.result import read_result

VARIANTS = ("distgnn kernels", "distgnn torch path", "DGL 1.1.3")


def measure(args) -> dict:
    import torch
    import torch.nn.functional as F
    from torch import nn

    import distgnn.nn.aggregate as aggregate
    import distgnn.nn.models as models
    from distgnn.data import synthetic
    from distgnn.nn import GraphSAGE
    from distgnn.nn.convert import to_dgl_block
    from distgnn.sampling.neighbor import NeighborSampler
    from distgnn.sampling.source import InProcessGraph
    from distgnn.train.allocator import keep_freed_memory

    if args.malloc == "tuned":
        keep_freed_memory()
    torch.set_num_threads(1)
    g = InProcessGraph(synthetic(args.num_nodes, 20, feat_dim=100, num_classes=16, seed=0))
    torch.manual_seed(0)
    sampler = NeighborSampler([15, 10, 5])

    def batch(size: int):
        input_nodes, output_nodes, blocks = sampler.sample_blocks(g, torch.randperm(g.num_nodes())[:size])
        blocks = [to_dgl_block(b) for b in blocks] if args.variant == "DGL 1.1.3" else blocks
        return blocks, g.ndata["feat"][input_nodes], g.ndata["label"][output_nodes]

    if args.variant == "distgnn torch path":
        aggregate._native = lambda block, x: False
        models.relu_dropout = lambda h, p, training: F.dropout(F.relu(h), p, training)
    if args.variant == "DGL 1.1.3":
        from dgl.nn import SAGEConv

        class DGLSage(nn.Module):
            def __init__(self):
                super().__init__()
                dims = [100, 256, 256, 16]
                self.layers = nn.ModuleList(SAGEConv(a, b, "mean") for a, b in zip(dims[:-1], dims[1:], strict=True))
                self.dropout = nn.Dropout(0.5)

            def forward(self, blocks, h):
                for i, (layer, block) in enumerate(zip(self.layers, blocks, strict=True)):
                    h = layer(block, h)
                    if i != len(self.layers) - 1:
                        h = self.dropout(F.relu(h))
                return h

        model = DGLSage()
    else:
        model = GraphSAGE(100, 256, 16, num_layers=3, dropout=0.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)

    def step(blocks, x, y):
        loss = F.cross_entropy(model(blocks, x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    rss_before = _rss_mib()
    torch.manual_seed(0)
    fixed = batch(1024)
    for _ in range(3):  # warm-up (and, with the allocator setting, the heap grows to the step's working set)
        step(*fixed)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step(*fixed)
        times.append(time.perf_counter() - start)
    rss_fixed = _rss_mib() - rss_before
    # Then batches of varying size: does a heap that keeps freed memory creep as block sizes change?
    rss_varied = []
    for _ in range(args.varied_steps):
        step(*batch(int(torch.randint(256, 1536, (1,)))))
        rss_varied.append(_rss_mib() - rss_before)
    half = len(rss_varied) // 2
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "rss_fixed_mib": rss_fixed,
        "rss_varied_mid_mib": rss_varied[half - 1] if half else None,
        "rss_varied_end_mib": rss_varied[-1] if rss_varied else None,
    }


def _rss_mib() -> int:
    """Resident memory of this process (Linux), MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--num-nodes", type=int, default=1_000_000)
    p.add_argument("--varied-steps", type=int, default=30, help="steps on batches of 256-1536 seeds after the timing")
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--malloc", choices=("default", "tuned"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.variant:
        print("RESULT " + json.dumps(measure(args)), flush=True)
        return 0
    rows = {}
    for variant in VARIANTS:
        for malloc in ("default", "tuned"):
            cmd = [sys.executable, __file__, f"--steps={args.steps}", f"--num-nodes={args.num_nodes}"]
            cmd.append(f"--varied-steps={args.varied_steps}")
            proc = subprocess.run([*cmd, f"--variant={variant}", f"--malloc={malloc}"], capture_output=True, text=True)
            if proc.returncode != 0:
                if variant == "DGL 1.1.3" and "No module named 'dgl'" in proc.stderr:
                    print("DGL not installed: skipping its rows", file=sys.stderr)
                    break
                sys.stderr.write(proc.stderr)
                return 1
            rows[(variant, malloc)] = read_result(proc.stdout)
    base = rows.get(("DGL 1.1.3", "default"))
    print(
        f"\nGraphSAGE training step, batch 1024, fanouts 15,10,5, hidden 256, {args.num_nodes:,}-node graph, 1 thread"
    )
    header = f"{'variant':<20} {'malloc':<8} {'median s':>9} {'min s':>7} {'vs DGL (default malloc)':>24}"
    print(header + f" {'RSS+ fixed':>10} {'RSS+ varied (mid, end)':>23}")
    for (variant, malloc), r in rows.items():
        ratio = f"{r['median_s'] / base['median_s']:.2f}x" if base else "-"
        varied = f"{r['rss_varied_mid_mib']}, {r['rss_varied_end_mib']}"
        print(
            f"{variant:<20} {malloc:<8} {r['median_s']:>9.3f} {r['min_s']:>7.3f} {ratio:>24} "
            f"{r['rss_fixed_mib']:>10} {varied:>23}"
        )
    print(
        "RSS+ (MiB): resident memory added since before the warm-up, after the timed steps on the fixed batch, "
        "and halfway through / at the end of the steps on batches of varying size"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
