"""The on-disk partition format: the one place that reads or writes it.

Layout (see DESIGN.md): ``OUT/<graph_name>.json`` plus ``OUT/part<i>/`` with
plain ``.npy`` arrays (memory-mappable, never pickled) and the top-level
``orig_nid.npy`` / ``orig_eid.npy``. A partition is written into a staging
directory beside ``OUT`` and renamed into place, so an interrupted run never
leaves half a partition behind.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from distgnn.data.hetero import DEFAULT_ETYPE, DEFAULT_NTYPE, etype_str, parse_etype
from distgnn.errors import PartitionFormatError
from distgnn.partition.book import RangePartitionBook, edge_policy, node_policy

FORMAT_VERSION = 2
PART_ARRAYS = ("indptr", "indices", "eids", "local2global")
_REQUIRED_KEYS = (
    "format_version",
    "graph_name",
    "num_nodes",
    "num_edges",
    "num_parts",
    "part_method",
    "halo_hops",
    "node_map",
    "edge_map",
    "ntypes",
    "etypes",
    "node_feats",
    "edge_feats",
    "node_type_ranges",
    "edge_type_ranges",
    "orig_nid",
    "orig_eid",
    "parts",
)


def available_bytes() -> int | None:
    """``MemAvailable`` of this machine (Linux), or None where it is unknown: what a reader of partitions may
    still take (the partition tool's ranks, a trainer joining every partition's structure check against it)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def feature_key(type_name: str, name: str, default: str) -> str:
    """The key of a typed feature in ``node_feats``/``edge_feats``: ``name`` for the default type of a
    homogeneous graph, else ``"<type>/<name>"`` (``type_name`` is a node type or ``"src:rel:dst"``)."""
    return name if type_name == default else f"{type_name}/{name}"


def split_feature_key(key: str, default: str) -> tuple[str, str]:
    """``(type name, feature name)`` of a ``node_feats``/``edge_feats`` key (see :func:`feature_key`)."""
    type_name, sep, name = key.rpartition("/")
    return (type_name, name) if sep else (default, key)


def feature_policy(key: str, kind: str) -> tuple[str, str]:
    """``(id space, feature name)`` of a ``node_feats`` (``kind="node"``) or ``edge_feats`` key: the
    feature is a DistTensor of that policy (see ``distgnn.partition.book.node_policy``)."""
    if kind == "node":
        ntype, name = split_feature_key(key, DEFAULT_NTYPE)
        return node_policy(ntype), name
    etype, name = split_feature_key(key, etype_str(DEFAULT_ETYPE))
    return edge_policy(parse_etype(etype)), name


@dataclass(frozen=True)
class FeatureSpec:
    """dtype name (numpy, e.g. ``"float32"``) and global shape (first dim = count)."""

    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class PartInfo:
    """One partition's files (paths relative to the JSON's directory) and counts."""

    dir: str
    num_owned_nodes: int
    num_halo_nodes: int
    num_edges: int
    files: dict[str, str]
    node_feats: dict[str, str] = field(default_factory=dict)
    edge_feats: dict[str, str] = field(default_factory=dict)

    @property
    def num_local_nodes(self) -> int:
        return self.num_owned_nodes + self.num_halo_nodes


@dataclass(frozen=True)
class PartitionMeta:
    """Parsed ``<graph_name>.json``; ``root`` is the directory holding it."""

    root: Path
    graph_name: str
    num_nodes: int
    num_edges: int
    num_parts: int
    part_method: str
    halo_hops: int
    node_map: list[list[int]]
    edge_map: list[list[int]]
    ntypes: list[str]
    etypes: list[str]
    node_type_ranges: list
    edge_type_ranges: list
    node_feats: dict[str, FeatureSpec]
    edge_feats: dict[str, FeatureSpec]
    orig_nid: str
    orig_eid: str
    parts: list[PartInfo]
    format_version: int = FORMAT_VERSION
    extra: dict = field(default_factory=dict)

    @property
    def json_path(self) -> Path:
        return self.root / f"{self.graph_name}.json"

    @property
    def canonical_etypes(self) -> list[tuple[str, str, str]]:
        return [parse_etype(e) for e in self.etypes]

    def partition_book(self) -> RangePartitionBook:
        return RangePartitionBook(
            self.node_map,
            self.edge_map,
            self.ntypes,
            self.canonical_etypes,
            np.asarray(self.node_type_ranges, dtype=np.int64),
            np.asarray(self.edge_type_ranges, dtype=np.int64),
        )

    def to_json_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("root", "extra")}
        d["node_feats"] = {k: {"dtype": v.dtype, "shape": list(v.shape)} for k, v in self.node_feats.items()}
        d["edge_feats"] = {k: {"dtype": v.dtype, "shape": list(v.shape)} for k, v in self.edge_feats.items()}
        d.update(self.extra)
        return d


