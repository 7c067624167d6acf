"""How stable a TGN's training is: training-loss rises and test AP over seeds and rounding-level perturbations.

distgnn's TGN as benchmarks/train_tgn.py trains it (PyG's example's configuration), once per (seed, p): before
training, every initial weight is multiplied by ``1 + eps * N(0, 1)`` drawn from a generator seeded with p
(p = 0: no perturbation; eps 1e-6 is float32 rounding level). A step that changes only the float trajectory
(another kernel, another summation order) samples the same distribution, so compare steps by these counts, not
by one seed's figures. Per run: the mean training loss of every epoch, the validation and test AP after the
last epoch. Counted:

* a **rise**: an epoch after the second (the third on, counted from 1) whose mean training loss exceeds the
  previous epoch's by more than ``--rise`` (0.10: 10%); a run with one or more is an unstable run;
* a **collapse**: test AP below ``--collapsed``.

The default is the stability goal's protocol: seeds 0-4 x p 0-3 (20 runs), 10 epochs. Training variants to
compare against the default (each a library option): ``--clip-grad-norm X`` (every step's global gradient norm
at most X), ``--warmup-batches N`` (each epoch's first N batches only move the memory, without a gradient),
``--normalize-memory`` (the attention reads each memory row normalised: TGN's ``normalize_memory``);
``--time-encoding learned`` trains the time encoders' frequencies, ``--system pyg`` runs PyG's TGN (test AP and
collapses only). ``--jobs N`` runs N runs at once, one process and one torch thread each.

    python benchmarks/tgn_stability.py --jobs 2                       # CollegeMsg, 20 runs x 10 epochs
    python benchmarks/tgn_stability.py --jobs 2 --columns src,dst,rating,time \\
        --dataset events:../shared/data/snap/soc-sign-bitcoinotc.csv
    python benchmarks/tgn_stability.py --jobs 2 --clip-grad-norm 1
    python benchmarks/tgn_stability.py --device cuda --step graph --seeds 0,1,2,3,4 --perturb 0
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_tgn import BATCH, COLLEGE_MSG, Ours, Pyg  # noqa: E402

from distgnn.data.events import parse_columns  # noqa: E402
from distgnn.temporal.job import load_stream  # noqa: E402
from distgnn.temporal.train import batch_ranges, train_epoch  # noqa: E402


def perturb(model: torch.nn.Module, p: int, eps: float) -> None:
    """Multiplies each weight by ``1 + eps * N(0, 1)`` (generator seeded with ``p``); p = 0 leaves them."""
    if p == 0:
        return
    generator = torch.Generator().manual_seed(p)
    with torch.no_grad():
        for param in model.parameters():
            noise = torch.randn(param.shape, generator=generator).to(param.device)
            param.mul_(1 + eps * noise)


def rises(losses: list[float], rise: float) -> list[int]:
    """Epochs (counted from 0) after the second whose loss exceeds the previous epoch's by more than ``rise``."""
    return [e for e in range(2, len(losses)) if losses[e] > losses[e - 1] * (1 + rise)]


def one_run(args: argparse.Namespace, seed: int, p: int) -> dict:
    """Trains one (seed, p) run for ``--epochs`` and returns its figures."""
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    events = load_stream(args.dataset, seed=seed, columns=args.columns)
    losses: list[float] = []
    seconds = []
    if args.system == "pyg":
        ours = Pyg(events, device, seed)
        for module in (ours.memory, ours.gnn, ours.predictor):
            perturb(module, p, args.eps)
        seconds = [ours.epoch() for _ in range(args.epochs)]
    else:
        ours = Ours(events, device, seed, args.step, learn_time=args.time_encoding == "learned")
        if args.normalize_memory:  # parameter-free: the initial weights are the default's
            ours.model.memory_norm = torch.nn.LayerNorm(ours.model.memory_dim, elementwise_affine=False)
        ours.runner.clip_grad_norm = args.clip_grad_norm
        if args.clip_grad_norm is not None:
            ours.runner.graphed = False  # the CUDA graph step does not clip
        perturb(ours.model, p, args.eps)
        batches = batch_ranges(0, ours.train_end, BATCH)
        for _ in range(args.epochs):
            loss, timing = train_epoch(ours.runner, batches, ours.optimizer, warmup=args.warmup_batches)
            losses.append(loss)
            seconds.append(timing.seconds)
    val, test = ours.evaluate()
    return {
        "seed": seed,
        "p": p,
        "losses": losses,
        "rises": rises(losses, args.rise),
        "val_ap": val,
        "test_ap": test,
        "s_per_epoch": statistics.median(seconds),
    }


