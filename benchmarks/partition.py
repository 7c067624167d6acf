"""Partition the same synthetic graph with distgnn and with DGL 1.1.3, side by side.

Each (scale, tool) runs in its own subprocess, which generates the graph with
``distgnn.data.synthetic`` (same seed for both tools), then times the
partitioner alone: in-memory graph to partition files on disk, METIS, 4 parts,
one HALO hop. The parent reads the child's peak RSS through ``os.wait4`` and
kills a child that passes ``--mem-limit-gib`` (the box is shared) or
``--timeout``. Edge cut = directed edges whose endpoints land in different
partitions, computed the same way for both from the written node mapping.

Tools: ``distgnn`` (the default, ``metis_coarsen="auto"``: clustered and
contracted in numpy, METIS on the small graph, refined on the way back),
``distgnn-exact`` (``metis_coarsen="off"``: the whole graph to METIS, the
reference cut) and ``dgl``.

    flock /tmp/distgnn-heavy.lock python benchmarks/partition.py            # 1M/10M and products
    python benchmarks/partition.py --scales 1m --tools distgnn             # one cell
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

SCALES = {
    "100k": {"num_nodes": 100_000, "avg_degree": 10.0},
    "1m": {"num_nodes": 1_000_000, "avg_degree": 10.0},
    "products": {"num_nodes": 2_400_000, "avg_degree": 25.8},
}
FEAT_DIM = 100
NUM_CLASSES = 47
NUM_PARTS = 4
GIB = 1 << 30
TOOLS = ("distgnn", "distgnn-exact", "dgl")


def _rss_bytes(pid: int | str = "self", key: str = "VmRSS") -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cut(src: np.ndarray, dst: np.ndarray, part_of_orig: np.ndarray) -> int:
    return int(np.count_nonzero(part_of_orig[src] != part_of_orig[dst]))


def _part_of_orig(orig_nid: np.ndarray, node_ranges: list[list[int]]) -> np.ndarray:
    ends = np.asarray([end for _, end in node_ranges])
    part = np.empty(orig_nid.shape[0], dtype=np.int64)
    part[orig_nid] = np.searchsorted(ends, np.arange(orig_nid.shape[0]), side="right")
    return part


def _worker(tool: str, scale: str, out: Path) -> dict:
    from distgnn.data import synthetic

    graph = synthetic(SCALES[scale]["num_nodes"], SCALES[scale]["avg_degree"], FEAT_DIM, NUM_CLASSES, seed=0)
    if tool.startswith("distgnn"):
        from distgnn.partition import partition_graph
        from distgnn.partition.format import load_orig_ids, read_meta

        coarsen = "off" if tool == "distgnn-exact" else "auto"
        rss_before = _rss_bytes()
        start = time.perf_counter()
        json_path = partition_graph(graph, NUM_PARTS, out, graph_name="bench", method="metis", metis_coarsen=coarsen)
        seconds = time.perf_counter() - start
        meta = read_meta(json_path)
        orig_nid = np.asarray(load_orig_ids(meta)[0])
        node_ranges = meta.node_map
    else:
        import dgl
        import torch

        src, dst = graph.src, graph.dst
        g = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=graph.num_nodes)
        for name, arr in graph.ndata.items():
            g.ndata[name] = torch.from_numpy(arr)
        rss_before = _rss_bytes()
        start = time.perf_counter()
        orig_nids, _ = dgl.distributed.partition_graph(
            g, "bench", NUM_PARTS, str(out), part_method="metis", return_mapping=True
        )
        seconds = time.perf_counter() - start
        del g
        orig_nid = orig_nids.numpy()
        node_ranges = json.loads((out / "bench.json").read_text())["node_map"]["_N"]
    cut = _cut(graph.src, graph.dst, _part_of_orig(orig_nid, node_ranges))
    largest = max(end - start for start, end in node_ranges)
    return {
        "balance": largest * NUM_PARTS / graph.num_nodes,
        "seconds": seconds,
        "edge_cut": cut,
        "num_edges": graph.num_edges,
        "rss_before": rss_before,
        "disk_bytes": sum(p.stat().st_size for p in out.rglob("*") if p.is_file()),
    }


def _run_cell(tool: str, scale: str, mem_limit: int, timeout: float) -> dict:
    """Run one worker subprocess; returns its result plus ``peak_rss`` (or ``failed``)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"distgnn-bench-{tool}-{scale}-"))
    result_file = workdir / "result.json"
    cmd = [sys.executable, __file__, "--worker", tool, "--scales", scale, "--result", str(result_file)]
    log = open(workdir / "log.txt", "w")  # noqa: SIM115 (closed below; the child writes to it)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    killed: list[str] = []

    def watch() -> None:
        start = time.monotonic()
        while proc.poll() is None:
            rss = _rss_bytes(proc.pid)
            if rss > mem_limit:
                killed.append(f"killed above {mem_limit / GIB:.0f} GiB RSS")
            elif time.monotonic() - start > timeout:
                killed.append(f"killed after {timeout:.0f} s")
            if killed:
                os.killpg(proc.pid, signal.SIGKILL)
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    finally:
        log.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    watcher.join()
    peak = usage.ru_maxrss * 1024
    try:
        if killed or proc.returncode != 0:
            tail = (workdir / "log.txt").read_text().strip().splitlines()[-3:]
            reason = killed[0] if killed else f"exit {proc.returncode}: {' | '.join(tail)}"
            return {"failed": reason, "peak_rss": peak}
        result = json.loads(result_file.read_text())
        return {**result, "peak_rss": peak, "extra": peak - result["rss_before"]}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _fmt(cell: dict | None, key: str) -> str:
    if cell is None or "failed" in cell and key not in ("peak_rss",):
        return "-"
    value = cell[key]
    if key in ("peak_rss", "rss_before", "extra", "disk_bytes"):
        return f"{value / GIB:.2f}"
    if key == "seconds":
        return f"{value:.1f}"
    if key == "edge_cut":
        return f"{value:,} ({100 * value / cell['num_edges']:.1f}%)"
    if key == "balance":
        return f"{value:.3f}"
    return str(value)


