"""GraphSAGE mean aggregation on a GPU: the CUDA kernels (csrc/cuda/aggregate.cu) vs the torch reference path.

The batch of ``benchmarks/nn_step.py``: fanouts 15,10,5 (input layer first), batch 1024, on
``synthetic(1_000_000, avg_degree=20, feat_dim=100, num_classes=16)``, sampled on the CPU and moved to the GPU
once; a 3-layer GraphSAGE (mean), hidden 256, dropout 0.5, Adam. Two tables: the aggregation alone
(``self_and_mean`` / ``mean`` forward + backward of each layer's block at that layer's input width), and one
whole training step; milliseconds per call (median of ``--repeats`` timed with a host sync around each call,
so launch and sync overheads count, as they do in training).

    python benchmarks/aggregate_cuda.py [--repeats 50] [--num-nodes 1000000]
"""

from __future__ import annotations

import argparse
import statistics
import time


def timed(fn, repeats: int) -> float:
    import torch

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--num-nodes", type=int, default=1_000_000)
    args = p.parse_args()

    import torch
    import torch.nn.functional as F

    import distgnn.nn.aggregate as aggregate
    from distgnn.data import synthetic
    from distgnn.nn import GraphSAGE
    from distgnn.sampling.neighbor import NeighborSampler
    from distgnn.sampling.source import InProcessGraph

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    g = InProcessGraph(synthetic(args.num_nodes, 20, feat_dim=100, num_classes=16, seed=0))
    torch.manual_seed(0)
    input_nodes, output_nodes, blocks = NeighborSampler([15, 10, 5]).sample_blocks(
        g, torch.randperm(g.num_nodes())[:1024]
    )
    blocks = [b.to("cuda") for b in blocks]
    x = g.ndata["feat"][input_nodes].cuda()
    y = g.ndata["label"][output_nodes].cuda()
    model = GraphSAGE(100, 256, 16, num_layers=3, dropout=0.5).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)

    def step():
        loss = F.cross_entropy(model(blocks, x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    # (op, block, width) of each layer as SAGEConv calls it: [self | mean] where out >= in, else mean of fc_neigh(x).
    calls = []
    for block, (layer_in, layer_out) in zip(blocks, [(100, 256), (256, 256), (256, 16)], strict=True):
        with_self = layer_out >= layer_in
        calls.append(("self_and_mean" if with_self else "mean", block, layer_in if with_self else layer_out))

    native_cuda = aggregate._native_cuda
    rows = []
    for variant, use_kernels in (("CUDA kernels", True), ("torch reference", False)):
        aggregate._native_cuda = native_cuda if use_kernels else (lambda block, x: False)
        try:
            for name, block, width in calls:
                h = torch.randn(block.num_src, width, device="cuda", requires_grad=True)
                op = getattr(aggregate, name)

                def fwd_bwd(op=op, block=block, h=h):
                    out = op(block, h)
                    torch.autograd.grad(out, h, torch.ones_like(out))

                label = f"{name} dst={block.num_dst} src={block.num_src} E={block.num_edges} F={width}"
                rows.append((variant, label, timed(fwd_bwd, args.repeats)))
            rows.append((variant, "GraphSAGE training step", timed(step, args.repeats)))
        finally:
            aggregate._native_cuda = native_cuda

    device = torch.cuda.get_device_name()
    print(f"# {device}, torch {torch.__version__}, median of {args.repeats} calls, host sync after each")
    print(f"{'variant':<16} {'call':<64} {'ms':>8}")
    for variant, label, ms in rows:
        print(f"{variant:<16} {label:<64} {ms:8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
