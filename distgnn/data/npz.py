"""Generic graph input: one ``.npz`` holding an edge list and node/edge arrays.

Keys: ``src``, ``dst`` (integer, one entry per directed edge), ``num_nodes``
(scalar), node arrays ``ndata_<name>`` (first dim = num_nodes) and edge arrays
``edata_<name>`` (first dim = number of edges). Edges are kept exactly as given,
duplicates and self loops included.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from distgnn.data.graph import Graph
from distgnn.errors import InputError


def load_npz(path: str | os.PathLike, undirected: bool = False, name: str | None = None) -> Graph:
    """Read a graph from ``path``; ``undirected`` appends the reverse of every edge.

    With ``undirected``, edge ``k`` of the input stays edge ``k`` and its reverse is
    edge ``E + k`` (edge arrays are repeated for the reverse edges).
    """
    path = Path(path)
    try:
        archive = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"input file {path} does not exist") from None
    except IsADirectoryError:
        raise InputError(f"input file {path} is a directory, expected an .npz file") from None
    except PermissionError:
        raise InputError(f"input file {path} is not readable (permission denied)") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise InputError(f"input file {path} is not an .npz archive: {exc}") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise InputError(f"input file {path} holds a single array, expected an .npz archive with src and dst")
    with archive:
        try:
            arrays = {key: archive[key] for key in archive.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise InputError(
                f"input file {path}: cannot read its arrays ({exc}); object arrays are not allowed"
            ) from None
    missing = [k for k in ("src", "dst") if k not in arrays]
    if missing:
        raise InputError(f"input file {path} has no {' or '.join(missing)} array (found {sorted(arrays)})")
    src, dst = arrays.pop("src"), arrays.pop("dst")
    for key, arr in (("src", src), ("dst", dst)):
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise InputError(f"input file {path}: {key} must be a 1-d integer array, got {arr.dtype} {arr.shape}")
    src, dst = src.astype(np.int64, copy=False), dst.astype(np.int64, copy=False)
    if "num_nodes" in arrays:
        num_nodes_arr = arrays.pop("num_nodes")
        if num_nodes_arr.size != 1 or num_nodes_arr.dtype.kind not in "iu":
            raise InputError(
                f"input file {path}: num_nodes must be one integer, got {num_nodes_arr.dtype} {num_nodes_arr.shape}"
            )
        num_nodes = int(num_nodes_arr.reshape(()))
    else:
        num_nodes = int(max(src.max(initial=-1), dst.max(initial=-1)) + 1)
    ndata = {k[len("ndata_") :]: v for k, v in arrays.items() if k.startswith("ndata_")}
    edata = {k[len("edata_") :]: v for k, v in arrays.items() if k.startswith("edata_")}
    unknown = sorted(k for k in arrays if not k.startswith(("ndata_", "edata_")))
    if unknown:
        raise InputError(f"input file {path} has unexpected arrays {unknown}; name them ndata_<name> or edata_<name>")
    graph = Graph(name or path.stem, num_nodes, src, dst, ndata=ndata, edata=edata)
    try:
        graph.validate()
    except InputError as exc:
        raise InputError(f"input file {path}: {exc}") from None
    if undirected:
        graph.src, graph.dst = np.concatenate([src, dst]), np.concatenate([dst, src])
        graph.edata = {k: np.concatenate([v, v]) for k, v in edata.items()}
    if "label" in ndata and ndata["label"].size and ndata["label"].dtype.kind in "iu":
        graph.num_classes = int(ndata["label"].max()) + 1
    return graph