def line(run: dict, collapsed: float) -> str:
    losses = " ".join(f"{v:.3f}" for v in run["losses"])
    marks = ("  rise at " + ",".join(map(str, run["rises"])) if run["rises"] else "") + (
        "  collapsed" if run["test_ap"] < collapsed else ""
    )
    return (
        f"{run['seed']:>4} {run['p']:>3} {run['val_ap']:>8.4f} {run['test_ap']:>8.4f} {run['s_per_epoch']:>8.2f}"
        f"  {losses}{marks}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default=f"events:{COLLEGE_MSG}")
    parser.add_argument("--columns", type=parse_columns, default=None, help="as the example's --columns")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--step", default="auto", choices=("auto", "eager", "graph"))
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--perturb", default="0,1,2,3", help="noise generator seeds p (0: unperturbed)")
    parser.add_argument("--eps", type=float, default=1e-6)
    parser.add_argument("--rise", type=float, default=0.10, help="a loss above the previous epoch's x (1 + this)")
    parser.add_argument("--collapsed", type=float, default=0.75, help="test AP below this counts as collapsed")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (one process each)")
    parser.add_argument("--system", default="distgnn", choices=("distgnn", "pyg"), help="whose TGN to train")
    parser.add_argument(
        "--time-encoding", default="fixed", choices=("fixed", "learned"), help="distgnn's time encoders"
    )
    parser.add_argument("--clip-grad-norm", type=float, default=None, help="largest gradient norm of a step")
    parser.add_argument("--warmup-batches", type=int, default=0, help="batches an epoch replays before training")
    parser.add_argument("--normalize-memory", action="store_true", help="the attention reads normalised memory")
    parser.add_argument("--json", default=None, help="also write every run's figures to this file")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # SEED:P, one run, a JSON line out
    args = parser.parse_args()
    if args.one is not None:
        seed, p = (int(v) for v in args.one.split(":"))
        print(json.dumps(one_run(args, seed, p)), flush=True)
        return 0
    variant = (
        f"clip-grad-norm {args.clip_grad_norm}, warmup-batches {args.warmup_batches}, "
        f"normalize-memory {args.normalize_memory}"
        if args.system == "distgnn"
        else "PyG"
    )
    print(
        f"{args.dataset}, {args.system}, device {args.device}, step {args.step}, time encoding {args.time_encoding}, "
        f"{variant}, {args.epochs} epochs, eps {args.eps:g}; {time.strftime('%Y-%m-%d %H:%M')}",
        flush=True,
    )
    print(f"{'seed':>4} {'p':>3} {'val AP':>8} {'test AP':>8} {'s/epoch':>8}  training loss by epoch", flush=True)
    pairs = [(int(s), int(p)) for s in args.seeds.split(",") for p in args.perturb.split(",")]
    passed = [a for a in sys.argv[1:]]
    runs, running = [], []
    while pairs or running:
        while pairs and len(running) < args.jobs:
            seed, p = pairs.pop(0)
            cmd = [sys.executable, __file__, *passed, "--one", f"{seed}:{p}"]
            running.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
        proc = running.pop(0)
        out, _ = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"a run failed (exit {proc.returncode}): {' '.join(proc.args)}")
        runs.append(json.loads(out.strip().splitlines()[-1]))
        print(line(runs[-1], args.collapsed), flush=True)
    tests = [r["test_ap"] for r in runs]
    unstable = sum(bool(r["rises"]) for r in runs)
    collapsed = sum(t < args.collapsed for t in tests)
    print(
        f"runs {len(runs)}; with a rise > {args.rise:.0%} after epoch 2: {unstable}; collapsed (test AP < "
        f"{args.collapsed}): {collapsed}; test AP median {statistics.median(tests):.4f} "
        f"[{min(tests):.4f}, {max(tests):.4f}]",
        flush=True,
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
