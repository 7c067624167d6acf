"""The GNN layers' products on the CPU: float32 against distgnn.nn.matmul's bfloat16 path (AMX), one thread.

For each shape (rows x in x out) of a 1M-node GraphSAGE batch ([15,10,5], batch 1024, hidden 256), the
forward product and the backward's two products, as ``distgnn.nn.matmul.linear`` runs them under
``--matmul-precision highest`` (float32, ``torch.addmm``) and ``medium`` (bfloat16 inputs, casts included),
milliseconds per call (median of ``--repeat``), and the relative error of the bfloat16 forward.

    python benchmarks/matmul_cpu.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import distgnn.nn.matmul as matmul
from distgnn.train.allocator import keep_freed_memory

SHAPES = ((56000, 200, 256), (6000, 512, 256), (1024, 512, 16))  # the three layers' [x_dst | mean] products


def timed(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def measure(rows: int, d_in: int, d_out: int, gen: torch.Generator, repeat: int):
    """((float32, bf16) forward ms, (float32, bf16) backward ms, relative error of the bf16 forward)."""
    x = torch.randn(rows, d_in, generator=gen, requires_grad=True)
    weight = torch.randn(d_out, d_in, generator=gen, requires_grad=True)
    bias = torch.randn(d_out, generator=gen, requires_grad=True)
    grad = torch.randn(rows, d_out, generator=gen)
    out32 = torch.addmm(bias, x, weight.t())
    out16 = matmul._BF16Linear.apply(x, weight, bias)
    err = ((out16 - out32).norm() / out32.norm()).item()
    forward = (
        timed(lambda: torch.addmm(bias, x, weight.t()), repeat),
        timed(lambda: matmul._BF16Linear.apply(x, weight, bias), repeat),
    )
    backward = tuple(
        timed(lambda out=out: torch.autograd.grad(out, (x, weight, bias), grad, retain_graph=True), repeat)
        for out in (out32, out16)
    )
    return forward, backward, err


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as a trainer runs
    if not matmul.cpu_has_matrix_units():
        print("this CPU has no AMX tiles: --matmul-precision medium keeps float32 products here")
        return 0
    print(f"{args.threads} thread(s), {time.strftime('%Y-%m-%d %H:%M')}; ms per call (median of {args.repeat})")
    print(f"{'rows x in x out':>20} {'pass':>9} {'float32':>9} {'bf16':>9} {'speed-up':>9} {'rel err':>9}")
    gen = torch.Generator().manual_seed(0)
    for shape in SHAPES:
        forward, backward, err = measure(*shape, gen, args.repeat)
        label = " x ".join(str(n) for n in shape)
        for name, (a, b) in (("forward", forward), ("backward", backward)):
            extra = f"{err:>9.1e}" if name == "forward" else ""
            print(f"{label:>20} {name:>9} {a:>9.2f} {b:>9.2f} {a / b:>8.2f}x{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
