"""DGL's chunked graph format: :func:`read_chunked` into a :class:`~distgnn.data.hetero.HeteroGraph`, and
:func:`write_chunked` out of one.

The format (DGL's ``docs/source/guide/distributed-preprocessing.rst``; written by DGL's
``tools/chunk_graph.py``) is a ``metadata.json`` naming the node types with their per-chunk counts, the
canonical edge types ``"src:rel:dst"`` with theirs, and per edge type the chunk files of its edge list:
csv (two integer columns of per-type node ids, the ``delimiter`` the metadata names), ``.npy`` of shape
``(rows, 2)``, or parquet (two columns). Node and edge data are ``.npy`` or parquet chunk files. Paths are
absolute or relative to the metadata file's directory. Parquet needs pyarrow, imported only when a parquet
file is met.

Reading: every edge chunk is parsed, one file at a time, into preallocated int64 arrays; node and edge data
become :class:`~distgnn.data.hetero.ChunkedArray` s: only the ``.npy`` headers (or parquet footers) are read
up front, to check dtypes, row shapes and row counts, and the data is loaded one chunk at a time by whoever
iterates it (the partitioner). Peak memory is therefore the edge arrays (16 bytes per edge) plus one chunk
file as parsed. ``*_mask`` arrays of 0/1 integers become bool as they load. Every problem raises
:class:`~distgnn.errors.InputError` with one line naming the file and what is wrong.

Writing follows chunk_graph.py's layout (``edge_index/<src:rel:dst><j>.txt`` csv with a space,
``node_data/<ntype>/<name>-<j>.npy``, ``edge_data/<src:rel:dst>/<name>-<j>.npy``, chunk ``j`` of ``n`` rows
in ``k`` chunks holding ``n // k + (j < n % k)`` rows, metadata sorted and indented by 4) with two
differences: paths are relative (DGL writes absolute ones; relative ones keep the directory movable), and a
graph's ``num_classes`` is kept under an extra ``num_classes`` key, which DGL ignores. Arrays are streamed
(one source chunk or 1M rows, and 1M edges of csv text, at a time); the directory is written beside the
target and renamed into place, so a failure leaves nothing behind.
"""

from __future__ import annotations

import ast
import json
import logging
import math
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distgnn.data.hetero import (
    CanonicalEtype,
    ChunkedArray,
    FeatureArray,
    HeteroGraph,
    check_type_name,
    etype_str,
    iter_row_blocks,
)
from distgnn.errors import InputError

logger = logging.getLogger(__name__)

FORMATS = ("csv", "numpy", "parquet")
_REQUIRED_KEYS = ("graph_name", "node_type", "num_nodes_per_chunk", "edge_type", "num_edges_per_chunk", "edges")
# chunk_graph.py writes a space, and DGL's own edge reader splits on a space whatever the metadata says; it is
# also the default when a metadata entry names no delimiter.
CSV_DELIMITER = " "
# Edges per block of csv text the writer formats at a time.
_CSV_BLOCK = 1 << 20
# Data names become file names.
_DATA_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
# 10 ** k for every k an int64 may need (int64 max has 19 digits).
_POWERS = 10 ** np.arange(19, dtype=np.int64)


@dataclass(frozen=True)
class _FileSpec:
    """One ``{"format": ..., "data": [...]}`` entry of the metadata, with its paths resolved."""

    fmt: str
    delimiter: str
    paths: list[Path]
    where: str