def _table(results: dict[tuple[str, str], dict], scales: list[str], tools: list[str]) -> str:
    header = [
        "graph",
        "tool",
        "time s",
        "peak RSS GiB",
        "RSS before GiB",
        "peak - before",
        "edge cut",
        "max part / avg",
        "disk GiB",
        "note",
    ]
    rows = [header]
    for scale in scales:
        spec = SCALES[scale]
        label = f"{spec['num_nodes'] / 1e6:g}M nodes, deg {spec['avg_degree']:g}"
        for tool in tools:
            cell = results.get((scale, tool))
            row = [label, tool] + [
                _fmt(cell, k)
                for k in ("seconds", "peak_rss", "rss_before", "extra", "edge_cut", "balance", "disk_bytes")
            ]
            rows.append([*row, (cell or {}).get("failed", "")])
        for base in ("dgl", "distgnn-exact"):
            ours, theirs = results.get((scale, "distgnn")), results.get((scale, base))
            if ours and theirs and "failed" not in ours and "failed" not in theirs:
                rows.append(
                    [
                        label,
                        f"distgnn/{base.removeprefix('distgnn-')}",
                        f"{ours['seconds'] / theirs['seconds']:.2f}x",
                        f"{ours['peak_rss'] / theirs['peak_rss']:.2f}x",
                        "",
                        f"{ours['extra'] / theirs['extra']:.2f}x",
                        f"{ours['edge_cut'] / theirs['edge_cut']:.3f}x",
                        "",
                        f"{ours['disk_bytes'] / theirs['disk_bytes']:.2f}x",
                        "",
                    ]
                )
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scales", default="1m,products", help=f"comma list of {sorted(SCALES)}")
    p.add_argument("--tools", default=",".join(TOOLS), help=f"comma list of {', '.join(TOOLS)}")
    p.add_argument("--mem-limit-gib", type=float, default=18.0, help="kill a worker above this RSS")
    p.add_argument("--timeout", type=float, default=1800.0, help="kill a worker after this many seconds")
    p.add_argument("--worker", choices=TOOLS, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    scales = args.scales.split(",")
    tools = args.tools.split(",")
    unknown = [s for s in scales if s not in SCALES] + [t for t in tools if t not in TOOLS]
    if unknown:
        p.error(f"unknown scales/tools {unknown}")
    if args.worker:
        out = args.result.parent / "out"
        args.result.write_text(json.dumps(_worker(args.worker, scales[0], out)))
        return 0
    results = {}
    for scale in scales:
        for tool in tools:
            print(f"running {tool} on {scale} ...", flush=True)
            results[(scale, tool)] = cell = _run_cell(tool, scale, int(args.mem_limit_gib * GIB), args.timeout)
            print(f"  {cell}", flush=True)
    print(_table(results, scales, tools))
    return 0


if __name__ == "__main__":
    sys.exit(main())
