"""Test accuracy of GraphSAGE trained on 1 and n GPUs of one machine, over seeds: what the many-GPU step costs.

For every seed, runs ``examples/graphsage/train_dist.py --local --num-parts 1 --trainers-per-machine N`` for each
N of ``--gpus`` (one trainer per GPU; the first count is the baseline), one after the other, and prints one row
per run (validation and test accuracy, the epoch time) and then, per count, the test-accuracy difference against
the baseline of the same seed: median [min, max] over the seeds, in points. Flags after ``--`` go to every run.

    python3 benchmarks/accuracy_gpus.py --data-dir ../shared/data/planetoid --seeds 0 1 2
    python3 benchmarks/accuracy_gpus.py --dataset synthetic --epochs 5 -- --num-nodes 200000 --feat-dim 100
    python3 benchmarks/accuracy_gpus.py --device cpu --gpus 1,2 --seeds 0   # the script's smoke test on CPUs
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from distgnn.train.result import read_result

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "graphsage" / "train_dist.py"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="cora", help="the example's --dataset")
    p.add_argument("--data-dir", help="the example's --data-dir (Planetoid files)")
    p.add_argument("--gpus", default="1,2", help="trainer counts (one GPU each); the first is the baseline")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a smoke test of the script")
    p.add_argument("--workdir", default=".work/accuracy_gpus")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run")
    p.add_argument(
        "--parallel", type=int, default=1, help="runs at once (their accuracy holds; their epoch times then do not)"
    )
    p.add_argument("extra", nargs="*", help="more train_dist.py flags (after --)")
    args = p.parse_args(argv)
    args.counts = [int(n) for n in args.gpus.split(",")]
    return args


def run(args: argparse.Namespace, trainers: int, seed: int) -> dict:
    """One run's RESULT; exits naming the run when it fails."""
    cmd = [sys.executable, str(EXAMPLE), "--local", "--num-parts", "1", "--trainers-per-machine", str(trainers)]
    cmd += ["--device", args.device, "--dataset", args.dataset, "--epochs", str(args.epochs), "--seed", str(seed)]
    cmd += ["--workdir", str(Path(args.workdir) / f"{trainers}-{seed}"), "--quiet"]
    cmd += ["--data-dir", args.data_dir] if args.data_dir else []
    proc = subprocess.run([*cmd, *args.extra], capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
    if proc.returncode != 0 or "RESULT " not in proc.stdout:
        sys.exit(f"{trainers} trainers, seed {seed} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return read_result(proc.stdout)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    keys = [(n, seed) for seed in args.seeds for n in args.counts]
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        results = dict(zip(keys, pool.map(lambda key: run(args, *key), keys), strict=True))
    at_once = f", {args.parallel} runs at once" if args.parallel > 1 else ""
    print(f"\nGraphSAGE on {args.dataset}, {args.epochs} epochs, 1 machine, a {args.device} device each{at_once}")
    print(f"{'trainers':>8} {'seed':>4} {'val acc':>8} {'test acc':>8} {'epoch s':>8} {'backend':>8}")
    for (n, seed), r in sorted(results.items()):
        print(
            f"{n:>8} {seed:>4} {r['val_acc']:>8.4f} {r['test_acc']:>8.4f} {r['epoch_time_s']:>8.3f} {r['backend']!s:>8}"
        )
    base = args.counts[0]
    for n in args.counts[1:]:
        diffs = [100 * (results[n, s]["test_acc"] - results[base, s]["test_acc"]) for s in args.seeds]
        print(
            f"{n} vs {base} trainers, test accuracy difference over seeds {args.seeds}: median "
            f"{statistics.median(diffs):+.2f} [{min(diffs):+.2f}, {max(diffs):+.2f}] points"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
