"""Epoch time on 1 and n GPUs (GraphSAGE, R-GCN or link prediction): scaling efficiency, time split by stage.

Runs ``examples/graphsage/train_dist.py --local`` (``--example rgcn``: examples/rgcn on synthetic-mag,
``--example link``: examples/link_prediction on the synthetic graph) on one partition (the whole graph on one simulated machine,
one graph server) with 1, then n trainers, one per GPU, the gradients averaged over NCCL (inside the captured
step, or by DDP with ``--step eager``); by default local sampling on the GPU and a clique feature cache. With
``--machines many`` the n trainers are n simulated machines of one trainer each (n partitions, one server each).
``--ddp-rows`` adds each n > 1 with ``--step eager`` (DDP) against the same baseline; ``--replicated-rows`` adds each
n > 1 with ``--structure replicated`` (every trainer samples the whole graph's structure itself, no sampling RPC);
``--thread-rows`` adds every count with ``--prefetch 1`` (the sampling thread) against the first count's thread run. Every run of a layout reads
the same partition (made once in ``--workdir``). Prints a table (a run's time is its median epoch after the
first; with ``--repeats`` the median over the runs, the spread their fastest and slowest, and each repeat's
efficiency against the baseline run of the same repeat) and writes the RESULT lines as JSON. Efficiency is the
time per batch of one trainer against n trainers' batches: T1 / (n * Tn) over full epochs, T1 / Tn when
``--max-batches`` gives every trainer the same batches.

    python3 benchmarks/scaling.py                      # products-scale synthetic graph, 1 and 2 GPUs
    python3 benchmarks/scaling.py --num-nodes 200000   # a quick look
    python3 benchmarks/scaling.py --gpus 1 --timeline tl.json   # + each trainer's stage spans, rank 0's drawn
    python3 benchmarks/scaling.py --thread-rows --variant "nogc:--no-gc-tuning" --repeats 3 --epochs 8
    python3 benchmarks/scaling.py --example rgcn --num-papers 100000 --repeats 2
    python3 benchmarks/scaling.py --example link --num-nodes 1000000 --avg-degree 20 --max-batches 100
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from distgnn.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {
    name: ROOT / "examples" / folder / "train_dist.py"
    for name, folder in (("graphsage", "graphsage"), ("rgcn", "rgcn"), ("link", "link_prediction"))
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--example", default="graphsage", choices=sorted(SCRIPTS), help="the job to run")
    p.add_argument("--num-papers", type=int, default=100_000, help="rgcn: synthetic-mag papers")
    p.add_argument("--max-batches", type=int, help="batches per trainer per epoch (default: whole epochs)")
    p.add_argument("--num-nodes", type=int, default=2_400_000, help="products: 2.4M nodes")
    p.add_argument("--avg-degree", type=float, default=25.8, help="products: 61.8M directed edges / 2.4M")
    p.add_argument("--feat-dim", type=int, default=100)
    p.add_argument("--classes", type=int, default=47)
    p.add_argument("--gpus", default="1,2", help="trainer counts to run, the first is the baseline")
    p.add_argument(
        "--machines",
        default="one",
        choices=("one", "many"),
        help="one: n trainers on one simulated machine; many: n machines of one trainer (the baseline stays 1x1)",
    )
    p.add_argument("--ddp-rows", action="store_true", help="also run each count > 1 with --step eager (DDP)")
    p.add_argument(
        "--replicated-rows",
        action="store_true",
        help="also run each count > 1 with --structure replicated (the structure on every trainer)",
    )
    p.add_argument(
        "--thread-rows",
        action="store_true",
        help="also run every count with --prefetch 1 (the sampling thread), its efficiency against the first "
        "count's run with the thread",
    )
    p.add_argument(
        "--repeats", type=int, default=1, help="runs of every row, interleaved; the table's spread is theirs"
    )
    p.add_argument("--epochs", type=int, default=4, help="the first is warm-up; the median of the rest counts")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", help="default: 15,10,5 (rgcn: 10,10)")
    p.add_argument("--hidden", type=int, help="default: 256 (rgcn: 64)")
    p.add_argument("--cache-gb", type=float, default=1.0, help="per GPU")
    p.add_argument("--cache-policy", default="clique", choices=("clique", "replicate"))
    p.add_argument("--sample-device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a smoke test of the script")
    p.add_argument("--workdir", default=".work/scaling")
    p.add_argument("--json", help="write every run's RESULT here")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run")
    p.add_argument(
        "--timeline",
        help="write every trainer's per-batch stage spans of each run beside PATH (-<n>gpu[-<variant>][-rank<r>]\n"
        "before the suffix), plot rank 0's and print each trainer's period, wait and step medians",
    )
    p.add_argument("--trace", help="with --timeline: also a torch.profiler Chrome trace per run (slows the run)")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:FLAGS",
        help="add every count run with these train_dist.py flags (e.g. 'bind:--bind-cpus'), compared with the first\n"
        "count's run of the same variant; repeatable",
    )
    p.add_argument("extra", nargs="*", help="more train_dist.py flags (after --)")
    return p.parse_args()


def run(args: argparse.Namespace, gpus: int, more: list[str], label: str) -> dict:
    cmd = [sys.executable, str(SCRIPTS[args.example]), "--local", f"--device={args.device}", "--part-method=random"]
    if args.example == "rgcn":
        cmd += ["--dataset=synthetic-mag", f"--num-papers={args.num_papers}"]
    else:
        cmd += ["--dataset=synthetic", f"--num-nodes={args.num_nodes}", f"--avg-degree={args.avg_degree}"]
        cmd += [f"--feat-dim={args.feat_dim}", f"--synthetic-classes={args.classes}"]
    machines, per_machine = (gpus, 1) if args.machines == "many" else (1, gpus)
    cmd += [f"--num-parts={machines}", f"--trainers-per-machine={per_machine}"]
    fanouts = args.fanouts or ("10,10" if args.example == "rgcn" else "15,10,5")
    hidden = args.hidden or (64 if args.example == "rgcn" else 256)
    cmd += [f"--epochs={args.epochs}", f"--batch-size={args.batch_size}", f"--fanouts={fanouts}"]
    cmd += [f"--hidden={hidden}", "--no-eval", "--quiet", f"--workdir={args.workdir}-{args.example}"]
    if args.max_batches:
        cmd += [f"--max-batches={args.max_batches}"]
    if args.device == "cuda" and args.example == "graphsage":
        cmd += [f"--cache-gb={args.cache_gb}", f"--cache-policy={args.cache_policy}"]
    if args.device == "cuda" and args.example != "link":
        cmd += [f"--sample-device={args.sample_device}"]
    if args.timeline:
        run_path(args.timeline, label).parent.mkdir(parents=True, exist_ok=True)
        cmd += [f"--timeline={run_path(args.timeline, label)}"]
        if args.trace:
            cmd += [f"--trace={run_path(args.trace, label)}"]
    cmd += list(args.extra) + more
    print("$ " + " ".join(cmd[1:]), flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith("epoch"):
            print("  " + line, flush=True)
    if proc.returncode != 0:
        sys.exit(f"train_dist.py failed with code {proc.returncode}:\n{proc.stderr[-4000:]}")
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    result["wall_s"] = time.perf_counter() - start
    return result


def run_path(path: str, label: str) -> Path:
    """``path`` with ``-<row label>`` before its suffix (``2 thr``: ``-2gpu-thr``), absolute (train_dist.py runs
    from the repo root)."""
    path = Path(path).resolve()
    gpus, _, name = label.partition(" ")
    return path.with_name(f"{path.stem}-{gpus}gpu{'-' + name if name else ''}{path.suffix}")


def lockstep(timeline: Path, gpus: int) -> None:
    """Per trainer of a run, medians and 90th percentiles over its batches after epoch 0: the period (from one
    batch's start to the next one's, host clock), the host time waiting for the batch (``wait``) and the step's
    GPU time (``compute``: with several GPUs it holds the all-reduce, which waits for the slowest trainer)."""
    from distgnn.train.timeline import rank_path, read_timeline

    def centiles(values: list[float]) -> str:
        values = sorted(values)
        return f"{statistics.median(values):.3f} [p90 {values[int(0.9 * (len(values) - 1))]:.3f}]" if values else "-"

    for rank in range(gpus):
        path = rank_path(timeline, rank)
        if not path.exists():
            continue
        batches = [b for b in read_timeline(path)["batches"] if b["epoch"] > 0]
        starts = [b["spans"][0]["host_ms"][0] for b in batches]
        periods = [b - a for a, b in zip(starts, starts[1:], strict=False) if b > a]
        spans: dict[str, list[float]] = {"wait": [], "compute": []}
        for record in batches:
            for span in record["spans"]:
                if span["stage"] == "wait":
                    spans["wait"].append(span["host_ms"][1] - span["host_ms"][0])
                elif span["stage"] == "compute" and span["gpu_ms"]:
                    spans["compute"].append(span["gpu_ms"][1] - span["gpu_ms"][0])
        print(
            f"timeline rank {rank}: ms a batch: period {centiles(periods)}, wait (host) {centiles(spans['wait'])}, "
            f"compute (GPU) {centiles(spans['compute'])}"
        )


def plot(timeline: Path, gpus: int = 1) -> None:
    """Draws a run's timeline next to it (``.png``), or says why not; with several trainers, each one's
    :func:`lockstep` line."""
    from distgnn.train.timeline import plot_timeline, read_timeline, summarize

    lockstep(timeline, gpus)
    try:
        plot_timeline(read_timeline(timeline), timeline.with_suffix(".png"))
        print(f"timeline {timeline}, drawn in {timeline.with_suffix('.png')}")
    except ConfigError as exc:
        print(f"timeline {timeline} written; not drawn: {exc}")
    batches = read_timeline(timeline)["batches"]
    epochs = sorted({record["epoch"] for record in batches})
    for epoch in epochs:
        summary = summarize(batches, {epoch})
        whole = summary.pop("all")
        stages = "; ".join(
            f"{stage} {v['host_ms']:.0f} host / {v['gpu_ms']:.0f} GPU ms" for stage, v in summary.items()
        )
        print(
            f"timeline epoch {epoch}: wall {whole['wall_ms']:.0f} ms, GPU busy {whole['gpu_busy_ms']:.0f} ms; {stages}"
        )


def steady(result: dict) -> tuple[float, float, float, list[float]]:
    """Median, fastest and slowest epoch time and per-stage medians over the epochs after the first (warm-up)."""
    times = result["epoch_times_s"][1:] or result["epoch_times_s"]
    stages = result["stage_times_s"][1:] or result["stage_times_s"]
    medians = [statistics.median(column) for column in zip(*stages, strict=True)]
    return statistics.median(times), min(times), max(times), medians


def per_batch(result: dict, epoch_s: float) -> float:
    """Seconds per batch of one trainer (``batches_per_epoch`` is each trainer's)."""
    return epoch_s / max(result["batches_per_epoch"], 1)


def main() -> None:
    args = parse_args()
    counts = [int(g) for g in args.gpus.split(",")]
    # (label, trainers, more flags, the label of the row it is compared with)
    first = str(counts[0])
    rows = [(str(gpus), gpus, [], first) for gpus in counts]
    if args.ddp_rows:
        rows += [(f"{gpus} ddp", gpus, ["--step=eager"], first) for gpus in counts if gpus > 1]
    if args.replicated_rows:
        rows += [(f"{gpus} repl", gpus, ["--structure=replicated"], first) for gpus in counts if gpus > 1]
    if args.thread_rows:
        rows += [(f"{gpus} thr", gpus, ["--prefetch=1"], f"{counts[0]} thr") for gpus in counts]
    for variant in args.variant:
        name, _, flags = variant.partition(":")
        if not name or " " in name:
            sys.exit(f"--variant {variant!r}: expected NAME:FLAGS, NAME without spaces")
        rows += [(f"{gpus} {name}", gpus, flags.split(), f"{counts[0]} {name}") for gpus in counts]
    results: dict[str, list[dict]] = {label: [] for label, *_ in rows}
    for _ in range(args.repeats):  # interleaved, so that a slow spell of the host touches every row
        for label, gpus, more, _ in rows:
            layout = args.machines if gpus > 1 else "one"
            results[label].append(run(argparse.Namespace(**{**vars(args), "machines": layout}), gpus, more, label))
            if args.timeline:
                plot(run_path(args.timeline, label), gpus)
    runs = {label: [steady(result) for result in results[label]] for label in results}
    bases = {
        label: [per_batch(r, median) for r, (median, *_) in zip(results[label], runs[label], strict=True)]
        for label in {base for *_, base in rows}
    }
    spread_name = "runs" if args.repeats > 1 else "epochs"
    print(
        f"\n{'GPUs':>7} {'epoch s':>8} {'spread (' + spread_name + ')':>15} {'sample':>7} {'fetch':>7} "
        f"{'compute':>8} {'waited':>7} {'hit':>6} {'peer':>6} {'loss':>7} {'speedup':>8} {'efficiency':>10} "
        f"{'eff. runs':>11}"
    )
    for label, gpus, _, base_label in rows:
        base = bases[base_label]
        medians = [median for median, *_ in runs[label]]
        epoch = statistics.median(medians)
        if args.repeats > 1:
            fastest, slowest = min(medians), max(medians)
        else:
            _, fastest, slowest, _ = runs[label][0]
        stages = [statistics.median(column) for column in zip(*(r[3] for r in runs[label]), strict=True)]
        # Speedup: per-trainer batch time against the baseline's, times the trainers; each repeat's efficiency
        # against the baseline run of the same repeat.
        batch_s = [per_batch(r, m) for r, m in zip(results[label], medians, strict=True)]
        speedup = statistics.median(base) / statistics.median(batch_s) * gpus
        paired = [b / m for b, m in zip(base, batch_s, strict=True)]
        last = results[label][-1]
        print(
            f"{label:>7} {epoch:8.3f} {fastest:7.3f}-{slowest:7.3f} {stages[0]:7.3f} {stages[1]:7.3f} "
            f"{stages[2]:8.3f} {stages[3]:7.3f} {last.get('cache_hit_rate') or 0:6.1%} "
            f"{last.get('cache_peer_hit_rate') or 0:6.1%} {last['train_loss']:7.4f} {speedup:7.2f}x "
            f"{speedup / gpus:10.2f} {min(paired):5.2f}-{max(paired):5.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
