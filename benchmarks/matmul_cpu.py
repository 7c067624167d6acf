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
    for rows, d_in, d_out in SHAPES:
        x = torch.randn(rows, d_in, generator=gen, requires_grad=True)
        weight = torch.randn(d_out, d_in, generator=gen, requires_grad=True)
        bias = torch.randn(d_out, generator=gen, requires_grad=True)
        grad = torch.randn(rows, d_out, generator=gen)
        out32 = torch.addmm(bias, x, weight.t())
        out16 = matmul._BF16Linear.apply(x, weight, bias)
        err = ((out16 - out32).norm() / out32.norm()).item()
        forward = (
            timed(lambda: torch.addmm(bias, x, weight.t()), args.repeat),
            timed(lambda: matmul._BF16Linear.apply(x, weight, bias), args.repeat),
        )
        backward = (
            timed(lambda: torch.autograd.grad(out32, (x, weight, bias), grad, retain_graph=True), args.repeat),
            timed(lambda: torch.autograd.grad(out16, (x, weight, bias), grad, retain_graph=True), args.repeat),
        )
        shape = f"{rows} x {d_in} x {d_out}"
        for name, (a, b) in (("forward", forward), ("backward", backward)):
            extra = f"{err:>9.1e}" if name == "forward" else ""
            print(f"{shape:>20} {name:>9} {a:>9.2f} {b:>9.2f} {a / b:>8.2f}x{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
