"""R-GCN accuracy on synthetic-mag: distributed (2 machines x 2 trainers) vs one process vs the MLP baseline.

Each seed generates its own synthetic-mag graph (the seed is the generator's and the trainers'), and the three
runs of a seed share its graph and its train/validation/test split:

* ``distributed``: ``examples/rgcn/train_dist.py --local``, 2 machines x 2 trainers (METIS partitions);
* ``single``: the same script with ``--single`` (one process, the whole graph in memory);
* ``mlp``: ``--single --model mlp``, the papers' own features only (no graph).

By default each of the 4 distributed trainers takes ``--batch-size / 4`` seeds per step, so both runs make
the same number of updates of the same global batch per epoch (DDP averages the trainers' gradients);
``--per-trainer-batch`` gives every trainer the whole ``--batch-size`` instead (4x the global batch, a
quarter of the updates).

The table gives test (and validation) accuracy per seed, the mean and spread (max - min) over seeds, and
the goals' differences: distributed - single (goal: within 1 point) and distributed - mlp (goal: >= 10).

    flock /tmp/distgnn-heavy.lock python benchmarks/rgcn_accuracy.py --num-papers 20000 --epochs 10 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from peers.distdgl_host import run_for_result

ROOT = Path(__file__).resolve().parents[1]
TRAIN_DIST = ROOT / "examples" / "rgcn" / "train_dist.py"
TRAINERS = 4
RUNS = {
    "distributed": ["--local", "--num-parts=2", f"--trainers-per-machine={TRAINERS // 2}"],
    "single": ["--single"],
    "mlp": ["--single", "--model=mlp"],
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-papers", type=int, default=20000)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (graph and training)")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per step of the single runs")
    p.add_argument(
        "--per-trainer-batch", action="store_true", help="every distributed trainer takes --batch-size seeds per step"
    )
    p.add_argument("--runs", default=",".join(RUNS), help="which of " + ",".join(RUNS))
    p.add_argument("--workdir", default=str(ROOT / ".work" / "bench-rgcn-accuracy"))
    p.add_argument("extra", nargs="*", help="more flags for train_dist.py (after --), e.g. --hidden=128")
    return p.parse_args(argv)


def run_one(args, name: str, seed: int) -> dict:
    batch = args.batch_size
    if name == "distributed" and not args.per_trainer_batch:
        batch //= TRAINERS
    cmd = [
        sys.executable,
        str(TRAIN_DIST),
        *RUNS[name],
        "--dataset=synthetic-mag",
        f"--num-papers={args.num_papers}",
        f"--epochs={args.epochs}",
        f"--batch-size={batch}",
        f"--seed={seed}",
        f"--workdir={args.workdir}",
        "--quiet",
        *args.extra,
    ]
    return run_for_result(cmd, f"{name} seed {seed}")


def main(argv=None) -> int:
    args = parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    names = args.runs.split(",")
    if unknown := set(names) - set(RUNS):
        raise SystemExit(f"error: --runs takes {','.join(RUNS)}; got unknown {sorted(unknown)}")
    results = {(n, s): run_one(args, n, s) for s in seeds for n in names}

    print(
        f"\nsynthetic-mag {args.num_papers:,} papers, {args.epochs} epochs, batch {args.batch_size} "
        f"{'per trainer' if args.per_trainer_batch else 'in all (distributed: per trainer / ' + str(TRAINERS) + ')'}"
        f", example defaults otherwise"
        f"{' ' + ' '.join(args.extra) if args.extra else ''}; seeds {args.seeds}"
    )
    header = (
        "| run | trainers x batches/epoch | "
        + " | ".join(f"test (val) seed {s}" for s in seeds)
        + " | test mean | spread |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    means = {}
    for n in names:
        tests = [results[n, s]["test_acc"] for s in seeds]
        means[n] = statistics.mean(tests)
        cells = " | ".join(f"{results[n, s]['test_acc']:.4f} ({results[n, s]['val_acc']:.4f})" for s in seeds)
        r = results[n, seeds[0]]
        print(
            f"| {n} | {r['num_trainers']} x {r['batches_per_epoch']} | {cells} | {means[n]:.4f} | {max(tests) - min(tests):.4f} |"
        )
    print()
    if {"distributed", "single"} <= means.keys():
        per_seed = [results["distributed", s]["test_acc"] - results["single", s]["test_acc"] for s in seeds]
        print(
            f"distributed - single: {100 * (means['distributed'] - means['single']):+.2f} points "
            f"(per seed {', '.join(f'{100 * d:+.2f}' for d in per_seed)}; goal: within 1 point)"
        )
    if {"distributed", "mlp"} <= means.keys():
        print(f"distributed - mlp: {100 * (means['distributed'] - means['mlp']):+.2f} points (goal: >= 10 points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
