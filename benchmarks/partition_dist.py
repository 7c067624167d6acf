"""The distributed partition job (``--workers W --local``) against the single-process tool on one chunked graph.

For each method, the single-process ``distgnn-partition`` runs first, then the job at each W, each in its own
process(es), on the same chunked input; per run the table gives

* ``s``: the partition's own time (single: its ``total`` line; job: the slowest rank's seconds), and
  ``time/single``;
* ``cpu s``: user + system CPU seconds of the whole command (every rank, its start-up included), ``sys s``
  the system part of it, and ``cpu/single``: on a loaded machine the processes' share of the cores moves
  ``s``, not this;
* ``peak GiB``: single: the peak RSS when the partition is written (before ``--check``); job: the largest
  rank's measured peak (ru_maxrss), ``peak/single``, and ``est/peak``: the ``--dry-run`` estimate of that
  rank over its measured peak;
* ``cut``: directed edges whose source is not owned by the destination's partition (``--check``'s figure),
  ``cut/single``; ``balance``: the largest partition's node count over the mean;
* ``same``: for random and range, whether every array and the JSON equal the single-process output.

    python benchmarks/partition_dist.py --graph synthetic --num-nodes 1000000 --avg-degree 20 \\
        --parts 4 --workers 1,2,4 --methods random,range,metis --work /tmp/pdist
    python benchmarks/partition_dist.py --graph synthetic-mag --num-papers 100000 --parts 4 --workers 2,4
    python benchmarks/partition_dist.py --graph papers --num-nodes 10000000 --avg-degree 15 --workers 2,4
    python benchmarks/partition_dist.py --input DIR/metadata.json --workers 2,4 --methods random
    python benchmarks/partition_dist.py --input DIR/metadata.json --workers 4 --methods random --repeat 4
    python benchmarks/partition_dist.py --input DIR/metadata.json --workers 8,1,1:1 --no-single --repeat 3

``--repeat N`` runs every row N times, the job before the single process in odd rounds (with
``--no-single``, the W in reverse order), and prints the
median and range of each ratio over the rounds; ``wall s`` is the whole command (start-up, the ranks'
imports and rendezvous, and the single process's ``--check`` included; every run starts after ``sync``, so none
shares the disks with the previous run's writeback). With ``--no-single`` each run's row is printed as it ends
and its output removed (nothing is compared with it, and the next run's ``sync`` then has nothing of it to write
back); with several W, each W is compared with the smallest W of the same round (``W=1 / W=8``: how many times faster W=8 is);
``W:T`` runs the job with ``--threads T`` (``W=1 t=1``: one rank on one thread), a rank's threads otherwise
being its share of the CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CLI = [sys.executable, "-m", "distgnn.partition.cli"]


def _make_graph(args: argparse.Namespace) -> Path:
    if args.input is not None:
        return args.input
    meta = args.work / "input" / "metadata.json"
    if meta.exists():
        return meta
    if args.graph == "papers":
        from distgnn.data.papers_like import write_papers_like

        return write_papers_like(
            args.work / "input", args.num_nodes, args.avg_degree, nodes_per_chunk=-(-args.num_nodes // args.chunks)
        )
    from distgnn.data import synthetic, synthetic_mag
    from distgnn.data.chunked import write_chunked
    from distgnn.data.hetero import HeteroGraph

    if args.graph == "synthetic":
        graph = HeteroGraph.from_homogeneous(synthetic(args.num_nodes, args.avg_degree, 100, 16, seed=0))
    else:
        graph = synthetic_mag(args.num_papers, seed=0)
    return write_chunked(graph, args.work / "input", num_chunks=args.chunks)


def _cut_and_balance(json_path: Path) -> tuple[int, float]:
    from distgnn.partition.format import load_part_array, read_meta

    meta = read_meta(json_path)
    cut = 0
    for p, part in enumerate(meta.parts):
        indices = load_part_array(meta, p, "indices")
        cut += int(np.count_nonzero(indices >= part.num_owned_nodes))
    owned = np.array([part.num_owned_nodes for part in meta.parts], dtype=np.float64)
    return cut, float(owned.max() / owned.mean())


def _same(a: Path, b: Path) -> bool:
    files = sorted(p.relative_to(a) for p in a.rglob("*.npy"))
    if files != sorted(p.relative_to(b) for p in b.rglob("*.npy")):
        return False
    for rel in files:
        if not np.array_equal(np.load(a / rel, mmap_mode="r"), np.load(b / rel, mmap_mode="r")):
            return False
    (ja,), (jb,) = a.glob("*.json"), b.glob("*.json")
    return json.loads(ja.read_text()) == json.loads(jb.read_text())


def _cpu_of_children() -> np.ndarray:
    """(user, system) CPU seconds of every finished child so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return np.array([usage.ru_utime, usage.ru_stime])


