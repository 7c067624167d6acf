"""Typed partitioning of synthetic-mag read from DGL's chunked format: distgnn vs DGL 1.1.3, peak memory.

The graph is generated once per size and written in DGL's chunked format (not measured). Then each side
runs in its own process, and the parent takes that process's peak RSS from ``os.wait4`` (``ru_maxrss``):

* ``distgnn``: ``distgnn-partition --input DIR/metadata.json`` (the CLI as a user runs it: the chunked
  reader, typed METIS partitioning, node data streamed chunk by chunk into the partition files);
* ``dgl``: what a DGL 1.1.3 user does with the same files and ``dgl.distributed.partition_graph``: read
  every array into memory, build the ``dgl.heterograph`` (per-type ids, the papers' ``feat``, ``label`` and
  masks), then ``partition_graph(g, ..., part_method="metis")``. Its peak counts the heterograph, which
  DGL's partitioner needs in memory. Reading uses distgnn's chunked reader (the same parsing for both).

Both write 2 METIS partitions with one HALO hop (each side's defaults otherwise). A child passing
``--mem-limit-gib`` (the box is shared) or ``--timeout`` is killed and reported as such. The ratio rows
are distgnn over DGL (goal: peak RSS <= 0.5x).

    flock /tmp/distgnn-heavy.lock python benchmarks/partition_hetero.py --num-papers 100000,1000000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30
TOOLS = ("distgnn", "dgl")
NUM_PARTS = 2


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _measure(cmd: list[str], log_path: Path, mem_limit: int, timeout: float) -> dict:
    """Run ``cmd``; its wall seconds, peak RSS (``ru_maxrss``), and ``failed`` when it failed or was killed."""
    with open(log_path, "w") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        killed: list[str] = []

        def watch() -> None:
            while proc.returncode is None:
                if _rss_bytes(proc.pid) > mem_limit:
                    killed.append(f"killed above {mem_limit / GIB:.0f} GiB RSS")
                elif time.perf_counter() - start > timeout:
                    killed.append(f"killed after {timeout:.0f} s")
                if killed:
                    os.killpg(proc.pid, signal.SIGKILL)
                    return
                time.sleep(0.2)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
    watcher.join()
    cell = {"seconds": seconds, "peak_rss": usage.ru_maxrss * 1024}
    if killed or proc.returncode != 0:
        tail = log_path.read_text().strip().splitlines()[-3:]
        cell["failed"] = killed[0] if killed else f"exit {proc.returncode}: {' | '.join(tail)}"
    return cell


def _prepare(num_papers: int, workdir: Path) -> Path:
    """The chunked synthetic-mag of ``num_papers`` papers under ``workdir`` (written once, reused)."""
    out = workdir / f"mag-p{num_papers}"
    metadata = out / "metadata.json"
    if not metadata.exists():
        print(f"writing synthetic-mag {num_papers:,} papers in the chunked format to {out} ...", flush=True)
        code = (
            "import sys; from distgnn.data.synthetic_mag import synthetic_mag; "
            "from distgnn.data.chunked import write_chunked; "
            "write_chunked(synthetic_mag(int(sys.argv[1]), seed=0), sys.argv[2], num_chunks=8, overwrite=True)"
        )
        subprocess.run([sys.executable, "-c", code, str(num_papers), str(out)], check=True)
    return metadata


def dgl_worker(metadata: Path, out: Path) -> int:
    """The DGL side, in its own process: chunked files -> dgl.heterograph -> partition_graph."""
    import dgl
    import torch

    from distgnn.data.chunked import read_chunked
    from distgnn.data.hetero import materialize

    start = time.perf_counter()
    graph = read_chunked(metadata)
    edges = {etype: (torch.from_numpy(src), torch.from_numpy(dst)) for etype, (src, dst) in graph.edges.items()}
    g = dgl.heterograph(edges, num_nodes_dict=dict(graph.num_nodes))
    del edges
    for ntype, arrays in graph.ndata.items():
        for name, array in arrays.items():
            g.nodes[ntype].data[name] = torch.from_numpy(materialize(array))
    del graph
    built = time.perf_counter()
    dgl.distributed.partition_graph(g, "mag", NUM_PARTS, str(out), part_method="metis")
    print(f"TIMES {json.dumps({'load_s': built - start, 'partition_s': time.perf_counter() - built})}", flush=True)
    return 0


def _run_cell(tool: str, metadata: Path, workdir: Path, args) -> dict:
    out = workdir / f"out-{tool}"
    shutil.rmtree(out, ignore_errors=True)
    if tool == "distgnn":
        cli = Path(sys.executable).parent / "distgnn-partition"
        cmd = [str(cli), "--input", str(metadata), f"--num-parts={NUM_PARTS}", "--method=metis", "--out", str(out)]
    else:
        cmd = [sys.executable, __file__, "--dgl-worker", str(metadata), "--out", str(out)]
    log_path = workdir / f"{tool}.log"
    cell = _measure(cmd, log_path, int(args.mem_limit_gib * GIB), args.timeout)
    for line in log_path.read_text().splitlines():
        if line.startswith("TIMES "):
            cell.update(json.loads(line[len("TIMES ") :]))
    if "failed" not in cell:
        cell["disk_bytes"] = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    shutil.rmtree(out, ignore_errors=True)
    return cell


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-papers", default="100000,1000000", help="comma list of synthetic-mag sizes")
    p.add_argument("--tools", default=",".join(TOOLS), help=f"comma list of {', '.join(TOOLS)}")
    p.add_argument("--workdir", type=Path, default=ROOT / ".work" / "bench-partition-hetero")
    p.add_argument("--keep-input", action="store_true", help="keep the chunked graphs for the next run")
    p.add_argument("--mem-limit-gib", type=float, default=16.0, help="kill a side above this RSS")
    p.add_argument("--timeout", type=float, default=1800.0, help="kill a side after this many seconds")
    p.add_argument("--dgl-worker", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.dgl_worker:
        return dgl_worker(args.dgl_worker, args.out)
    sizes = [int(s) for s in args.num_papers.split(",")]
    tools = args.tools.split(",")
    if unknown := set(tools) - set(TOOLS):
        p.error(f"unknown tools {sorted(unknown)}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    results: dict[tuple[int, str], dict] = {}
    for size in sizes:
        metadata = _prepare(size, args.workdir)
        disk = sum(f.stat().st_size for f in metadata.parent.rglob("*") if f.is_file())
        for tool in tools:
            print(f"running {tool} on {size:,} papers ...", flush=True)
            results[size, tool] = cell = _run_cell(tool, metadata, args.workdir, args)
            print(f"  {cell}", flush=True)
        results[size, "input"] = {"disk_bytes": disk}
        if not args.keep_input:
            shutil.rmtree(metadata.parent)

    print(f"\nsynthetic-mag from the chunked format, {NUM_PARTS} METIS partitions, peak RSS of each side's process")
    print("| papers | tool | wall s | load s | partition s | peak RSS GiB | output GiB | note |")
    print("|---|---|---|---|---|---|---|---|")
    for size in sizes:
        for tool in tools:
            c = results[size, tool]
            load = f"{c['load_s']:.1f}" if "load_s" in c else ""
            part = f"{c['partition_s']:.1f}" if "partition_s" in c else ""
            disk = f"{c['disk_bytes'] / GIB:.2f}" if "disk_bytes" in c else ""
            wall = f"{c['seconds']:.1f}" if "failed" not in c else "-"
            print(
                f"| {size:,} | {tool} | {wall} | {load} | {part} | {c['peak_rss'] / GIB:.2f} | {disk} | "
                f"{c.get('failed', '')} |"
            )
        ours, theirs = results.get((size, "distgnn")), results.get((size, "dgl"))
        if ours and theirs and "failed" not in ours and "failed" not in theirs:
            print(
                f"| {size:,} | distgnn / dgl | {ours['seconds'] / theirs['seconds']:.2f}x | | | "
                f"{ours['peak_rss'] / theirs['peak_rss']:.2f}x | | goal: peak RSS <= 0.5x |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
