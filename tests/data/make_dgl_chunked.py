"""Write the chunked-format fixtures under tests/data/dgl_chunked with DGL's own ``tools/chunk_graph.py``.

    python tests/data/make_dgl_chunked.py DGL_TOOLS_DIR OUT_DIR

``DGL_TOOLS_DIR`` is the ``tools`` directory of DGL's repository at v1.1.3
(``git -C DGL_REPO archive v1.1.3 tools | tar -x -C /tmp/dgl-v1.1.3``); it needs ``dgl``, ``pandas`` and
``pyarrow``. Three graphs are written, each as DGL writes it (``OUT_DIR/<name>/metadata.json``, absolute
paths) and with a relative-path copy of that metadata (``metadata-relative.json``), plus
``OUT_DIR/<name>-expected.npz`` holding every array for the tests to compare with:

* ``hetero``: three node types (``field`` has fewer nodes than chunks, so some chunks are empty), four edge
  types, node data with a bool mask and a 0/1 int64 mask, 2-d float features, edge data; 3 chunks.
* ``homo``: one node type and one edge type (DGL's ``_N`` / ``_N:_E:_N``); 2 chunks.
* ``homo_parquet``: the same homogeneous graph with its node and edge data written as parquet.

Keys of the ``.npz``: ``num_nodes/<ntype>``, ``src/<etype>``, ``dst/<etype>``, ``ndata/<ntype>/<name>``,
``edata/<etype>/<name>`` (``etype`` as ``src:rel:dst``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np


def hetero_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(15)
    num_nodes = {"paper": 11, "author": 7, "field": 2}
    out = {f"num_nodes/{t}": np.int64(n) for t, n in num_nodes.items()}
    edge_counts = {
        ("author", "writes", "paper"): 17,
        ("paper", "rev_writes", "author"): 17,
        ("paper", "cites", "paper"): 23,
        ("paper", "has_topic", "field"): 2,
    }
    for (s, r, d), count in edge_counts.items():
        key = f"{s}:{r}:{d}"
        out[f"src/{key}"] = rng.integers(0, num_nodes[s], count, dtype=np.int64)
        out[f"dst/{key}"] = rng.integers(0, num_nodes[d], count, dtype=np.int64)
    out["src/paper:rev_writes:author"] = out["dst/author:writes:paper"].copy()
    out["dst/paper:rev_writes:author"] = out["src/author:writes:paper"].copy()
    out["ndata/paper/feat"] = rng.standard_normal((11, 5)).astype(np.float32)
    out["ndata/paper/label"] = rng.integers(0, 3, 11, dtype=np.int64)
    out["ndata/paper/train_mask"] = rng.random(11) < 0.5
    out["ndata/paper/val_mask"] = (rng.random(11) < 0.3).astype(np.int64)
    out["ndata/author/feat"] = rng.standard_normal((7, 5)).astype(np.float32)
    out["edata/paper:cites:paper/weight"] = rng.random(23).astype(np.float32)
    out["edata/author:writes:paper/year"] = rng.integers(1990, 2020, (17, 2), dtype=np.int32)
    return out


def homo_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(16)
    n, e = 9, 21
    return {
        "num_nodes/_N": np.int64(n),
        "src/_N:_E:_N": rng.integers(0, n, e, dtype=np.int64),
        "dst/_N:_E:_N": rng.integers(0, n, e, dtype=np.int64),
        "ndata/_N/feat": rng.standard_normal((n, 3)).astype(np.float32),
        "ndata/_N/label": rng.integers(0, 4, n, dtype=np.int64),
        "ndata/_N/train_mask": rng.random(n) < 0.5,
        "edata/_N:_E:_N/w": rng.random(e).astype(np.float32),
    }


def _dgl_graph(arrays: dict[str, np.ndarray]):
    import dgl
    import torch

    num_nodes = {k.split("/", 1)[1]: int(v) for k, v in arrays.items() if k.startswith("num_nodes/")}
    data = {
        tuple(k.split("/", 1)[1].split(":")): (torch.from_numpy(v), torch.from_numpy(arrays["dst/" + k[4:]]))
        for k, v in arrays.items()
        if k.startswith("src/")
    }
    return dgl.heterograph(data, num_nodes_dict=num_nodes)


def _write(tools: Path, name: str, arrays: dict[str, np.ndarray], num_chunks: int, out_dir: Path, fmt: str) -> None:
    sys.path.insert(0, str(tools))
    from chunk_graph import chunk_graph  # DGL's tool, from the export named on the command line

    graph = _dgl_graph(arrays)
    target = out_dir / name
    shutil.rmtree(target, ignore_errors=True)
    with tempfile.TemporaryDirectory() as scratch:
        ndata, edata = {}, {}
        for key, value in arrays.items():
            kind, owner, feat = (key.split("/") + [""])[:3]
            if kind not in ("ndata", "edata"):
                continue
            path = Path(scratch) / f"{kind}-{owner}-{feat}.npy"
            np.save(path, value)
            table = ndata if kind == "ndata" else edata
            table.setdefault(owner if kind == "ndata" else tuple(owner.split(":")), {})[feat] = str(path)
        cwd = os.getcwd()
        try:
            chunk_graph(graph, name, ndata, edata, num_chunks, str(target), data_fmt=fmt)
        finally:
            os.chdir(cwd)
    meta_text = (target / "metadata.json").read_text()
    prefix = str(target.resolve()) + "/"
    (target / "metadata-relative.json").write_text(meta_text.replace(prefix, ""))
    assert prefix not in (target / "metadata-relative.json").read_text()
    json.loads(meta_text)
    np.savez(out_dir / f"{name}-expected.npz", **arrays)


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tools, out_dir = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    _write(tools, "hetero", hetero_arrays(), 3, out_dir, "numpy")
    _write(tools, "homo", homo_arrays(), 2, out_dir, "numpy")
    _write(tools, "homo_parquet", homo_arrays(), 2, out_dir, "parquet")


if __name__ == "__main__":
    main()
