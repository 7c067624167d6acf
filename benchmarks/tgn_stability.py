"""How often a TGN run lands in a low-AP state: test AP over seeds and rounding-level perturbations of the weights.

distgnn's TGN as benchmarks/train_tgn.py trains it (CollegeMsg, PyG's example's configuration), once per (seed,
p): before training, every initial weight is multiplied by ``1 + eps * N(0, 1)`` drawn from a generator seeded
with p (p = 0: no perturbation; eps 1e-6 is float32 rounding level). A run whose test AP falls below
``--collapsed`` is counted as collapsed. A step that changes only the float trajectory (another kernel, another
summation order) samples the same distribution, so compare steps by this count, not by one seed's AP.

``--time-encoding learned`` trains the time encoders' frequencies (as TGN and PyG do; distgnn's default keeps
them fixed: the learned ones are what collapsed), ``--system pyg`` counts PyG's TGN the same way.

    python benchmarks/tgn_stability.py --seeds 0,1,2 --perturb 0,1,2,3          # CPU, 3 epochs
    python benchmarks/tgn_stability.py --device cuda --step graph --seeds 0,1,2,3,4
    python benchmarks/tgn_stability.py --time-encoding learned --seeds 0,1,2,3,4 --perturb 0,1,2,3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_tgn import COLLEGE_MSG, Ours, Pyg  # noqa: E402

from distgnn.temporal.job import load_stream  # noqa: E402


def perturb(model: torch.nn.Module, p: int, eps: float) -> None:
    """Multiplies each weight by ``1 + eps * N(0, 1)`` (generator seeded with ``p``); p = 0 leaves them."""
    if p == 0:
        return
    generator = torch.Generator().manual_seed(p)
    with torch.no_grad():
        for param in model.parameters():
            noise = torch.randn(param.shape, generator=generator).to(param.device)
            param.mul_(1 + eps * noise)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default=f"events:{COLLEGE_MSG}")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--step", default="auto", choices=("auto", "eager", "graph"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--perturb", default="0", help="noise generator seeds p (0: unperturbed), e.g. 0,1,2,3")
    parser.add_argument("--eps", type=float, default=1e-6)
    parser.add_argument("--collapsed", type=float, default=0.75, help="test AP below this counts as collapsed")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--system", default="distgnn", choices=("distgnn", "pyg"), help="whose TGN to train")
    parser.add_argument(
        "--time-encoding",
        default="fixed",
        choices=("fixed", "learned"),
        help="distgnn's time encoders (the example's flag)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(
        f"{args.dataset}, {args.system}, device {args.device}, step {args.step}, time encoding {args.time_encoding}, "
        f"{args.epochs} epochs, eps {args.eps:g}; "
        f"{time.strftime('%Y-%m-%d %H:%M')}"
    )
    print(f"{'seed':>4} {'p':>3} {'val AP':>8} {'test AP':>8} {'s/epoch':>8}")
    collapsed = runs = 0
    for seed in [int(s) for s in args.seeds.split(",")]:
        events = load_stream(args.dataset, seed=seed)
        for p in [int(s) for s in args.perturb.split(",")]:
            if args.system == "pyg":
                ours = Pyg(events, device, seed)
                for module in (ours.memory, ours.gnn, ours.predictor):
                    perturb(module, p, args.eps)
            else:
                ours = Ours(events, device, seed, args.step, learn_time=args.time_encoding == "learned")
                perturb(ours.model, p, args.eps)
            seconds = sorted(ours.epoch() for _ in range(args.epochs))[args.epochs // 2]
            val, test = ours.evaluate()
            runs += 1
            collapsed += test < args.collapsed
            mark = "  collapsed" if test < args.collapsed else ""
            print(f"{seed:>4} {p:>3} {val:>8.4f} {test:>8.4f} {seconds:>8.2f}{mark}", flush=True)
    print(f"collapsed (test AP < {args.collapsed}): {collapsed} of {runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
