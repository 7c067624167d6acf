"""Layer-wise inference over all nodes on one GPU: held on the device vs the host-buffer path, products scale.

Builds the synthetic products-scale graph in this process (an InProcessGraph), a randomly initialised
3-layer GraphSAGE, and times :func:`distgnn.train.inference_gpu.layerwise_inference_on_device` (GPU sampler, device
buffers) at a few batch sizes against :func:`distgnn.train.inference.layerwise_inference` (CPU full-neighbour
sampling, host buffers), which is timed over a share of the nodes and scaled up (it would take tens of
seconds). Checks a few nodes against the model on their full 3-hop neighbourhoods. Prints a table.

    PYTHONPATH=. python3 benchmarks/inference_gpu.py                       # products scale (needs a GPU)
    PYTHONPATH=. python3 benchmarks/inference_gpu.py --num-nodes 20000     # a quick look
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from distgnn.data import synthetic
from distgnn.nn import GraphSAGE
from distgnn.sampling.neighbor import InProcessGraph, NeighborSampler
from distgnn.train.inference import layerwise_inference
from distgnn.train.inference_gpu import layerwise_inference_on_device


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-nodes", type=int, default=2_400_000)
    p.add_argument("--avg-degree", type=float, default=25.8)
    p.add_argument("--feat-dim", type=int, default=100)
    p.add_argument("--classes", type=int, default=47)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch-sizes", default="20000,100000,400000", help="of the on-device path")
    p.add_argument("--host-share", type=float, default=0.02, help="share of the nodes the host-buffer path runs")
    p.add_argument("--host-batch-size", type=int, default=10000, help="the example's --eval-batch-size")
    p.add_argument("--json", help="write the figures here")
    return p.parse_args()


def timed(device: torch.device, call) -> tuple[float, object]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, result


def main() -> None:
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.perf_counter()
    g = InProcessGraph(synthetic(args.num_nodes, args.avg_degree, args.feat_dim, args.classes, seed=0))
    print(f"graph {args.num_nodes} nodes, {g.num_edges()} edges in {time.perf_counter() - t0:.1f} s", flush=True)
    torch.manual_seed(0)
    model = GraphSAGE(args.feat_dim, args.hidden, args.classes, 3, 0.5).to(device)
    features = g.ndata["feat"].to(device)
    report: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    rows = []
    out = None
    for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
        layerwise_inference_on_device(model, g, features, batch_size, device)  # warm-up: builds, allocations
        seconds, out = timed(device, lambda b=batch_size: layerwise_inference_on_device(model, g, features, b, device))
        rows.append((f"on device, batch {batch_size}", seconds, seconds))
    share = torch.arange(int(args.num_nodes * args.host_share))

    def host_path():
        def new_buffer(layer, dim):
            return torch.zeros(args.num_nodes, dim)

        return layerwise_inference(model, g, share, g.ndata["feat"], args.host_batch_size, device, new_buffer)

    seconds, host_out = timed(device, host_path)
    rows.append((f"host buffers, {args.host_share:.0%} of nodes", seconds, seconds / args.host_share))
    check = torch.arange(0, args.num_nodes, max(1, args.num_nodes // 16))[:16]
    _, _, blocks = NeighborSampler([-1] * 3).sample_blocks(g, check)
    with torch.no_grad():
        model.eval()
        want = model.cpu()(blocks, g.ndata["feat"][blocks[0].src_nids])
    error = float((out[check.to(device)].cpu() - want).norm() / want.norm())
    print(f"\nrelative error vs the model on full neighbourhoods (16 nodes): {error:.2e}")
    base = rows[-1][2]
    print(f"{'variant':36} {'s measured':>10} {'s all nodes':>11} {'vs host':>8}")
    for name, measured, whole in rows:
        print(f"{name:36} {measured:10.2f} {whole:11.2f} {base / whole:7.1f}x")
    report.update(rows=rows, relative_error=error, host_rows=int(host_out.shape[0]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
