"""Partitions made for a job on this host: what ``--local`` runs on.

:func:`ensure_partition` reuses a partition of a dataset in a work directory (same graph name, method and part
count) or writes one (:func:`job_partition`: the one a script's job flags name); :func:`partition_link_split` partitions a link split's training graph and writes its
held-out pairs, in the partition's node ids, beside it (:func:`link_job_partition`: the split a script's
flags name, reused after the first run). Part of the partition tool, so the runtime
(``distgnn/``) keeps to reading the format.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from distgnn.data.datasets import DatasetSpec, graph_name, load_dataset, load_link_split
from distgnn.data.graph import Graph
from distgnn.data.link_split import HELD_OUT, LINK_DIR, LinkSplit, reverse_edge_ids, save_held_out, to_partition_ids
from distgnn.errors import PartitionFormatError
from distgnn.partition.format import load_orig_ids, read_meta
from distgnn.partition.partitioner import partition_graph

log = logging.getLogger(__name__)


def ensure_partition(spec: DatasetSpec, num_parts: int, method: str, workdir: str | os.PathLike) -> Path:
    """The partition JSON of ``spec`` in ``workdir/<graph>-<method>-<num_parts>/``, partitioning only when
    no partition of the same graph name, method and part count is there (an unreadable one is rewritten)."""
    name = graph_name(spec)
    out_dir = Path(workdir) / f"{name}-{method}-{num_parts}"
    json_path = out_dir / f"{name}.json"
    if json_path.exists():
        try:
            meta = read_meta(json_path)
            if (meta.graph_name, meta.part_method, meta.num_parts) == (name, method, num_parts):
                log.info("reusing partition %s", json_path)
                return json_path
        except PartitionFormatError as exc:
            log.info("re-partitioning: %s", exc)
    start = time.perf_counter()
    g = load_dataset(spec)
    path = partition_graph(g, num_parts, out_dir, graph_name=name, method=method, overwrite=True)
    log.info("partitioned %s into %d parts in %.1fs: %s", name, num_parts, time.perf_counter() - start, path)
    return Path(path)


def job_partition(args) -> Path:
    """:func:`ensure_partition` of the dataset and job flags (``distgnn.data.datasets.add_dataset_args``,
    ``distgnn.train.job.add_job_args``: ``--num-parts --part-method --workdir``)."""
    return ensure_partition(DatasetSpec.from_args(args), args.num_parts, args.part_method, args.workdir)


def link_job_partition(args) -> Path:
    """The partition of the link split that the dataset, link-split and job flags name
    (:func:`distgnn.data.datasets.load_link_split`), in ``--workdir/split-<split>/``: split and partitioned on the
    first run, reused after (its held-out arrays, written last, say it is complete)."""
    name = graph_name(DatasetSpec.from_args(args))
    tag = f"v{args.val_fraction:g}-t{args.test_fraction:g}-k{args.eval_negatives}-s{args.seed}"
    if args.target_etype:
        tag += "-" + args.target_etype.replace(":", "_") + (f"-r{args.reverse_etype}" if args.reverse_etype else "")
    out_dir = Path(args.workdir) / f"split-{tag}" / f"{name}-{args.part_method}-{args.num_parts}"
    if (out_dir / LINK_DIR / f"{HELD_OUT[-1]}.npy").exists():
        log.info("reusing partition %s", out_dir / f"{name}.json")
        return out_dir / f"{name}.json"
    return partition_link_split(load_link_split(args), args.num_parts, out_dir, name, args.part_method, args.seed)


def partition_link_split(
    split: LinkSplit, num_parts: int, out_dir: str | os.PathLike, graph_name: str, method: str = "metis", seed: int = 0
) -> Path:
    """Partition ``split.train`` into ``out_dir`` and write the held-out arrays in new node ids under
    ``out_dir/link/`` (last, so their presence says the partition is complete). A homogeneous training graph
    carries each edge's reverse as the edge array ``reverse_eid`` (the partitioner renumbers it, so trainers
    read it as ``g.edata["reverse_eid"]``, where ``exclude="reverse_id"`` looks); a typed one (of
    :func:`~distgnn.data.link_split.split_typed_links`) excludes reverses by edge type instead.

    Returns the partition JSON. :func:`~distgnn.data.link_split.load_link_partition` reads the held-out arrays back.
    """
    if isinstance(split.train, Graph) and "reverse_eid" not in split.train.edata:
        split.train.edata["reverse_eid"] = reverse_edge_ids(split.train.src, split.train.dst)
    json_path = Path(
        partition_graph(
            split.train, num_parts, out_dir, graph_name=graph_name, method=method, seed=seed, overwrite=True
        )
    )
    orig_nid, _ = load_orig_ids(read_meta(json_path), mmap=False)
    held_out = {name: to_partition_ids(orig_nid, arr) for name, arr in split.held_out().items()}
    save_held_out(LinkSplit(split.train, **held_out), json_path.parent / LINK_DIR)
    log.info("wrote the link split of %s beside %s", graph_name, json_path)
    return json_path
