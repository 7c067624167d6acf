"""``distgnn-partition``: partition a graph into the on-disk format, or check one.

    distgnn-partition --input G.npz | --dataset cora|citeseer|pubmed|synthetic [--data-dir D]
                      [--num-nodes N --avg-degree D --feat-dim F --num-classes C] [--undirected]
                      --graph-name NAME --num-parts K --method metis|random --out DIR
                      [--balance-train] [--balance-edges] [--halo-hops 1] [--seed S] [--overwrite]
                      [--metis-coarsen auto|on|off]
    distgnn-partition --check DIR/NAME.json

Bad input ends with one line ``error: ...`` on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from distgnn.errors import ConfigError, DistGNNError

DATASETS = ("cora", "citeseer", "pubmed", "synthetic")


class _Parser(argparse.ArgumentParser):
    """Raises instead of printing usage and exiting, so every error is one line."""

    def error(self, message: str):
        raise ConfigError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="distgnn-partition", description="Partition a graph for distgnn, or check a partition.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", type=Path, help=".npz with src, dst, num_nodes, ndata_<name>, edata_<name>")
    src.add_argument("--dataset", choices=DATASETS, help="built-in dataset")
    src.add_argument(
        "--check", type=Path, metavar="JSON", help="verify the partition at DIR/NAME.json and summarise it"
    )
    p.add_argument("--data-dir", type=Path, help="directory with the Planetoid ind.<name>.* files")
    p.add_argument("--undirected", action="store_true", help="--input: add the reverse of every edge")
    syn = p.add_argument_group("synthetic graph size")
    syn.add_argument("--num-nodes", type=int, default=100_000)
    syn.add_argument("--avg-degree", type=float, default=20.0, help="directed edges per node")
    syn.add_argument("--feat-dim", type=int, default=100)
    syn.add_argument("--num-classes", type=int, default=16)
    p.add_argument("--graph-name", help="partition name (default: the dataset name or input file stem)")
    p.add_argument("--num-parts", type=int, help="number of partitions K")
    p.add_argument("--method", choices=("metis", "random"), default="metis")
    p.add_argument("--out", type=Path, help="output directory")
    p.add_argument("--balance-train", action="store_true", help="METIS balances train nodes across partitions")
    p.add_argument("--balance-edges", action="store_true", help="METIS balances in-edges across partitions")
    p.add_argument("--halo-hops", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace an existing partition of the same graph")
    p.add_argument(
        "--metis-coarsen",
        choices=("auto", "on", "off"),
        default="auto",
        help="cluster and contract the graph in numpy before METIS (auto: from 2M adjacency entries; "
        "a fraction of METIS's memory); off hands METIS the whole graph",
    )
    return p


def _load(args: argparse.Namespace):
    from distgnn.data import load_npz, load_planetoid, synthetic

    if args.input is not None:
        return load_npz(args.input, undirected=args.undirected)
    if args.dataset == "synthetic":
        return synthetic(args.num_nodes, args.avg_degree, args.feat_dim, args.num_classes, seed=args.seed)
    if args.data_dir is None:
        raise ConfigError(f"--dataset {args.dataset} needs --data-dir (the directory with ind.{args.dataset}.* files)")
    return load_planetoid(args.dataset, args.data_dir)


def _print_check(json_path: Path) -> None:
    from distgnn.partition.check import check_partition, format_summary

    meta, rows = check_partition(json_path)
    print(format_summary(meta, rows))
    print(f"ok: {json_path} passes every check")


def _partition(args: argparse.Namespace) -> None:
    from distgnn.partition.format import check_output_dir
    from distgnn.partition.partitioner import partition_graph

    missing = [flag for flag, value in (("--num-parts", args.num_parts), ("--out", args.out)) if value is None]
    if missing:
        raise ConfigError(f"partitioning needs {' and '.join(missing)}")
    if args.num_parts < 1:
        raise ConfigError(f"--num-parts must be >= 1, got {args.num_parts}")
    if args.halo_hops < 1:
        raise ConfigError(f"--halo-hops must be >= 1, got {args.halo_hops}")
    if args.dataset == "synthetic" and (args.num_nodes < 2 or args.avg_degree <= 0 or args.feat_dim < 1):
        raise ConfigError("--num-nodes must be >= 2, --avg-degree > 0 and --feat-dim >= 1")
    name = args.graph_name or (args.input.stem if args.input is not None else args.dataset)
    # Refuse a bad output directory before spending minutes on loading and METIS.
    check_output_dir(args.out.resolve(), name, args.overwrite)

    start = time.perf_counter()
    print("load ...", flush=True)
    graph = _load(args)
    print(f"load done in {time.perf_counter() - start:.1f} s: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges")
    json_path = partition_graph(
        graph,
        args.num_parts,
        args.out,
        graph_name=name,
        method=args.method,
        balance_train=args.balance_train,
        balance_edges=args.balance_edges,
        halo_hops=args.halo_hops,
        seed=args.seed,
        overwrite=args.overwrite,
        metis_coarsen=args.metis_coarsen,
    )
    del graph
    print(f"total {time.perf_counter() - start:.1f} s")
    _print_check(json_path)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 2 bad input, 130 interrupted)."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("distgnn.partition")
    previous_level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        args = _parser().parse_args(argv)
        if args.check is not None:
            _print_check(args.check)
        else:
            _partition(args)
        return 0
    except (DistGNNError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except MemoryError:
        print("error: out of memory; use a machine with more RAM or a smaller graph", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted; no partition was written", file=sys.stderr)
        return 130
    finally:
        log.removeHandler(handler)
        log.setLevel(previous_level)


if __name__ == "__main__":
    sys.exit(main())