def _run(cmd: list[str]) -> tuple[str, float, float, float]:
    """Run ``cmd``; returns its output, wall seconds, CPU seconds (user + system, every rank's) and the
    system part of them.
    The output (every rank's phase lines) is also appended to ``OUT.log`` beside its ``--out``."""
    start, cpu = time.perf_counter(), _cpu_of_children()
    done = subprocess.run(cmd, capture_output=True, text=True)
    cpu = _cpu_of_children() - cpu
    out = Path(cmd[cmd.index("--out") + 1])
    with out.with_name(out.name + ".log").open("a") as log:  # every round's output, one after the other
        log.write(f"$ {' '.join(cmd)}\n{done.stdout}{done.stderr}")
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-3000:]}")
    return done.stdout, time.perf_counter() - start, float(cpu.sum()), float(cpu[1])


def _single(meta: Path, out: Path, method: str, args: argparse.Namespace) -> dict:
    stdout, wall, cpu, sys_cpu = _run(
        [*CLI, "--input", str(meta), "--out", str(out), "--num-parts", str(args.parts), "--method", method,
         "--seed", str(args.seed), "--overwrite"]
    )  # fmt: skip
    seconds = float(re.search(r"^total ([\d.]+) s", stdout, re.MULTILINE).group(1))
    peak = float(re.findall(r"write done in [\d.]+ s \(peak RSS so far ([\d.]+) GiB\)", stdout)[-1])
    return dict(seconds=seconds, wall=wall, cpu=cpu, sys=sys_cpu, peak=peak, estimate=None)


def _spec(run: str) -> tuple[int, int | None]:
    """``W`` or ``W:T`` (T threads per rank) of ``--workers``."""
    w, _, t = run.partition(":")
    return int(w), int(t) if t else None


def _label(run: str) -> str:
    w, t = _spec(run)
    return f"W={w}" if t is None else f"W={w} t={t}"


def _dist(meta: Path, out: Path, method: str, run: str, args: argparse.Namespace) -> dict:
    workers, threads = _spec(run)
    stdout, wall, cpu, sys_cpu = _run(
        [*CLI, "--input", str(meta), "--out", str(out), "--num-parts", str(args.parts), "--method", method,
         "--seed", str(args.seed), "--overwrite", "--workers", str(workers), "--local",
         "--coarse-edges", str(args.coarse_edges), "--message-mb", str(args.message_mb),
         *(["--threads", str(threads)] if threads is not None else [])]
    )  # fmt: skip
    rows = re.findall(r"^\s*(\d+) \|\s*([\d.]+) \|\s*([\d.]+) \|\s*(\d+) \|\s*([\d.]+) \|\s*([\d.]+)$", stdout, re.M)
    peaks = [float(r[1]) for r in rows]
    worst = int(np.argmax(peaks))
    return dict(
        seconds=max(float(r[5]) for r in rows),
        wall=wall,
        cpu=cpu,
        sys=sys_cpu,
        peak=peaks[worst],
        estimate=float(rows[worst][2]),
        rounds=int(rows[0][3]),
        sent_mib=sum(float(r[4]) for r in rows),
    )


def _out(args: argparse.Namespace, run: str, method: str) -> Path:
    return args.work / f"w{run.replace(':', 't')}-{method}"


def _one(meta: Path, method: str, workers: str | None, args: argparse.Namespace) -> dict:
    """One run: the single-process tool (``workers`` None) or the job, after the page cache's dirty pages (the
    previous run's outputs) are written back, so that a run does not share the disks with that writeback."""
    os.sync()
    if workers is None:
        out = args.work / f"single-{method}"
        r = _single(meta, out, method, args)
    else:
        out = _out(args, workers, method)
        r = _dist(meta, out, method, workers, args)
    r["cut"], r["balance"] = _cut_and_balance(next(out.glob("*.json")))
    r["same"] = "-"
    return r


def _print_row(method: str, rep: int, workers: str | None, r: dict, base: dict | None) -> None:
    def ratio(key: str) -> str:
        return f"{r[key] / base[key]:.2f}" if base else "-"

    est = "-" if r["estimate"] is None else f"{r['estimate'] / r['peak']:.2f}"
    print(
        f"{method} | {rep} | {'single' if workers is None else _label(workers)} | {r['seconds']:.1f} | "
        f"{ratio('seconds')} | {r['wall']:.1f} | {ratio('wall')} | {r['cpu']:.1f} | {r['sys']:.1f} | {ratio('cpu')} | "
        f"{r['peak']:.2f} | {ratio('peak')} | {est} | {r['cut']:,} | {ratio('cut')} | {r['balance']:.3f} | "
        f"{r['same']}",
        flush=True,
    )


