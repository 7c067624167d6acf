"""Where an R-GCN step spends on assembling rows, before and after commit 4e17b1a, in one process.

Two pieces of the R-GCN step at the sizes of layer 1 of ``benchmarks/train_hetero.py --num-papers 1000000``
(170k sources x 64 of four node types, 17k destinations, 60k (relation, destination) groups), forward and
backward, one torch thread, median of ``--repeat`` steps:

* typed placement: ``TypedInput`` putting each type's rows into source order: the earlier concatenation +
  gather by position (its gradient a scatter through a zero-filled buffer) against ``PlaceRows`` (each
  piece's rows written at their positions, each piece's gradient one ``index_select``);
* layer assembly: ``RelGraphConv``'s output: the earlier zero-filled output + ``index_add_`` + a self-loop
  product + a bias pass against the messages added into ``addmm(bias, x_dst, W_0)``.

    python benchmarks/typed_input_assembly.py [--repeat 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from distgnn.nn.hetero import PlaceRows

SOURCES, DESTINATIONS, GROUPS, WIDTH, TYPES = 170_000, 17_000, 60_000, 64, 4


def median_ms(step, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = step()
        out.backward(torch.ones_like(out))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=15)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    types = torch.randint(0, TYPES, (SOURCES,))
    wheres = [torch.nonzero(types == t).flatten() for t in range(TYPES)]
    rows = [torch.randn(len(w), WIDTH, requires_grad=True) for w in wheres]

    def concat_gather():
        where = torch.cat(wheres)
        position = torch.empty_like(where)
        position[where] = torch.arange(len(where))
        return torch.cat(rows)[position]

    def place_rows():
        return PlaceRows.apply(SOURCES, tuple(wheres), *rows)

    x = torch.randn(SOURCES, WIDTH, requires_grad=True)
    loop_weight = torch.randn(WIDTH, WIDTH, requires_grad=True)
    bias = torch.zeros(WIDTH, requires_grad=True)
    messages = torch.randn(GROUPS, WIDTH, requires_grad=True)
    dst = torch.randint(0, DESTINATIONS, (GROUPS,))

    def zero_filled():
        out = x.new_zeros((DESTINATIONS, WIDTH)).index_add_(0, dst, messages)
        return torch.addmm(out, x[:DESTINATIONS], loop_weight) + bias

    def into_self_loop():
        return torch.addmm(bias, x[:DESTINATIONS], loop_weight).index_add_(0, dst, messages)

    print(f"{'piece':<20} {'before ms':>10} {'after ms':>10} {'after/before':>13}")
    for name, before, after in (
        ("typed placement", concat_gather, place_rows),
        ("layer assembly", zero_filled, into_self_loop),
    ):
        b, a = median_ms(before, args.repeat), median_ms(after, args.repeat)
        print(f"{name:<20} {b:>10.1f} {a:>10.1f} {a / b:>13.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
