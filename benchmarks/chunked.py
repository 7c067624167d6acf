"""Generate synthetic-mag, write it in DGL's chunked format, read it back: time and peak memory per stage.

Each stage runs in its own subprocess so its peak RSS is its own (``ru_maxrss`` of the child):

* ``generate``: ``synthetic_mag(P)`` alone;
* ``generate+write``: the same, then ``write_chunked`` (csv edges, ``.npy`` node data);
* ``read``: ``read_chunked`` (every edge chunk parsed into int64 arrays, node data headers only), then every
  node array streamed chunk by chunk as the partitioner does;
* ``read edges: pyarrow csv`` (the peer): the same edge files parsed by ``pyarrow.csv.read_csv`` with a space
  delimiter, as DGL's ``tools/distpartitioning`` reads them, converted to int64 numpy. Skipped without pyarrow.

The ratio column is the peer's seconds over ``read``'s (same files, same run; above 1: ours is faster).

    flock /tmp/distgnn-heavy.lock python benchmarks/chunked.py --num-papers 1000000 --out /tmp/mag-chunked
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path


def _peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)


def _stage(name: str, args: argparse.Namespace) -> dict:
    """Run one stage in this process; returns its figures."""
    from distgnn.data.chunked import read_chunked, write_chunked
    from distgnn.data.hetero import iter_row_blocks
    from distgnn.data.synthetic_mag import synthetic_mag

    if name == "peer":
        import numpy as np
        import pyarrow.csv

    metadata = args.out / "metadata.json"
    figures: dict = {}
    start = time.perf_counter()
    if name.startswith("generate"):
        graph = synthetic_mag(args.num_papers, seed=0)
        figures.update(nodes=graph.total_nodes, edges=graph.num_edges(), generate_s=time.perf_counter() - start)
        if name == "generate+write":
            begin = time.perf_counter()
            write_chunked(graph, args.out, num_chunks=args.num_chunks, overwrite=True)
            figures["write_s"] = time.perf_counter() - begin
    elif name == "read":
        graph = read_chunked(metadata)
        figures.update(edges=graph.num_edges(), read_s=time.perf_counter() - start)
        begin = time.perf_counter()
        for arrays in graph.ndata.values():
            for array in arrays.values():
                for _ in iter_row_blocks(array):
                    pass
        figures["stream_s"] = time.perf_counter() - begin
    elif name == "peer":
        meta = json.loads(metadata.read_text())
        edges = 0
        for entry in meta["edges"].values():
            for path in entry["data"]:
                table = pyarrow.csv.read_csv(
                    args.out / path,
                    read_options=pyarrow.csv.ReadOptions(autogenerate_column_names=True),
                    parse_options=pyarrow.csv.ParseOptions(delimiter=" "),
                )
                pairs = np.column_stack([c.to_numpy() for c in table.columns]).astype(np.int64, copy=False)
                edges += len(pairs)
        figures.update(edges=edges, read_s=time.perf_counter() - start)
    figures["peak_gib"] = _peak_gib()
    return figures


def _child(name: str, args: argparse.Namespace) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--stage", name, "--num-papers", str(args.num_papers), "--out", str(args.out)]
        + ["--num-chunks", str(args.num_chunks)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        sys.exit(f"stage {name} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-papers", type=int, default=1_000_000)
    p.add_argument("--num-chunks", type=int, default=8)
    p.add_argument("--out", type=Path, required=True, help="directory for the chunked graph (replaced)")
    p.add_argument("--keep", action="store_true", help="keep the chunked graph afterwards")
    p.add_argument("--stage", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.stage:
        print(json.dumps(_stage(args.stage, args)))
        return

    gen = _child("generate", args)
    written = _child("generate+write", args)
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    read = _child("read", args)
    have_pyarrow = importlib.util.find_spec("pyarrow") is not None
    peer = _child("peer", args) if have_pyarrow else None
    if not args.keep:
        shutil.rmtree(args.out)

    print(
        f"synthetic-mag, {args.num_papers:,} papers: {gen['nodes']:,} nodes, {gen['edges']:,} edges; "
        f"{args.num_chunks} chunks, {size / (1 << 30):.2f} GiB on disk"
    )
    print()
    print("| stage | seconds | peak RSS GiB | peer s / ours s |")
    print("|---|---|---|---|")
    print(f"| synthetic_mag | {gen['generate_s']:.1f} | {gen['peak_gib']:.2f} | |")
    print(f"| write_chunked (after generating) | {written['write_s']:.1f} | {written['peak_gib']:.2f} | |")
    ratio = f"{peer['read_s'] / read['read_s']:.2f}" if peer else "n/a"
    print(f"| read_chunked (edges parsed, data headers) | {read['read_s']:.1f} | {read['peak_gib']:.2f} | {ratio} |")
    print(f"| stream node data chunk by chunk | {read['stream_s']:.1f} | | |")
    if peer:
        print(
            f"| peer: pyarrow.csv edges (DGL's reader; each chunk dropped after parsing) | {peer['read_s']:.1f} | {peer['peak_gib']:.2f} | 1.00 |"
        )
    else:
        print("| peer: pyarrow.csv edges | skipped: pyarrow not installed | | |")


if __name__ == "__main__":
    main()