def _print_speedups(method: str, workers: list[str], runs_by_rep: list[dict]) -> None:
    """Without the single process: each run of the smallest W against each run of a larger W of the same
    round (``s`` and ``wall``)."""
    low = min(_spec(w)[0] for w in workers)
    for base, w in [(b, w) for b in workers if _spec(b)[0] == low for w in workers if _spec(w)[0] != low]:
        pairs = np.array([[r[base][k] / r[w][k] for k in ("seconds", "wall")] for r in runs_by_rep if w in r])
        print(
            f"{method} {_label(base)} / {_label(w)} over {len(pairs)} rounds: partition time median "
            f"{np.median(pairs[:, 0]):.2f} "
            f"[{pairs[:, 0].min():.2f}, {pairs[:, 0].max():.2f}], whole command median {np.median(pairs[:, 1]):.2f} "
            f"[{pairs[:, 1].min():.2f}, {pairs[:, 1].max():.2f}]",
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--graph", choices=("synthetic", "synthetic-mag", "papers"), default="synthetic")
    p.add_argument("--num-nodes", type=int, default=1_000_000)
    p.add_argument("--avg-degree", type=float, default=20.0)
    p.add_argument("--num-papers", type=int, default=100_000)
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--parts", type=int, default=4)
    p.add_argument(
        "--workers", default="1,2,4", help="runs of the job: W, or W:T for T threads per rank (default: its share)"
    )
    p.add_argument("--methods", default="random,range,metis")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--coarse-edges", type=int, default=4_000_000)
    p.add_argument("--message-mb", type=float, default=256.0)
    p.add_argument("--no-single", action="store_true", help="skip the single-process runs (too big for this box)")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of every run; odd rounds run the job before the single process (or the W reversed)",
    )
    p.add_argument("--work", type=Path, default=Path("/tmp/partition_dist"))
    p.add_argument("--keep", action="store_true", help="keep the input and the partitions")
    p.add_argument(
        "--input", type=Path, help="an existing chunked graph's metadata.json (never removed); --graph is ignored"
    )
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    meta = _make_graph(args)
    layout = json.loads(meta.read_text())
    nodes = sum(map(sum, layout["num_nodes_per_chunk"]))
    edges = sum(map(sum, layout["num_edges_per_chunk"]))
    name = meta if args.input is not None else args.graph
    print(
        f"{name}: {nodes:,} nodes, {edges:,} edges, {len(layout['num_edges_per_chunk'][0])} edge chunks, {args.parts} parts"
    )
    header = (
        "method | rep | run | s | time/single | wall s | wall/single | cpu s | sys s | cpu/single | peak GiB | peak/single "
        "| est/peak | cut | cut/single | balance | same"
    )
    print(header)
    print("|".join("---" for _ in header.split("|")))
    workers = args.workers.split(",")
    for w in workers:
        _spec(w)  # a bad run fails here, before any run
    for method in args.methods.split(","):
        ratios: dict[str, list[tuple[float, float, float]]] = {w: [] for w in workers}
        runs_by_rep: list[dict] = []
        for rep in range(args.repeat):
            runs = [None, *workers] if rep % 2 == 0 else [*workers, None]  # None: the single-process tool
            if args.no_single:
                runs = workers if rep % 2 == 0 else workers[::-1]
            results = {}
            for w in runs:
                results[w] = _one(meta, method, w, args)
                if args.no_single:  # nothing to compare with: the row now, and its output gone before the next
                    _print_row(method, rep, w, results[w], None)  # run's sync has to write it back
                    if not args.keep:
                        shutil.rmtree(_out(args, w, method), ignore_errors=True)
            runs_by_rep.append(results)
            base = results.get(None)
            for w in workers:
                if base is not None and method != "metis":
                    same = _same(args.work / f"single-{method}", _out(args, w, method))
                    results[w]["same"] = "yes" if same else "NO"
            for w in runs:
                r = results[w]
                if w is not None and base is not None:
                    ratios[w].append(tuple(r[k] / base[k] for k in ("seconds", "wall", "cpu")))
                if not args.no_single:
                    _print_row(method, rep, w, r, base)
            for w in workers:
                if not args.keep:
                    shutil.rmtree(_out(args, w, method), ignore_errors=True)
            if not args.keep:
                shutil.rmtree(args.work / f"single-{method}", ignore_errors=True)
        if args.no_single and len(workers) > 1:
            _print_speedups(method, workers, runs_by_rep)
        if args.repeat > 1 and not args.no_single:
            for w in workers:
                cols = np.array(ratios[w])
                print(
                    f"{method} {_label(w)} over {args.repeat} pairs (orders alternating): time/single median "
                    f"{np.median(cols[:, 0]):.2f} [{cols[:, 0].min():.2f}, {cols[:, 0].max():.2f}], wall/single "
                    f"{np.median(cols[:, 1]):.2f} [{cols[:, 1].min():.2f}, {cols[:, 1].max():.2f}], cpu/single "
                    f"{np.median(cols[:, 2]):.2f} [{cols[:, 2].min():.2f}, {cols[:, 2].max():.2f}]",
                    flush=True,
                )
    if not args.keep and args.input is None:
        shutil.rmtree(args.work / "input", ignore_errors=True)


if __name__ == "__main__":
    main()
