"""One sampled layer's relabel on the GPU: the torch path (unique + first-appearance ranking) vs the hash-table
kernel (``distgnn.sampling.gpu.relabel``), on layers shaped like GraphSAGE's (1024 seeds, fanouts 15,10,5).

    python3 benchmarks/relabel_gpu.py            # on a GPU; on a CPU it times the CPU paths (a smoke test)
"""

from __future__ import annotations

import argparse
import time

import torch

from distgnn.sampling import gpu as on_device


def layer(num_dst: int, fanout: int, num_nodes: int, generator: torch.Generator, device: torch.device):
    dst = torch.randperm(num_nodes, generator=generator)[:num_dst]
    counts = torch.full((num_dst,), fanout, dtype=torch.int64)
    # Power-law-ish sources: squaring a uniform draw favours low ids, so sources repeat as in a real layer.
    src = (torch.rand(num_dst * fanout, generator=generator) ** 2 * num_nodes).long()
    eids = torch.arange(num_dst * fanout)
    return [t.to(device) for t in (dst, counts, src, eids)]


def timed(fn, device: torch.device, repeats: int) -> float:
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / repeats * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-nodes", type=int, default=4_000_000)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    generator = torch.Generator().manual_seed(0)
    print(f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}")
    print(f"{'dst':>8} {'edges':>9} {'torch us':>9} {'kernel us':>10} {'speedup':>8}")
    for num_dst, fanout in ((1024, 5), (5_000, 10), (50_000, 15)):
        tensors = layer(num_dst, fanout, args.num_nodes, generator, device)
        want = on_device.to_block(*tensors, validate=False, impl="torch")
        got = on_device.to_block(*tensors, validate=False, impl="kernel")
        assert torch.equal(got.src_nids, want.src_nids) and torch.equal(got.indices, want.indices), "mismatch"
        times = {}
        for impl in ("torch", "kernel"):
            times[impl] = timed(
                lambda impl=impl, tensors=tensors: on_device.to_block(*tensors, validate=False, impl=impl),
                device,
                args.repeats,
            )
        by_torch, by_kernel = times["torch"], times["kernel"]
        print(f"{num_dst:8d} {num_dst * fanout:9d} {by_torch:9.1f} {by_kernel:10.1f} {by_torch / by_kernel:7.2f}x")


if __name__ == "__main__":
    main()