@dataclass
class ChunkedLayout:
    """What the metadata and the data headers say about a chunked graph, before any edge is read.

    Attributes:
        path: the metadata file.
        graph_name: its ``graph_name``.
        num_nodes: node count per node type, in the metadata's order (the order fixes the type ids).
        node_chunks: rows per node chunk, per node type.
        etypes: canonical edge types, in the metadata's order.
        edge_chunks: rows per edge chunk, per canonical edge type.
        edge_specs: the edge-list files of each canonical edge type (one per chunk).
        ndata, edata: node / edge arrays as ChunkedArrays (headers checked, nothing loaded).
        num_classes: the optional ``num_classes`` key.
    """

    path: Path
    graph_name: str
    num_nodes: dict[str, int]
    node_chunks: dict[str, list[int]]
    etypes: list[CanonicalEtype]
    edge_chunks: dict[CanonicalEtype, list[int]]
    edge_specs: dict[CanonicalEtype, _FileSpec]
    ndata: dict[str, dict[str, ChunkedArray]]
    edata: dict[CanonicalEtype, dict[str, ChunkedArray]]
    num_classes: int | None

    @property
    def ntypes(self) -> list[str]:
        return list(self.num_nodes)

    def num_edges(self, etype: CanonicalEtype) -> int:
        return sum(self.edge_chunks[etype])

    def read_edge_chunk(self, etype: CanonicalEtype, index: int) -> tuple[np.ndarray, np.ndarray]:
        """``(src, dst)`` ``(rows,)`` int64 per-type node ids of chunk ``index`` of ``etype``, checked."""
        spec = self.edge_specs[etype]
        rows = self.edge_chunks[etype][index]
        file = spec.paths[index]
        if spec.fmt == "csv":
            pair = _read_csv_pairs(file, spec.delimiter)
        elif spec.fmt == "numpy":
            pair = _read_npy_pairs(file)
        else:
            pair = _read_parquet_pairs(file)
        if len(pair) != rows:
            raise InputError(
                f"{file}: {len(pair)} edges, but num_edges_per_chunk says chunk {index} of "
                f"{etype_str(etype)!r} has {rows}"
            )
        ends = []
        for column, (end, ntype) in enumerate((("source", etype[0]), ("destination", etype[2]))):
            ids = np.ascontiguousarray(pair[:, column], dtype=np.int64)
            bound = self.num_nodes[ntype]
            if rows and (ids.min() < 0 or ids.max() >= bound):
                row = int(np.flatnonzero((ids < 0) | (ids >= bound))[0])
                raise InputError(
                    f"{file}: row {row} has {end} id {int(ids[row])}, out of range for node type {ntype!r} "
                    f"([0, {bound}) by num_nodes_per_chunk)"
                )
            ends.append(ids)
        return ends[0], ends[1]


def read_chunked_layout(metadata_path: str | os.PathLike) -> ChunkedLayout:
    """Check the metadata, that every listed file exists, and every data file's header; read no edge.

    Raises:
        InputError: as :func:`read_chunked`, for everything but the edge files' contents.
    """
    path = Path(metadata_path)
    meta = _load_metadata(path)
    base = path.resolve().parent
    ntypes = _type_names(meta, path, "node_type")
    for ntype in ntypes:
        _checked(path, lambda ntype=ntype: check_type_name(ntype, "node type"))
    node_chunks = _chunk_counts(meta, path, "num_nodes_per_chunk", ntypes)
    num_nodes = {ntype: sum(node_chunks[ntype]) for ntype in ntypes}

    etype_names = _type_names(meta, path, "edge_type")
    etypes = [_canonical(path, name, num_nodes) for name in etype_names]
    edge_chunks = _chunk_counts(meta, path, "num_edges_per_chunk", etype_names)
    edge_specs = _spec_table(meta, path, "edges", etype_names, base)

    for name, spec in edge_specs.items():
        if len(spec.paths) != len(edge_chunks[name]):
            raise InputError(
                f"{path}: {spec.where} lists {len(spec.paths)} files but num_edges_per_chunk has "
                f"{len(edge_chunks[name])} chunks for {name!r}; give one file per chunk"
            )
        for file in spec.paths:
            _require_file(file, spec.where)

    ndata = {
        ntype: {
            key: _data_array(spec, node_chunks[ntype], key, f"node type {ntype!r}")
            for key, spec in specs.items()
            if spec.paths
        }
        for ntype, specs in _data_specs(meta, path, "node_data", ntypes, base).items()
    }
    by_name = dict(zip(etype_names, etypes, strict=True))
    edata = {
        by_name[name]: {
            key: _data_array(spec, edge_chunks[name], key, f"edge type {name!r}")
            for key, spec in specs.items()
            if spec.paths
        }
        for name, specs in _data_specs(meta, path, "edge_data", etype_names, base).items()
    }
    num_classes = meta.get("num_classes")
    if num_classes is not None and (not isinstance(num_classes, int) or isinstance(num_classes, bool)):
        raise InputError(f"{path}: 'num_classes' must be an integer, got {num_classes!r}")
    return ChunkedLayout(
        path=path,
        graph_name=meta["graph_name"],
        num_nodes=num_nodes,
        node_chunks=node_chunks,
        etypes=etypes,
        edge_chunks={by_name[name]: edge_chunks[name] for name in etype_names},
        edge_specs={by_name[name]: spec for name, spec in edge_specs.items()},
        ndata=ndata,
        edata=edata,
        num_classes=num_classes,
    )