def _feature_specs(raw: dict, where: str) -> dict[str, FeatureSpec]:
    try:
        return {name: FeatureSpec(str(s["dtype"]), tuple(int(x) for x in s["shape"])) for name, s in raw.items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise PartitionFormatError(f"{where}: feature specs must be {{name: {{dtype, shape}}}}: {exc}") from exc


def read_meta(path: str | os.PathLike) -> PartitionMeta:
    """Read and validate the partition JSON at ``path``."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise PartitionFormatError(f"partition config {path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise PartitionFormatError(f"partition config {path} is not readable JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise PartitionFormatError(f"{path}: expected a JSON object at the top level")
    missing = [k for k in _REQUIRED_KEYS if k not in raw]
    if missing:
        raise PartitionFormatError(f"{path}: missing keys {missing}; is this a distgnn partition config?")
    if raw["format_version"] != FORMAT_VERSION:
        raise PartitionFormatError(
            f"{path}: format_version {raw['format_version']} is not supported (this distgnn reads {FORMAT_VERSION}); "
            "re-run distgnn-partition"
        )
    try:
        parts = [
            PartInfo(
                dir=p["dir"],
                num_owned_nodes=int(p["num_owned_nodes"]),
                num_halo_nodes=int(p["num_halo_nodes"]),
                num_edges=int(p["num_edges"]),
                files=dict(p["files"]),
                node_feats=dict(p.get("node_feats", {})),
                edge_feats=dict(p.get("edge_feats", {})),
            )
            for p in raw["parts"]
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise PartitionFormatError(f"{path}: malformed 'parts' entry: {exc}") from exc
    known = set(_REQUIRED_KEYS)
    meta = PartitionMeta(
        root=path.resolve().parent,
        graph_name=str(raw["graph_name"]),
        num_nodes=int(raw["num_nodes"]),
        num_edges=int(raw["num_edges"]),
        num_parts=int(raw["num_parts"]),
        part_method=str(raw["part_method"]),
        halo_hops=int(raw["halo_hops"]),
        node_map=[[int(a), int(b)] for a, b in raw["node_map"]],
        edge_map=[[int(a), int(b)] for a, b in raw["edge_map"]],
        ntypes=list(raw["ntypes"]),
        etypes=list(raw["etypes"]),
        node_type_ranges=raw["node_type_ranges"],
        edge_type_ranges=raw["edge_type_ranges"],
        node_feats=_feature_specs(raw["node_feats"], str(path)),
        edge_feats=_feature_specs(raw["edge_feats"], str(path)),
        orig_nid=str(raw["orig_nid"]),
        orig_eid=str(raw["orig_eid"]),
        parts=parts,
        format_version=int(raw["format_version"]),
        extra={k: v for k, v in raw.items() if k not in known},
    )
    if len(parts) != meta.num_parts or len(meta.node_map) != meta.num_parts or len(meta.edge_map) != meta.num_parts:
        raise PartitionFormatError(
            f"{path}: num_parts is {meta.num_parts} but there are {len(parts)} parts, "
            f"{len(meta.node_map)} node ranges and {len(meta.edge_map)} edge ranges"
        )
    return meta


def _load(meta: PartitionMeta, rel: str, mmap: bool) -> np.ndarray:
    full = meta.root / rel
    try:
        return np.load(full, mmap_mode="r" if mmap else None, allow_pickle=False)
    except FileNotFoundError:
        raise PartitionFormatError(f"partition file {full} is missing") from None
    except ValueError as exc:
        raise PartitionFormatError(f"partition file {full} is not a plain .npy array: {exc}") from exc


def _part(meta: PartitionMeta, part_id: int) -> PartInfo:
    if not 0 <= part_id < meta.num_parts:
        raise PartitionFormatError(f"partition id {part_id} out of range [0, {meta.num_parts})")
    return meta.parts[part_id]


def load_part_array(meta: PartitionMeta, part_id: int, name: str, mmap: bool = True) -> np.ndarray:
    """One of ``PART_ARRAYS`` for partition ``part_id``."""
    part = _part(meta, part_id)
    if name not in part.files:
        raise PartitionFormatError(f"partition {part_id} of {meta.json_path} lists no file for {name!r}")
    return _load(meta, part.files[name], mmap)


def load_node_feature(meta: PartitionMeta, part_id: int, name: str, mmap: bool = True) -> np.ndarray:
    """Owned rows of node feature ``name`` in partition ``part_id``, in new-id order."""
    part = _part(meta, part_id)
    if name not in part.node_feats:
        raise PartitionFormatError(f"partition {part_id} has no node feature {name!r} (has {sorted(part.node_feats)})")
    return _load(meta, part.node_feats[name], mmap)


def load_edge_feature(meta: PartitionMeta, part_id: int, name: str, mmap: bool = True) -> np.ndarray:
    """Owned rows of edge feature ``name`` in partition ``part_id``, in new-edge-id order."""
    part = _part(meta, part_id)
    if name not in part.edge_feats:
        raise PartitionFormatError(f"partition {part_id} has no edge feature {name!r} (has {sorted(part.edge_feats)})")
    return _load(meta, part.edge_feats[name], mmap)


def load_orig_ids(meta: PartitionMeta, mmap: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(orig_nid, orig_eid)``: the original id of each new node and edge id."""
    return _load(meta, meta.orig_nid, mmap), _load(meta, meta.orig_eid, mmap)


class PartitionWriter:
    """Stages a partition beside ``out_dir`` and renames it into place on ``commit``.

    Use as a context manager: leaving the block without ``commit`` (an error,
    Ctrl-C) removes the staging directory and leaves ``out_dir`` untouched.
    """

    def __init__(self, out_dir: str | os.PathLike, graph_name: str, overwrite: bool = False):
        self.out_dir = Path(out_dir).resolve()
        self.graph_name = graph_name
        self.overwrite = overwrite
        check_output_dir(self.out_dir, graph_name, overwrite)
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        # Other processes of a distributed job write their files under the same staging directory.
        self.staging = Path(tempfile.mkdtemp(prefix=f".{self.out_dir.name}.staging-", dir=self.out_dir.parent))
        self._committed = False

    def __enter__(self) -> PartitionWriter:
        return self

    def __exit__(self, *exc) -> None:
        if not self._committed:
            shutil.rmtree(self.staging, ignore_errors=True)

    def open(self, rel: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A writable memory map of a new ``.npy`` file at ``rel``, for arrays filled piece by piece."""
        full = self.staging / rel
        full.parent.mkdir(parents=True, exist_ok=True)
        return np.lib.format.open_memmap(full, mode="w+", dtype=dtype, shape=tuple(shape))

    def save(self, rel: str, array: np.ndarray) -> str:
        """Write ``array`` to ``rel`` (relative to the partition root); returns ``rel``."""
        full = self.staging / rel
        full.parent.mkdir(parents=True, exist_ok=True)
        np.save(full, np.ascontiguousarray(array), allow_pickle=False)
        return rel

    def commit(self, meta: PartitionMeta) -> Path:
        """Write the JSON and move the staged partition to ``out_dir``; returns the JSON path."""
        if meta.graph_name != self.graph_name:
            raise PartitionFormatError(f"meta is for graph {meta.graph_name!r}, writer for {self.graph_name!r}")
        (self.staging / f"{self.graph_name}.json").write_text(json.dumps(meta.to_json_dict(), indent=1))
        old = None
        if self.out_dir.exists():
            # check_output_dir allowed this: it is empty or (with overwrite) holds this graph.
            # Move it aside first, so there is always a whole partition at out_dir or none.
            old = Path(tempfile.mkdtemp(prefix=f".{self.out_dir.name}.old-", dir=self.out_dir.parent))
            os.replace(self.out_dir, old)
        os.replace(self.staging, self.out_dir)
        self._committed = True
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.out_dir / f"{self.graph_name}.json"


def check_output_dir(out_dir: Path, graph_name: str, overwrite: bool) -> None:
    """Refuse to write over a directory that holds anything but a partition of this graph
    (and that one only with ``overwrite``)."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise PartitionFormatError(f"output path {out_dir} exists and is not a directory")
    entries = list(out_dir.iterdir())
    if not entries:
        return
    configs = [e for e in entries if e.suffix == ".json"]
    if [c.name for c in configs] != [f"{graph_name}.json"]:
        raise PartitionFormatError(
            f"output directory {out_dir} is not empty and does not hold a partition of {graph_name!r} "
            f"(found {sorted(e.name for e in entries)[:5]}); choose another --out"
        )
    if not overwrite:
        raise PartitionFormatError(
            f"output directory {out_dir} already holds a partition of {graph_name!r}; pass --overwrite to replace it"
        )
