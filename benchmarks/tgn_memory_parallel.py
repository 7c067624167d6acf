"""Memory parallelism 2 against one trainer: test AP of the selected model and of the last epoch, per seed.

Per seed, examples/tgn/train_dist.py twice (``--epochs`` epochs, one torch thread a process): ``--single`` and
``--local --num-parts 2 --trainers-per-machine 1 --memory-parallelism 2`` (2 simulated machines, a memory copy
each, the example's default ``--lr-scaling``), both validated and tested after every epoch. The table gives
each run's best epoch by validation AP, that model's test AP and the last epoch's, and the 2-copy run's
difference from the single trainer in AP points; then the differences' median [min, max] over the seeds.
``--per-epoch`` also prints every epoch's validation and test AP of both runs; ``--modes "2 copies"`` runs one
kind only (its figures by epoch), ``--extra=FLAGS`` passes more flags to both (``--extra=--lr-scaling sqrt``).

``--probe DIR`` looks into a run's checkpoints instead (``--keep DIR`` keeps each run's, one per epoch; models
of the example's default sizes): for every epoch, the evaluating copy's memory as training left it, and test
AP from it after the validation pass (what the job reports), from a memory replayed over all the events before
the test events with that epoch's weights (memory only), and from the other copy's memory; so a low test AP is
placed in the weights or in the memory the evaluation starts from.

    python benchmarks/tgn_memory_parallel.py --seeds 0,1,2 --jobs 2            # CollegeMsg, 10 epochs
    python benchmarks/tgn_memory_parallel.py --seeds 0,1,2 --jobs 2 --columns src,dst,rating,time \\
        --dataset events:../shared/data/snap/soc-sign-bitcoinotc.csv
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from distgnn.data.events import parse_columns
from distgnn.nn.temporal import TGN
from distgnn.store.checkpoint_files import read_arrays
from distgnn.temporal import build_temporal_csr
from distgnn.temporal.job import load_stream
from distgnn.temporal.train import TGNRunner, batch_ranges, chronological_split
from distgnn.temporal.warm import replay_memory
from distgnn.train.result import read_result

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tgn" / "train_dist.py"
COLLEGE_MSG = ROOT / ".." / "shared" / "data" / "snap" / "CollegeMsg.txt"
MODES = {
    "one trainer": ["--single"],
    "2 copies": ["--local", "--num-parts", "2", "--trainers-per-machine", "1", "--memory-parallelism", "2"],
}


def command(args: argparse.Namespace, mode: str, seed: int, run_dir: Path) -> list[str]:
    cmd = [sys.executable, str(EXAMPLE), *MODES[mode], "--dataset", args.dataset, "--epochs", str(args.epochs)]
    cmd += ["--num-threads", "1", "--seed", str(seed), "--run-dir", str(run_dir / "run"), *args.extra.split()]
    if args.columns:
        cmd += ["--columns", ",".join(args.columns)]
    if args.keep:
        cmd += ["--checkpoint-dir", str(run_dir / "checkpoints"), "--checkpoint-keep", str(args.epochs)]
    return cmd


def run_all(args: argparse.Namespace, work: Path) -> dict[tuple[int, str], dict]:
    """Every (seed, mode) run, ``--jobs`` at a time; their RESULT and per-epoch records."""
    todo = [(seed, mode) for seed in args.seeds for mode in MODES if mode in args.modes]
    running: list[tuple[tuple[int, str], Path, subprocess.Popen]] = []
    done = {}
    while todo or running:
        while todo and len(running) < args.jobs:
            seed, mode = todo.pop(0)
            run_dir = work / f"seed{seed}-{mode.replace(' ', '-')}"
            proc = subprocess.Popen(command(args, mode, seed, run_dir), stdout=subprocess.PIPE, text=True, cwd=ROOT)
            running.append(((seed, mode), run_dir, proc))
        key, run_dir, proc = running.pop(0)
        out, _ = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(proc.args)} failed (exit {proc.returncode})")
        result = read_result(out)
        records = [json.loads(line) for line in (run_dir / "run" / "metrics.jsonl").read_text().splitlines()]
        result["epochs_log"] = [r for r in records if r["kind"] == "epoch"]
        done[key] = result
        print(
            f"  seed {key[0]} {key[1]}: test AP {result['test_ap']:.4f}, last {result['last_test_ap']:.4f}",
            flush=True,
        )
    return done


def compare(args: argparse.Namespace) -> None:
    work = Path(args.keep or tempfile.mkdtemp(prefix="tgn-memory-parallel-"))
    print(f"{args.dataset}, {args.epochs} epochs, seeds {args.seeds}; {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    done = run_all(args, work)
    if len(args.modes) < len(MODES):  # one kind of run: its figures by epoch only
        args.per_epoch = True
    else:
        table(args, done)
    if args.per_epoch:
        for seed in args.seeds:
            for mode in args.modes:
                log = done[(seed, mode)]["epochs_log"]
                figures = " ".join(f"{e['val_ap']:.3f}/{e['test_ap']:.3f}" for e in log)
                print(f"  seed {seed} {mode:>11} val/test AP by epoch: {figures}")


def table(args: argparse.Namespace, done: dict[tuple[int, str], dict]) -> None:
    print(
        "| seed | one trainer: best epoch, test AP / last | 2 copies: best epoch, test AP / last | "
        "difference (points) / last |"
    )
    print("|---|---|---|---|")
    gaps, last_gaps = [], []
    for seed in args.seeds:
        one, two = done[(seed, "one trainer")], done[(seed, "2 copies")]
        gap, last_gap = 100 * (two["test_ap"] - one["test_ap"]), 100 * (two["last_test_ap"] - one["last_test_ap"])
        gaps.append(gap)
        last_gaps.append(last_gap)
        print(
            f"| {seed} | {one['best_epoch']}, {one['test_ap']:.4f} / {one['last_test_ap']:.4f} | "
            f"{two['best_epoch']}, {two['test_ap']:.4f} / {two['last_test_ap']:.4f} | {gap:+.2f} / {last_gap:+.2f} |"
        )
    print(
        f"difference, median [min, max]: selected model {statistics.median(gaps):+.2f} [{min(gaps):+.2f}, "
        f"{max(gaps):+.2f}] points; last epoch {statistics.median(last_gaps):+.2f} [{min(last_gaps):+.2f}, "
        f"{max(last_gaps):+.2f}] points"
    )


def memory_of(files: dict[str, np.ndarray], copy: int) -> dict[str, np.ndarray]:
    """Memory copy ``copy``'s arrays in a checkpoint's files."""
    fields = ("memory", "last_update", "mail", "mail_time", "has_mail")
    return {field: files[next(n for n in files if n.endswith(f".memory.{copy}.{field}.npy"))] for field in fields}


def probe(args: argparse.Namespace) -> None:
    """Test AP of each checkpointed epoch from several starting memories (see the module's text)."""
    torch.set_num_threads(args.threads)
    seed = args.seeds[0]
    events = load_stream(args.dataset, seed=seed, columns=args.columns)
    train_end, val_end = chronological_split(len(events))
    torch.manual_seed(seed)
    model = TGN(events.num_nodes, events.feat_dim, 100, 100, 100, heads=2)
    runner = TGNRunner(model, events, build_temporal_csr(events), torch.device("cpu"), 10, eval_seed=seed)
    val_batches = batch_ranges(train_end, val_end, 200)
    test_batches = batch_ranges(val_end, len(events), 200)
    train_batches = batch_ranges(0, train_end, 200)
    # The other copy's memory stands where copy 0's segment ends: caught up from there to the test events.
    boundary = train_batches[len(train_batches) % 2 + len(train_batches) // 2][0]
    since_copy = batch_ranges(boundary, val_end, 200)
    steps = sorted(Path(args.probe).glob("step-*"))
    copies = sorted(
        {int(name.split(".memory.")[1].split(".")[0]) for name in read_arrays(steps[0]) if ".memory." in name}
    )
    print(f"{args.probe}: {len(steps)} epochs, memory copies {copies}")
    print(
        "| epoch | evaluator | val AP | test AP after val | test AP, memory replayed to val end | "
        "test AP, other copy caught up to val end | memory norm | nodes with mail |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for epoch, step in enumerate(steps):
        files = read_arrays(step)
        weights = {
            name[len("model.") : -len(".npy")]: torch.from_numpy(np.array(a))
            for name, a in files.items()
            if name.startswith("model.")
        }
        model.load_state_dict(weights)
        k = len(copies)
        evaluator = (k - 1 - epoch) % k

        runner.memory.load_state(memory_of(files, evaluator))
        norm = float(runner.memory.memory.norm(dim=1).mean())
        mail = int(runner.memory.has_mail.sum())
        val = runner.evaluate(val_batches)["ap"]
        test = runner.evaluate(test_batches)["ap"]
        runner.reset_memory()
        replay_memory(
            model, runner.memory, runner.src, runner.dst, runner.time, runner.feat, batch_ranges(0, val_end, 200)
        )
        replayed = runner.evaluate(test_batches)["ap"]
        other = float("nan")
        if k > 1:
            runner.memory.load_state(memory_of(files, 1 - evaluator))
            replay_memory(model, runner.memory, runner.src, runner.dst, runner.time, runner.feat, since_copy)
            other = runner.evaluate(test_batches)["ap"]
        print(
            f"| {epoch} | copy {evaluator} | {val:.4f} | {test:.4f} | {replayed:.4f} | {other:.4f} | {norm:.2f} | {mail} |",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default=f"events:{COLLEGE_MSG}")
    parser.add_argument("--columns", type=parse_columns, default=None, help="as the example's --columns")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seeds", type=lambda s: [int(v) for v in s.split(",")], default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (a 2-copy run is 2 processes)")
    parser.add_argument("--extra", default="", help="more flags for both runs, e.g. '--lr-scaling sqrt'")
    parser.add_argument(
        "--modes", type=lambda s: s.split(","), default=list(MODES), help="which runs: one trainer,2 copies"
    )
    parser.add_argument("--per-epoch", action="store_true", help="every epoch's validation and test AP too")
    parser.add_argument("--keep", default=None, help="keep the runs (logs, a checkpoint per epoch) under this folder")
    parser.add_argument("--probe", default=None, help="a run's checkpoint folder to look into (first seed's)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.probe:
        probe(args)
    else:
        compare(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