def read_chunked(metadata_path: str | os.PathLike) -> HeteroGraph:
    """Read the chunked graph described by ``metadata_path`` (DGL's ``metadata.json``).

    Returns:
        A HeteroGraph named ``graph_name`` whose node and edge types follow the metadata's order; edges are
        ``(E_t,)`` int64 per-type node ids; node/edge data are ChunkedArrays of the files' dtypes (masks
        bool); ``num_classes`` comes from an optional ``num_classes`` key.

    Raises:
        InputError: one line naming the file and the problem (missing file, malformed metadata, a chunk
            whose row count disagrees with ``num_*_per_chunk``, an id out of range, chunks of one array with
            different dtypes or row shapes, a csv that does not parse as two integer columns...).
    """
    layout = read_chunked_layout(metadata_path)
    edges = {etype: _read_edges(layout, etype) for etype in layout.etypes}
    graph = HeteroGraph(
        name=layout.graph_name,
        num_nodes=layout.num_nodes,
        edges=edges,
        ndata=layout.ndata,
        edata=layout.edata,
        num_classes=layout.num_classes,
    )
    logger.info(
        "read %s: %d node types (%d nodes), %d edge types (%d edges)",
        layout.path,
        len(layout.num_nodes),
        graph.total_nodes,
        len(layout.etypes),
        graph.num_edges(),
    )
    return graph


def read_chunked_graph_name(metadata_path: str | os.PathLike) -> str:
    """The ``graph_name`` of a chunked graph, from its metadata alone (to name outputs before reading edges)."""
    return _load_metadata(Path(metadata_path))["graph_name"]


def _checked(path: Path, check: Callable[[], object]) -> None:
    """Run a check whose InputError does not name the file, and prefix the metadata path."""
    try:
        check()
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None


def _load_metadata(path: Path) -> dict:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file (expected the metadata.json of a chunked graph)") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory; pass the metadata.json inside it") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read it ({exc})") from None
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    if not isinstance(meta, dict):
        raise InputError(f"{path}: expected a JSON object with the keys {', '.join(_REQUIRED_KEYS)}")
    missing = [key for key in _REQUIRED_KEYS if key not in meta]
    if missing:
        raise InputError(
            f"{path}: missing key {', '.join(map(repr, missing))}; chunked-graph metadata needs "
            f"{', '.join(_REQUIRED_KEYS)}"
        )
    if not isinstance(meta["graph_name"], str) or not meta["graph_name"]:
        raise InputError(f"{path}: 'graph_name' must be a non-empty string, got {meta['graph_name']!r}")
    return meta


def _type_names(meta: dict, path: Path, key: str) -> list[str]:
    names = meta[key]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise InputError(f"{path}: {key!r} must be a list of strings, got {names!r}")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InputError(f"{path}: {key!r} lists {dup!r} twice")
    return names


