"""TGN on one GPU against memory copies on several GPUs: events/s and test AP of the same stream and seeds.

    python3 benchmarks/scaling_tgn.py --dataset events:PATH [--columns src,dst,time] --seeds 0,1,2 --epochs 10 \
        [--gpus 2] [--variants single,graph,eager] [--json FILE]

Each variant is one run of ``examples/tgn/train_dist.py`` per seed, read from its ``RESULT`` line:

* ``single``: ``--single --device cuda`` (one process, one memory copy, the CUDA-graph step);
* ``graph``: ``--local --num-parts G --trainers-per-machine 1 --memory-parallelism G --device cuda``: G memory
  copies, one per GPU, each step (the NCCL gradient all-reduce included) replayed from a CUDA graph;
* ``eager``: the same with ``--step eager``: the eager step, gradients averaged by DDP.

The table gives each run's epoch time (the job's median epoch), events/s of training (every trainer's events over
the epoch time), the median of its last ``--late`` epochs (after the one-time captures and warm-ups, which the
memory copies' alternating segments spread over the first epochs) and test AP of the model of the best
validation epoch; then per variant the median over seeds with the spread, events/s and the late epochs' speed as
ratios to ``single`` and the AP difference to it in points.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from distgnn.train.result import read_result

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tgn" / "train_dist.py"


def variant_flags(variant: str, gpus: int) -> list[str]:
    if variant == "single":
        return ["--single"]
    several = ["--local", "--num-parts", str(gpus), "--trainers-per-machine", "1", "--memory-parallelism", str(gpus)]
    return several + (["--step", "eager"] if variant == "eager" else [])


def run(args: argparse.Namespace, variant: str, seed: int) -> dict:
    cmd = [sys.executable, str(EXAMPLE), "--dataset", args.dataset, "--device", "cuda", "--epochs", str(args.epochs)]
    cmd += ["--seed", str(seed), *variant_flags(variant, args.gpus)]
    if args.columns:
        cmd += ["--columns", args.columns]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0 or "RESULT " not in done.stdout:
        sys.exit(
            f"{variant} seed {seed} failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )
    return read_result(done.stdout)


def late_epoch_s(result: dict, late: int) -> float:
    """Median time of a run's last ``late`` epochs."""
    return statistics.median(result["epoch_times_s"][-late:])


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.4g} [{min(values):.4g}, {max(values):.4g}]"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", required=True, help="events:PATH (or synthetic-events:NODES:EVENTS)")
    p.add_argument("--columns", default="", help="passed to the example where the file has no header")
    p.add_argument("--seeds", default="0", help="comma-separated")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--gpus", type=int, default=2, help="memory copies (one per GPU) of the several-GPU variants")
    p.add_argument("--variants", default="single,graph,eager", help="of single, graph, eager")
    p.add_argument("--late", type=int, default=4, help="the last epochs whose median the late column gives")
    p.add_argument("--timeout", type=float, default=150, help="seconds per run")
    p.add_argument("--json", default="", help="write every run's RESULT here")
    args = p.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - {"single", "graph", "eager"}
    if unknown:
        p.error(f"unknown variant(s) {sorted(unknown)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[str, list[dict]] = {v: [] for v in variants}
    print(f"stream {args.dataset}, {args.epochs} epochs, {args.gpus} GPUs for graph/eager")
    print(f"{'variant':8} {'seed':>4} {'epoch s':>8} {'events/s':>10} {'late s':>8} {'test AP':>8} {'best':>4}")
    for seed in seeds:  # seeds outermost: the variants of one seed run back to back
        for variant in variants:
            r = run(args, variant, seed)
            results[variant].append(r)
            print(
                f"{variant:8} {seed:4d} {r['epoch_time_s']:8.3f} {r['events_per_s']:10.0f} {late_epoch_s(r, args.late):8.4f} "
                f"{r.get('test_ap', float('nan')):8.4f} {r.get('best_epoch', -1):4d}",
                flush=True,
            )
    print("\nmedian [min, max] over seeds")
    print(
        f"{'variant':8} {'events/s':>28} {'x single':>22} {'late x single':>22} {'test AP':>28} "
        f"{'AP - single (points)':>22}"
    )
    base = results.get("single")
    for variant in variants:
        rate = [r["events_per_s"] for r in results[variant]]
        ap = [r.get("test_ap", float("nan")) for r in results[variant]]
        ratio = late = diff = "-"
        if base and variant != "single":
            pairs = list(zip(results[variant], base, strict=True))
            ratio = spread([a["events_per_s"] / b["events_per_s"] for a, b in pairs])
            late = spread([late_epoch_s(b, args.late) / late_epoch_s(a, args.late) for a, b in pairs])
            diff = spread([100 * (a["test_ap"] - b["test_ap"]) for a, b in pairs])
        print(f"{variant:8} {spread(rate):>28} {ratio:>22} {late:>22} {spread(ap):>28} {diff:>22}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
