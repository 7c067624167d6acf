"""RPC feature-pull benchmark: distgnn vs DistDGL 1.1.3 vs an in-process memcpy.

A synthetic graph (100-dim float32 features) is partitioned into 2 parts
(random assignment) by distgnn and by DGL. Each system serves it as a
2-machine cluster on loopback (1 server per machine), a trainer on machine 0
pulls rows that machine 1 owns (all remote) through its DistTensor, and the
script prints pull throughput for 1k/10k/100k-row requests, the latency of
1-row requests, and the same bytes gathered in-process (``np.take`` into a
preallocated array).

    python benchmarks/rpc.py [--nodes 400000] [--skip-dgl]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SIZES = (1_000, 10_000, 100_000)


def _timings(pull, ids_for, reps: int) -> list[float]:
    out = []
    for i in range(reps + 2):
        ids = ids_for(i)
        start = time.perf_counter()
        pull(ids)
        if i >= 2:  # two warm-up rounds
            out.append(time.perf_counter() - start)
    return out


def measure(pull, remote_ids: np.ndarray, row_bytes: int, latency_reps: int, seed: int = 0) -> dict:
    """Median GB/s per request size and p50/p99 latency of 1-row pulls (microseconds)."""
    rng = np.random.default_rng(seed)
    result = {}
    for size in SIZES:
        reps = 30 if size < 100_000 else 10
        times = _timings(pull, lambda i, size=size: rng.choice(remote_ids, size, replace=len(remote_ids) < size), reps)
        result[f"gbps_{size}"] = size * row_bytes / np.median(times) / 1e9
    lat = _timings(pull, lambda i: remote_ids[rng.integers(len(remote_ids), size=1)], latency_reps)
    result["p50_us"] = float(np.percentile(lat, 50) * 1e6)
    result["p99_us"] = float(np.percentile(lat, 99) * 1e6)
    return result


# --- distgnn --------------------------------------------------------------------------------


def run_distgnn(graph, work: Path, latency_reps: int) -> tuple[dict, dict]:
    import torch

    from distgnn.client.context import connect
    from distgnn.client.graph import DistGraph
    from distgnn.partition import partition_graph
    from distgnn.partition.format import load_node_feature, read_meta
    from distgnn.train.cluster import LocalCluster

    json_path = partition_graph(graph, 2, work / "distgnn", method="random", seed=0)
    meta = read_meta(json_path)
    start, end = meta.node_map[1]
    remote_ids = np.arange(start, end, dtype=np.int64)
    with LocalCluster(json_path, servers_per_machine=1) as cluster, connect(cluster.config(0)) as ctx:
        feat = DistGraph(graph.name, json_path, context=ctx).ndata["feat"]
        row_bytes = feat.shape[1] * 4
        dist = measure(lambda ids: feat[torch.from_numpy(ids)], remote_ids, row_bytes, latency_reps)
    table = np.ascontiguousarray(load_node_feature(meta, 1, "feat", mmap=False))
    buffers = {}

    def memcpy(ids: np.ndarray) -> None:
        out = buffers.get(len(ids))
        if out is None:
            out = buffers[len(ids)] = np.empty((len(ids), table.shape[1]), table.dtype)
        np.take(table, ids - start, axis=0, out=out)

    for size in SIZES:
        memcpy(remote_ids[:size])  # allocate and touch the buffers before timing
    return dist, measure(memcpy, remote_ids, row_bytes, latency_reps)


# --- DistDGL 1.1.3 ---------------------------------------------------------------------------

DGL_SERVER = "import os, dgl; dgl.distributed.initialize(os.environ['DGL_IP_CONFIG'])"


def run_dgl(graph, work: Path, latency_reps: int, timeout_s: float) -> dict:
    import dgl
    import torch

    g = dgl.graph((torch.from_numpy(graph.src), torch.from_numpy(graph.dst)), num_nodes=graph.num_nodes)
    g.ndata["feat"] = torch.from_numpy(graph.ndata["feat"])
    out = work / "dgl"
    dgl.distributed.partition_graph(g, graph.name, 2, str(out), part_method="random", balance_edges=False)
    del g
    ports = _free_ports(2)
    ip_config = work / "dgl_ip_config.txt"
    ip_config.write_text("".join(f"127.0.0.1 {p}\n" for p in ports))
    conf = out / f"{graph.name}.json"
    common = {
        "DGL_IP_CONFIG": str(ip_config),
        "DGL_NUM_SERVER": "1",
        "DGL_NUM_CLIENT": "1",
        "DGL_CONF_PATH": str(conf),
        "DGL_GRAPH_FORMAT": "csc",
        "OMP_NUM_THREADS": "1",
    }
    servers = [
        subprocess.Popen(
            [sys.executable, "-c", DGL_SERVER],
            env={**os.environ, **common, "DGL_ROLE": "server", "DGL_SERVER_ID": str(i)},
            stdout=subprocess.DEVNULL,
            stderr=open(work / f"dgl_server{i}.log", "wb"),  # noqa: SIM115 (closed with the process)
        )
        for i in range(2)
    ]
    try:
        client = subprocess.run(
            [sys.executable, __file__, "--dgl-client", graph.name, str(conf), str(latency_reps)],
            env={**os.environ, **common, "DGL_ROLE": "client", "DGL_DIST_MODE": "distributed", "DGL_NUM_SAMPLER": "0"},
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if client.returncode != 0:
            raise RuntimeError(f"DGL client failed:\n{client.stderr[-3000:]}")
        return json.loads(client.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        logs = "\n".join((work / f"dgl_server{i}.log").read_text(errors="replace")[-1500:] for i in range(2))
        raise RuntimeError(f"DGL client did not finish within {timeout_s}s; server logs end:\n{logs}") from None
    finally:
        for p in servers:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def dgl_client(graph_name: str, conf: str, latency_reps: int) -> None:
    import dgl
    import torch

    dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])
    g = dgl.distributed.DistGraph(graph_name, part_config=conf)
    remote_ids = g.get_partition_book().partid2nids(1).numpy()
    feat = g.ndata["feat"]
    result = measure(lambda ids: feat[torch.from_numpy(ids)], remote_ids, feat.shape[1] * 4, latency_reps)
    dgl.distributed.exit_client()
    print(json.dumps(result))


def _free_ports(count: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# --- main -----------------------------------------------------------------------------------


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--dgl-client":
        dgl_client(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=400_000, help="graph nodes (each machine owns half)")
    parser.add_argument("--dim", type=int, default=100, help="feature dimension (float32)")
    parser.add_argument("--latency-reps", type=int, default=2000, help="1-row pulls for p50/p99")
    parser.add_argument("--skip-dgl", action="store_true", help="do not run DistDGL")
    parser.add_argument("--dgl-timeout", type=float, default=300.0, help="seconds the DGL client may take")
    args = parser.parse_args()
    if args.nodes // 2 < max(SIZES):
        parser.error(f"--nodes must be at least {2 * max(SIZES)} so a 100k-row request is all remote")

    from distgnn.data.synthetic import synthetic

    graph = synthetic(num_nodes=args.nodes, avg_degree=4, feat_dim=args.dim, num_classes=4, seed=0)
    work = Path(tempfile.mkdtemp(prefix="distgnn-bench-rpc-"))
    dgl_error = None
    try:
        rows = {}
        rows["distgnn"], rows["memcpy (np.take)"] = run_distgnn(graph, work, args.latency_reps)
        if not args.skip_dgl:
            try:
                rows["DistDGL 1.1.3"] = run_dgl(graph, work, args.latency_reps, args.dgl_timeout)
            except RuntimeError as exc:
                dgl_error = str(exc)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"remote pulls of {args.dim}-dim float32 rows, 2 machines x 1 server on loopback, {args.nodes} nodes")
    header = ["system", *[f"{s // 1000}k rows GB/s" for s in SIZES], "1-row p50 us", "1-row p99 us"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name, r in rows.items():
        cells = [f"{r[f'gbps_{s}']:.2f}" for s in SIZES] + [f"{r['p50_us']:.0f}", f"{r['p99_us']:.0f}"]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if dgl_error is not None:
        print(f"DistDGL 1.1.3 could not be measured: {dgl_error}")
    if "DistDGL 1.1.3" in rows:
        big = f"gbps_{max(SIZES)}"
        print(f"distgnn / DistDGL at 100k rows: {rows['distgnn'][big] / rows['DistDGL 1.1.3'][big]:.2f}x")
    print(
        f"memcpy / distgnn at 100k rows: {rows['memcpy (np.take)'][f'gbps_{max(SIZES)}'] / rows['distgnn'][f'gbps_{max(SIZES)}']:.2f}x"
    )


if __name__ == "__main__":
    main()