def _canonical(path: Path, name: str, num_nodes: dict[str, int]) -> CanonicalEtype:
    parts = name.split(":")
    if len(parts) != 3:
        raise InputError(f"{path}: edge type {name!r} must be 'src_type:relation:dst_type'")
    etype = (parts[0], parts[1], parts[2])
    _checked(path, lambda: check_type_name(etype[1], f"relation of edge type {name!r}"))
    for end, ntype in (("source", etype[0]), ("destination", etype[2])):
        if ntype not in num_nodes:
            raise InputError(
                f"{path}: edge type {name!r} names {end} node type {ntype!r}, which is not in node_type "
                f"{list(num_nodes)}"
            )
    return etype


def _chunk_counts(meta: dict, path: Path, key: str, names: list[str]) -> dict[str, list[int]]:
    counts = meta[key]

    def count_list(value: object) -> bool:
        return isinstance(value, list) and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in value)

    if not isinstance(counts, list) or len(counts) != len(names) or not all(map(count_list, counts)):
        raise InputError(
            f"{path}: {key!r} must hold one list of non-negative integers per type ({len(names)} types: "
            f"{names}), got {json.dumps(counts)[:200]}"
        )
    return dict(zip(names, counts, strict=True))


def _file_spec(entry: object, where: str, path: Path, base: Path) -> _FileSpec:
    """Parse ``{"format": {"name": ..., "delimiter": ...}, "data": [paths]}``."""
    fmt = entry.get("format") if isinstance(entry, dict) else None
    data = entry.get("data") if isinstance(entry, dict) else None
    if not isinstance(fmt, dict) or not isinstance(data, list) or not all(isinstance(p, str) for p in data):
        raise InputError(f"{path}: {where} must be {{'format': {{'name': ...}}, 'data': [file paths]}}, got {entry!r}")
    name = fmt.get("name")
    if name not in FORMATS:
        raise InputError(f"{path}: {where} has format {name!r}; expected one of {', '.join(FORMATS)}")
    delimiter = fmt.get("delimiter", CSV_DELIMITER)
    if name == "csv" and (not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in "\r\n0123456789-"):
        raise InputError(f"{path}: {where} has csv delimiter {delimiter!r}; expected one character such as ' '")
    paths = [Path(p) if os.path.isabs(p) else base / p for p in data]
    return _FileSpec(name, delimiter, paths, where)


def _spec_table(meta: dict, path: Path, key: str, names: list[str], base: Path) -> dict[str, _FileSpec]:
    table = meta[key]
    if not isinstance(table, dict):
        raise InputError(f"{path}: {key!r} must be an object keyed by edge type, got {type(table).__name__}")
    unknown = sorted(set(table) - set(names))
    if unknown:
        raise InputError(f"{path}: {key!r} has entries for {unknown}, which are not in edge_type {names}")
    missing = [name for name in names if name not in table]
    if missing:
        raise InputError(f"{path}: {key!r} has no entry for edge type {missing[0]!r}")
    return {name: _file_spec(table[name], f"{key}[{name!r}]", path, base) for name in names}


def _data_specs(meta: dict, path: Path, key: str, names: list[str], base: Path) -> dict[str, dict[str, _FileSpec]]:
    table = meta.get(key) or {}
    kind = "node_type" if key == "node_data" else "edge_type"
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise InputError(f"{path}: {key!r} must be {{type: {{name: {{'format': ..., 'data': [...]}}}}}}")
    unknown = sorted(set(table) - set(names))
    if unknown:
        raise InputError(f"{path}: {key!r} has entries for {unknown}, which are not in {kind} {names}")
    return {
        name: {feat: _file_spec(entry, f"{key}[{name!r}][{feat!r}]", path, base) for feat, entry in feats.items()}
        for name, feats in table.items()
    }


def _require_file(file: Path, where: str) -> None:
    if not file.is_file():
        raise InputError(f"{file}: no such file (listed under {where})")


