"""``distgnn-partition``: partition a graph into the on-disk format, or check one.

    distgnn-partition --input G.npz | DIR/metadata.json | --dataset cora|citeseer|pubmed|synthetic|synthetic-mag
                      [--data-dir D] [--num-nodes N --avg-degree D] [--num-papers P] [--feat-dim F]
                      [--num-classes C] [--undirected] [--graph-name NAME] --num-parts K --method metis|random
                      --out DIR [--balance-train] [--balance-edges] [--target-ntype T] [--halo-hops 1]
                      [--seed S] [--overwrite] [--metis-coarsen auto|on|off]
    distgnn-partition --input DIR/metadata.json --num-parts K --out DIR --workers W [--local] [--dry-run]
                      [--method random|range|metis] [--message-mb MB] [--renumber auto|table|lookup] [--seed S]
                      [--overwrite]
    distgnn-partition --check DIR/NAME.json

With ``--workers W`` the job runs as W ranks of torch.distributed (``partition.distributed``): ``--local``
starts them on this host; without it this process is one rank and reads the torchrun environment (under
distgnn-launch, torchrun or srun). ``--dry-run`` prints each rank's peak memory estimate and exits.

Bad input ends with one line ``error: ...`` on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from distgnn.errors import ConfigError, DistGNNError

DATASETS = ("cora", "citeseer", "pubmed", "synthetic", "synthetic-mag")


class _Parser(argparse.ArgumentParser):
    """Raises instead of printing usage and exiting, so every error is one line."""

    def error(self, message: str):
        raise ConfigError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="distgnn-partition", description="Partition a graph for distgnn, or check a partition.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--input",
        type=Path,
        help=".npz with src, dst, num_nodes, ndata_<name>, edata_<name>; or the metadata.json of a graph in "
        "DGL's chunked format (docs/chunked-format.md)",
    )
    src.add_argument("--dataset", choices=DATASETS, help="built-in dataset")
    src.add_argument(
        "--check", type=Path, metavar="JSON", help="verify the partition at DIR/NAME.json and summarise it"
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        help="directory with the Planetoid ind.<name>.* files (default: downloaded into ~/.cache/distgnn/datasets)",
    )
    p.add_argument("--undirected", action="store_true", help="--input: add the reverse of every edge")
    syn = p.add_argument_group("synthetic graph size")
    syn.add_argument("--num-nodes", type=int, default=100_000, help="synthetic: node count")
    syn.add_argument("--avg-degree", type=float, default=20.0, help="synthetic: directed edges per node")
    syn.add_argument("--num-papers", type=int, default=100_000, help="synthetic-mag: paper count")
    syn.add_argument("--feat-dim", type=int, help="feature width (default: synthetic 100, synthetic-mag 128)")
    syn.add_argument("--num-classes", type=int, default=16)
    p.add_argument(
        "--graph-name",
        help="partition name (default: graph_name of a chunked input, the .npz file stem, or the dataset name)",
    )
    p.add_argument("--num-parts", type=int, help="number of partitions K")
    p.add_argument(
        "--method",
        choices=("metis", "random", "range"),
        default="metis",
        help="metis (with --workers: multilevel label propagation + METIS on the coarse graph), random (a "
        "seeded permutation dealt round robin) or range (each node type's ids in consecutive ranges)",
    )
    p.add_argument("--out", type=Path, help="output directory")
    p.add_argument("--balance-train", action="store_true", help="METIS balances train nodes across partitions")
    p.add_argument("--balance-edges", action="store_true", help="METIS balances in-edges across partitions")
    p.add_argument(
        "--target-ntype", help="the labelled node type whose train_mask --balance-train balances (heterogeneous)"
    )
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
    dist = p.add_argument_group("distributed job (a chunked --input)")
    dist.add_argument(
        "--workers", type=int, help="number of ranks W; partitions without reading the graph into one process"
    )
    dist.add_argument("--local", action="store_true", help="start the W ranks on this host")
    dist.add_argument(
        "--message-mb", type=float, default=256.0, help="bound of what one rank sends per all-to-all round (MiB)"
    )
    dist.add_argument(
        "--coarse-edges",
        type=int,
        default=50_000_000,
        help="--method metis: coarsen until the graph has at most this many adjacency entries, then METIS on "
        "rank 0 (default 50M)",
    )
    dist.add_argument(
        "--peer-timeout",
        type=float,
        default=20.0,
        help="seconds without a heartbeat after which a rank counts as dead and every rank stops (default 20)",
    )
    dist.add_argument(
        "--renumber",
        choices=("auto", "table", "lookup"),
        default="auto",
        help="how ranks learn the new ids of edge ends: table = every rank holds every node's new id (4 or 8 B "
        "a node), lookup = asked of their owners in bounded rounds; auto = the table where it is no larger than "
        "one id column of a rank's share of the edges (default)",
    )
    dist.add_argument(
        "--threads",
        type=int,
        default=0,
        help="threads per rank for its array steps (gathers, sorts); default: the CPUs this process may run on "
        "divided among this machine's ranks",
    )
    dist.add_argument("--dry-run", action="store_true", help="print each rank's peak memory estimate and exit")
    return p


def _is_chunked(args: argparse.Namespace) -> bool:
    return args.input is not None and args.input.suffix == ".json"


def _load(args: argparse.Namespace):
    from distgnn.data import load_npz, load_planetoid, synthetic, synthetic_mag
    from distgnn.data.chunked import read_chunked

    if _is_chunked(args):
        return read_chunked(args.input)
    if args.input is not None:
        return load_npz(args.input, undirected=args.undirected)
    if args.dataset == "synthetic":
        return synthetic(args.num_nodes, args.avg_degree, args.feat_dim or 100, args.num_classes, seed=args.seed)
    if args.dataset == "synthetic-mag":
        return synthetic_mag(
            args.num_papers, seed=args.seed, feat_dim=args.feat_dim or 128, num_classes=args.num_classes
        )
    return load_planetoid(args.dataset, args.data_dir)


def _print_check(json_path: Path) -> None:
    from distgnn.partition.check import check_partition, format_summary

    meta, rows = check_partition(json_path)
    print(format_summary(meta, rows))
    print(f"ok: {json_path} passes every check")


def _graph_name(args: argparse.Namespace) -> str:
    from distgnn.data.chunked import read_chunked_graph_name

    if args.graph_name:
        return args.graph_name
    if _is_chunked(args):
        return read_chunked_graph_name(args.input)
    return args.input.stem if args.input is not None else args.dataset


def _describe(graph) -> str:
    from distgnn.data.hetero import HeteroGraph

    if isinstance(graph, HeteroGraph):
        return (
            f"{graph.total_nodes:,} nodes of {len(graph.ntypes)} types, {graph.num_edges():,} edges of "
            f"{len(graph.canonical_etypes)} types"
        )
    return f"{graph.num_nodes:,} nodes, {graph.num_edges:,} edges"


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
    if args.dataset == "synthetic" and (args.num_nodes < 2 or args.avg_degree <= 0):
        raise ConfigError("--num-nodes must be >= 2 and --avg-degree > 0")
    if args.dataset == "synthetic-mag" and args.num_papers < 100:
        raise ConfigError(f"--num-papers must be >= 100, got {args.num_papers}")
    if args.feat_dim is not None and args.feat_dim < 1:
        raise ConfigError(f"--feat-dim must be >= 1, got {args.feat_dim}")
    if args.undirected and (args.input is None or _is_chunked(args)):
        raise ConfigError("--undirected applies to an .npz --input only")
    name = _graph_name(args)
    # Refuse a bad output directory before spending minutes on loading and METIS.
    check_output_dir(args.out.resolve(), name, args.overwrite)

    start = time.perf_counter()
    print("load ...", flush=True)
    graph = _load(args)
    print(f"load done in {time.perf_counter() - start:.1f} s: {_describe(graph)}")
    json_path = partition_graph(
        graph,
        args.num_parts,
        args.out,
        graph_name=name,
        method=args.method,
        balance_train=args.balance_train,
        balance_edges=args.balance_edges,
        target_ntype=args.target_ntype,
        halo_hops=args.halo_hops,
        seed=args.seed,
        overwrite=args.overwrite,
        metis_coarsen=args.metis_coarsen,
    )
    del graph
    print(f"total {time.perf_counter() - start:.1f} s")
    _print_check(json_path)


# A rank of the distributed job sorts and copies with numpy and moves bytes with gloo: no BLAS or OpenMP
# work. Those libraries start a pool of a thread per core when they load, threads that spin for a while
# there, beside the job's other ranks on the same cores.
SINGLE_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _single_threaded_numerics() -> None:
    """One thread for BLAS and OpenMP in this process and the ranks it starts, unless the user set them;
    a process that loaded numpy already (a caller's own) is left as it is."""
    if "numpy" in sys.modules:
        return
    for name in SINGLE_THREAD_ENV:
        os.environ.setdefault(name, "1")


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
        elif args.workers is not None or args.dry_run:
            _single_threaded_numerics()
            from distgnn.partition.dist_cli import run_workers

            return run_workers(args, argv if argv is not None else sys.argv[1:])
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