def _read_edges(layout: ChunkedLayout, etype: CanonicalEtype) -> tuple[np.ndarray, np.ndarray]:
    """Both ends of one edge type, read chunk by chunk into two preallocated ``(E_t,)`` int64 arrays."""
    total = layout.num_edges(etype)
    src = np.empty(total, dtype=np.int64)
    dst = np.empty(total, dtype=np.int64)
    start = 0
    for index, rows in enumerate(layout.edge_chunks[etype]):
        s, d = layout.read_edge_chunk(etype, index)
        src[start : start + rows] = s
        dst[start : start + rows] = d
        start += rows
    return src, dst


def _read_csv_pairs(file: Path, delimiter: str) -> np.ndarray:
    """A csv of two integer columns as ``(rows, 2)`` int64 (numpy's C parser)."""
    if file.stat().st_size == 0:
        return np.empty((0, 2), dtype=np.int64)
    try:
        pairs = np.loadtxt(file, dtype=np.int64, delimiter=delimiter, comments=None, ndmin=2, encoding="ascii")
    except (ValueError, UnicodeDecodeError) as exc:
        detail = " ".join(str(exc).split())
        raise InputError(
            f"{file}: does not read as two integer columns separated by {delimiter!r} ({detail}); check the "
            f"delimiter in the metadata"
        ) from None
    if pairs.shape[1] != 2:
        raise InputError(
            f"{file}: {pairs.shape[1]} columns separated by {delimiter!r}, expected 2 (source id, destination id)"
        )
    return pairs


def _read_npy_pairs(file: Path) -> np.ndarray:
    array = _load_npy(file, mmap=True)
    if array.ndim != 2 or array.shape[1] != 2 or array.dtype.kind not in "iu":
        raise InputError(f"{file}: {array.dtype}{list(array.shape)}, expected an integer array of shape (edges, 2)")
    return np.asarray(array, dtype=np.int64)


def _read_parquet_pairs(file: Path) -> np.ndarray:
    pairs = _read_parquet(file)
    if pairs.ndim != 2 or pairs.shape[1] != 2 or pairs.dtype.kind not in "iu":
        raise InputError(
            f"{file}: {pairs.dtype}{list(pairs.shape)}, expected two integer columns (source, destination)"
        )
    return pairs.astype(np.int64, copy=False)


def _load_npy(file: Path, mmap: bool) -> np.ndarray:
    try:
        return np.load(file, mmap_mode="r" if mmap else None, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"{file}: no such file") from None
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"{file}: not a readable .npy array ({' '.join(str(exc).split())})") from None


def _pyarrow_parquet(file: Path):
    try:
        import pyarrow.parquet
    except ImportError:
        raise InputError(
            f"{file}: is a parquet file and reading parquet needs pyarrow (pip install pyarrow), which is not installed"
        ) from None
    return pyarrow.parquet


def _parquet_header(file: Path) -> tuple[int, np.dtype, tuple[int, ...] | None]:
    """Row count, dtype and shape from the file's footer: DGL's ``shape`` metadata when present, else
    ``(rows, columns)`` for plain columns and None for one list column (its width is in the data only)."""
    pq = _pyarrow_parquet(file)
    try:
        info = pq.read_metadata(file)
        schema = info.schema.to_arrow_schema()
    except Exception as exc:  # pyarrow raises its own exception types for broken files
        raise InputError(f"{file}: not a readable parquet file ({' '.join(str(exc).split())})") from None
    types = [getattr(t, "value_type", t) for t in schema.types]
    try:
        dtype = np.result_type(*[np.dtype(t.to_pandas_dtype()) for t in types])
    except (NotImplementedError, TypeError) as exc:
        raise InputError(f"{file}: parquet columns of type {types} are not numeric ({exc})") from None
    shape = _parquet_shape(file, schema.metadata)
    if shape is None and not (len(schema.types) == 1 and hasattr(schema.types[0], "value_type")):
        shape = (info.num_rows, len(schema.types))
    return info.num_rows, dtype, shape


def _parquet_shape(file: Path, metadata: dict | None) -> tuple[int, ...] | None:
    """The array shape DGL's parquet writer stores as ``str(shape)`` in the schema metadata, if any."""
    raw = (metadata or {}).get(b"shape")
    if raw is None:
        return None
    try:
        shape = ast.literal_eval(raw.decode())
    except (ValueError, TypeError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError):
        shape = None
    dims = shape if isinstance(shape, tuple | list) else (shape,)
    if not all(type(d) is int and d >= 0 for d in dims):
        raise InputError(f"{file}: parquet 'shape' metadata {raw!r} is not a tuple of integers >= 0")
    return tuple(dims)


def _read_parquet(file: Path) -> np.ndarray:
    """A parquet chunk as numpy: plain columns side by side, or one list column as rows of vectors."""
    pq = _pyarrow_parquet(file)
    try:
        table = pq.read_table(file)
    except Exception as exc:  # pyarrow raises its own exception types for broken files
        raise InputError(f"{file}: not a readable parquet file ({' '.join(str(exc).split())})") from None
    shape = _parquet_shape(file, table.schema.metadata)
    columns = table.columns
    if len(columns) == 1 and hasattr(table.schema.types[0], "value_type"):
        values = columns[0].combine_chunks().flatten().to_numpy(zero_copy_only=False)
        array = values.reshape(table.num_rows, -1) if table.num_rows else values.reshape(0, 0)
    else:
        array = np.column_stack([c.to_numpy() for c in columns]) if columns else np.empty((table.num_rows, 0))
    if shape is not None:
        if math.prod(shape) != array.size:
            raise InputError(f"{file}: parquet 'shape' metadata {list(shape)} does not fit its {array.size} values")
        array = array.reshape(shape)
    return array


def _header(file: Path, fmt: str) -> tuple[int, np.dtype, tuple[int, ...]]:
    """``(rows, dtype, row shape)`` of one data chunk without reading its data where the format allows."""
    if fmt == "numpy":
        array = _load_npy(file, mmap=True)
        if array.ndim == 0:
            raise InputError(f"{file}: a 0-d array, expected one row per node or edge")
        return array.shape[0], array.dtype, array.shape[1:]
    rows, dtype, shape = _parquet_header(file)
    if shape is None:
        array = _read_parquet(file)
        return array.shape[0], array.dtype, array.shape[1:]
    if not shape or shape[0] != rows:
        raise InputError(f"{file}: parquet 'shape' metadata {list(shape)} disagrees with its {rows} rows")
    return rows, dtype, shape[1:]


def _data_array(spec: _FileSpec, declared: list[int], key: str, owner: str) -> ChunkedArray:
    """One node or edge array as a ChunkedArray over its files, after checking every file's header."""
    if spec.fmt == "csv":
        raise InputError(f"{spec.paths[0]}: {spec.where} is csv; node and edge data must be numpy or parquet")
    for file in spec.paths:
        _require_file(file, spec.where)
    headers = [_header(file, spec.fmt) for file in spec.paths]
    _, dtype, row_shape = headers[0]
    for file, (_, other_dtype, other_shape) in zip(spec.paths, headers, strict=True):
        if other_dtype != dtype or other_shape != row_shape:
            raise InputError(
                f"{file}: rows of {other_dtype}{list(other_shape)}, but {spec.paths[0].name} has "
                f"{dtype}{list(row_shape)}; every chunk of {spec.where} must have the same dtype and row shape"
            )
    rows = [h[0] for h in headers]
    if len(rows) == len(declared):
        for index, (file, got, want) in enumerate(zip(spec.paths, rows, declared, strict=True)):
            if got != want:
                raise InputError(
                    f"{file}: {got} rows, but {owner} has {want} in chunk {index} (num_*_per_chunk); "
                    f"{spec.where} must follow the chunking"
                )
    elif sum(rows) != sum(declared):
        raise InputError(
            f"{spec.paths[0].parent}: the {len(rows)} files of {spec.where} hold {sum(rows)} rows, but {owner} "
            f"has {sum(declared)}"
        )
    is_mask = key.endswith("_mask")
    if is_mask and (row_shape or not (dtype == np.bool_ or dtype.kind in "iu")):
        raise InputError(
            f"{spec.paths[0]}: {spec.where} is {dtype}{list(row_shape)}; a *_mask must be 1-d bool or 0/1 integers"
        )

    def loader(file: Path) -> Callable[[], np.ndarray]:
        def load() -> np.ndarray:
            array = _load_npy(file, mmap=False) if spec.fmt == "numpy" else _read_parquet(file)
            return _as_mask(file, array) if is_mask else array

        return load

    out_dtype = np.dtype(bool) if is_mask else dtype
    return ChunkedArray(
        [(n, loader(file)) for file, n in zip(spec.paths, rows, strict=True)], out_dtype, row_shape, spec.where
    )


def _as_mask(file: Path, array: np.ndarray) -> np.ndarray:
    if array.dtype == np.bool_:
        return array
    bad = (array != 0) & (array != 1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise InputError(f"{file}: mask value {array[row]} at row {row}; a mask holds only 0 and 1 (or bool)")
    return array.astype(bool)


def chunk_sizes(total: int, num_chunks: int) -> list[int]:
    """Rows per chunk as DGL's chunk_graph.py splits them: the first ``total % num_chunks`` get one more."""
    return [total // num_chunks + (j < total % num_chunks) for j in range(num_chunks)]


def format_edge_lines(src: np.ndarray, dst: np.ndarray, delimiter: str = CSV_DELIMITER) -> bytes:
    """``b"src<delimiter>dst\\n"`` per edge, formatted without a Python loop.

    Args:
        src, dst: ``(E,)`` non-negative integer ids.
        delimiter: one ASCII character between the two columns.
    """
    values = np.empty(2 * len(src), dtype=np.int64)
    values[0::2] = src
    values[1::2] = dst
    if values.size == 0:
        return b""
    if values.min() < 0:
        raise InputError(f"edge ids must be non-negative to be written as csv, got {int(values.min())}")
    digits = np.searchsorted(_POWERS, values, side="right").astype(np.int64)
    digits[values == 0] = 1
    ends = np.cumsum(digits + 1)  # one past each value's separator
    text = np.empty(int(ends[-1]), dtype=np.uint8)
    text[ends[0::2] - 1] = ord(delimiter)
    text[ends[1::2] - 1] = ord("\n")
    rest, last = values, ends - 2  # the position of each value's lowest remaining digit
    for _ in range(int(digits.max())):
        text[last] = 48 + rest % 10
        rest = rest // 10
        keep = rest > 0
        rest, last = rest[keep], last[keep] - 1
    return text.tobytes()


def write_chunked(graph: HeteroGraph, out_dir: str | os.PathLike, num_chunks: int = 4, overwrite: bool = False) -> Path:
    """Write ``graph`` to ``out_dir`` in DGL's chunked format; returns the path of its ``metadata.json``.

    Args:
        graph: any HeteroGraph (a homogeneous one is written with its ``_N`` / ``_N:_E:_N`` types).
        out_dir: the directory to create; an existing non-empty one is replaced only with ``overwrite``.
        num_chunks: chunks per node type, edge type and array (``>= 1``).
    """
    graph.validate()
    if not isinstance(num_chunks, int) or num_chunks < 1:
        raise InputError(f"num_chunks must be a positive integer, got {num_chunks!r}")
    for owner, arrays in [*graph.ndata.items(), *((etype_str(e), a) for e, a in graph.edata.items())]:
        for name in arrays:
            if not _DATA_NAME.match(name):
                raise InputError(f"data name {name!r} of {owner!r} must be letters, digits, '_', '.', '-'")
    out_dir = Path(out_dir)
    if out_dir.exists() and not (out_dir.is_dir() and not any(out_dir.iterdir())) and not overwrite:
        raise InputError(f"{out_dir}: already exists and is not an empty directory; pass overwrite=True to replace it")
    staging = out_dir.parent / f".{out_dir.name}.writing-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir(parents=True)
        metadata = _write_files(graph, staging, num_chunks)
        (staging / "metadata.json").write_text(json.dumps(metadata, sort_keys=True, indent=4))
        if out_dir.exists():
            old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
            out_dir.rename(old)
            shutil.rmtree(old)
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir / "metadata.json"


def _write_files(graph: HeteroGraph, root: Path, num_chunks: int) -> dict:
    node_chunks = {ntype: chunk_sizes(int(n), num_chunks) for ntype, n in graph.num_nodes.items()}
    edge_chunks = {etype: chunk_sizes(graph.num_edges(etype), num_chunks) for etype in graph.canonical_etypes}
    edges = {}
    for etype, (src, dst) in graph.edges.items():
        name = etype_str(etype)
        paths = [f"edge_index/{name}{j}.txt" for j in range(num_chunks)]
        _write_csv_chunks(src, dst, edge_chunks[etype], [root / p for p in paths])
        edges[name] = {"format": {"name": "csv", "delimiter": CSV_DELIMITER}, "data": paths}
    node_data = {
        ntype: _write_data(arrays, node_chunks[ntype], root, f"node_data/{ntype}", num_chunks)
        for ntype, arrays in graph.ndata.items()
        if arrays
    }
    edge_data = {
        etype_str(etype): _write_data(arrays, edge_chunks[etype], root, f"edge_data/{etype_str(etype)}", num_chunks)
        for etype, arrays in graph.edata.items()
        if arrays
    }
    metadata = {
        "graph_name": graph.name,
        "node_type": graph.ntypes,
        "num_nodes_per_chunk": [node_chunks[t] for t in graph.ntypes],
        "edge_type": [etype_str(e) for e in graph.canonical_etypes],
        "num_edges_per_chunk": [edge_chunks[e] for e in graph.canonical_etypes],
        "edges": edges,
        "node_data": node_data,
        "edge_data": edge_data,
    }
    if graph.num_classes is not None:
        metadata["num_classes"] = int(graph.num_classes)
    return metadata


def _write_csv_chunks(src: np.ndarray, dst: np.ndarray, sizes: list[int], paths: list[Path]) -> None:
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    start = 0
    for path, rows in zip(paths, sizes, strict=True):
        with open(path, "wb") as out:
            for lo in range(start, start + rows, _CSV_BLOCK):
                hi = min(lo + _CSV_BLOCK, start + rows)
                out.write(format_edge_lines(src[lo:hi], dst[lo:hi]))
        start += rows


def _write_data(arrays: dict[str, FeatureArray], sizes: list[int], root: Path, folder: str, num_chunks: int) -> dict:
    (root / folder).mkdir(parents=True, exist_ok=True)
    entries = {}
    for name, array in arrays.items():
        paths = [f"{folder}/{name}-{j}.npy" for j in range(num_chunks)]
        _write_npy_chunks(array, sizes, [root / p for p in paths])
        entries[name] = {"format": {"name": "numpy"}, "data": paths}
    return entries


def _write_npy_chunks(array: FeatureArray, sizes: list[int], paths: list[Path]) -> None:
    """Split ``array`` into ``.npy`` files of ``sizes`` rows, streaming its blocks through in order."""
    row_shape = tuple(array.shape[1:])
    dtype = np.dtype(array.dtype)
    blocks = iter_row_blocks(array)
    pending = np.empty((0, *row_shape), dtype=dtype)
    for path, rows in zip(paths, sizes, strict=True):
        with open(path, "wb") as out:
            header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (rows, *row_shape)}
            np.lib.format.write_array_header_1_0(out, header)
            need = rows
            while need:
                if not len(pending):
                    _, pending = next(blocks)
                take = np.ascontiguousarray(pending[:need], dtype=dtype)
                out.write(take.data)
                pending = pending[len(take) :]
                need -= len(take)
