"""DGL's chunked graph format: reading files DGL's own chunk_graph.py wrote, writing them the way it does, the
write -> read round trip, and every bad input as one InputError line naming the file."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from distgnn.data.chunked import chunk_sizes, format_edge_lines, read_chunked, write_chunked
from distgnn.data.hetero import ChunkedArray, HeteroGraph, materialize
from distgnn.errors import InputError

DATA = Path(__file__).resolve().parent
FIXTURES = DATA / "dgl_chunked"
GRAPHS = ["hetero", "homo", "homo_parquet"]
HAVE_PYARROW = importlib.util.find_spec("pyarrow") is not None


def _needs_reader(name: str) -> None:
    if name.endswith("parquet") and not HAVE_PYARROW:
        pytest.skip("pyarrow is not installed (the parquet fixture needs it)")


def _assert_matches_expected(graph: HeteroGraph, expected: dict[str, np.ndarray]) -> None:
    """Every array of the ``*-expected.npz`` equals the graph's (masks as bool), and nothing else is there."""
    seen = set()
    for key, want in expected.items():
        kind, rest = key.split("/", 1)
        if kind == "num_nodes":
            assert graph.num_nodes[rest] == int(want), key
            seen.add(key)
            continue
        if kind in ("src", "dst"):
            got = graph.edges[tuple(rest.split(":"))][0 if kind == "src" else 1]
        elif kind == "ndata":
            ntype, name = rest.split("/")
            got = materialize(graph.ndata[ntype][name])
        else:
            etype, name = rest.split("/")
            got = materialize(graph.edata[tuple(etype.split(":"))][name])
        if key.endswith("_mask"):
            want = want.astype(bool)
        assert got.dtype == want.dtype, key
        np.testing.assert_array_equal(got, want, err_msg=key)
        seen.add(key)
    listed = (
        {f"num_nodes/{t}" for t in graph.num_nodes}
        | {f"{end}/{':'.join(e)}" for e in graph.edges for end in ("src", "dst")}
        | {f"ndata/{t}/{n}" for t, arrays in graph.ndata.items() for n in arrays}
        | {f"edata/{':'.join(e)}/{n}" for e, arrays in graph.edata.items() for n in arrays}
    )
    assert listed == seen


def _expected(name: str, root: Path = FIXTURES) -> dict[str, np.ndarray]:
    with np.load(root / f"{name}-expected.npz", allow_pickle=False) as npz:
        return {key: npz[key] for key in npz.files}


def _absolute_copy(name: str, tmp_path: Path) -> Path:
    """The fixture copied to ``tmp_path`` with DGL's absolute paths pointed at the copy."""
    target = tmp_path / name
    shutil.copytree(FIXTURES / name, target)
    meta_path = target / "metadata.json"
    meta = json.loads(meta_path.read_text())
    first = meta["edges"][meta["edge_type"][0]]["data"][0]
    assert os.path.isabs(first), "DGL writes absolute paths"
    prefix = first.split("/edge_index/")[0]
    meta_path.write_text(meta_path.read_text().replace(prefix, str(target)))
    return meta_path


@pytest.mark.parametrize("name", GRAPHS)
def test_reads_dgl_written_fixture_with_relative_paths(name):
    _needs_reader(name)
    graph = read_chunked(FIXTURES / name / "metadata-relative.json")
    assert graph.name == name
    _assert_matches_expected(graph, _expected(name))


@pytest.mark.parametrize("name", GRAPHS)
def test_reads_dgl_written_fixture_with_absolute_paths(name, tmp_path):
    _needs_reader(name)
    graph = read_chunked(_absolute_copy(name, tmp_path))
    _assert_matches_expected(graph, _expected(name))


def test_homogeneous_fixture_is_the_one_type_case():
    graph = read_chunked(FIXTURES / "homo" / "metadata-relative.json")
    assert graph.is_homogeneous
    graph.validate()


def test_hetero_fixture_keeps_dgl_type_order_and_chunks():
    graph = read_chunked(FIXTURES / "hetero" / "metadata-relative.json")
    meta = json.loads((FIXTURES / "hetero" / "metadata.json").read_text())
    assert graph.ntypes == meta["node_type"]
    assert [":".join(e) for e in graph.canonical_etypes] == meta["edge_type"]
    feat = graph.ndata["paper"]["feat"]
    assert isinstance(feat, ChunkedArray)
    assert [rows for rows, _ in feat.chunks] == meta["num_nodes_per_chunk"][meta["node_type"].index("paper")]


def test_node_data_is_loaded_lazily(tmp_path):
    meta_path = _absolute_copy("hetero", tmp_path)
    graph = read_chunked(meta_path)
    chunk = tmp_path / "hetero" / "node_data" / "paper" / "label-1.npy"
    np.save(chunk, np.full(np.load(chunk).shape, 99, dtype=np.int64))
    label = materialize(graph.ndata["paper"]["label"])
    first = graph.ndata["paper"]["label"].chunks[0][0]
    assert (label[first : first + graph.ndata["paper"]["label"].chunks[1][0]] == 99).all()


@pytest.mark.skipif(
    importlib.util.find_spec("dgl") is None or not os.environ.get("DGL_TOOLS_DIR"),
    reason="regenerating the fixtures needs dgl (pip install -e .[bench]) and DGL_TOOLS_DIR, the tools/ "
    "directory of DGL's repository at v1.1.3",
)
def test_regenerated_fixtures_match_committed(tmp_path):
    subprocess.run(
        [sys.executable, str(DATA / "make_dgl_chunked.py"), os.environ["DGL_TOOLS_DIR"], str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=240,
    )
    for name in GRAPHS:
        _needs_reader(name)
        expected = _expected(name)
        assert set(expected) == set(_expected(name, tmp_path))
        _assert_matches_expected(read_chunked(tmp_path / name / "metadata.json"), expected)
        _assert_matches_expected(read_chunked(tmp_path / name / "metadata-relative.json"), expected)


def test_writer_lays_files_out_as_dgl_does(tmp_path):
    """Our writer on DGL's fixture graph gives DGL's metadata (relative paths) and byte-identical edge files."""
    dgl_dir = FIXTURES / "hetero"
    graph = read_chunked(dgl_dir / "metadata-relative.json")
    meta_path = write_chunked(graph, tmp_path / "ours", num_chunks=3)
    assert json.loads(meta_path.read_text()) == json.loads((dgl_dir / "metadata-relative.json").read_text())
    for ours in sorted((tmp_path / "ours" / "edge_index").iterdir()):
        assert ours.read_bytes() == (dgl_dir / "edge_index" / ours.name).read_bytes(), ours.name
    ours_feat = np.load(tmp_path / "ours" / "node_data" / "paper" / "feat-2.npy")
    np.testing.assert_array_equal(ours_feat, np.load(dgl_dir / "node_data" / "paper" / "feat-2.npy"))


def _small_graph(num_papers: int = 10) -> HeteroGraph:
    rng = np.random.default_rng(3)
    counts = {"paper": num_papers, "author": 4, "field": 2}
    feat = rng.standard_normal((num_papers, 3)).astype(np.float32)
    # Half the features come in as a ChunkedArray, to stream a chunked source into differently sized chunks.
    cut = num_papers // 3
    chunked_feat = ChunkedArray(
        [(cut, lambda: feat[:cut]), (num_papers - cut, lambda: feat[cut:])], np.float32, (3,), "feat"
    )
    return HeteroGraph(
        name="small",
        num_nodes=counts,
        edges={
            ("author", "writes", "paper"): (rng.integers(0, 4, 15), rng.integers(0, num_papers, 15)),
            ("paper", "cites", "paper"): (rng.integers(0, num_papers, 30), rng.integers(0, num_papers, 30)),
            ("paper", "has_topic", "field"): (np.array([0, 10**12 % num_papers]), np.array([1, 0])),
        },
        ndata={
            "paper": {
                "feat": chunked_feat,
                "label": rng.integers(0, 3, num_papers),
                "train_mask": rng.random(num_papers) < 0.5,
            },
            "field": {"emb": rng.standard_normal((2, 2, 2)).astype(np.float16)},
        },
        edata={("paper", "cites", "paper"): {"w": rng.random(30)}},
        num_classes=3,
    )


def test_write_read_round_trip_with_empty_chunks(tmp_path):
    graph = _small_graph()
    meta_path = write_chunked(graph, tmp_path / "g", num_chunks=4)  # field: 2 nodes in 4 chunks, 2 empty
    back = read_chunked(meta_path)
    assert back.name == "small" and back.num_classes == 3
    assert back.num_nodes == graph.num_nodes
    assert back.canonical_etypes == graph.canonical_etypes
    for etype, (src, dst) in graph.edges.items():
        np.testing.assert_array_equal(back.edges[etype][0], src)
        np.testing.assert_array_equal(back.edges[etype][1], dst)
    for ntype, arrays in graph.ndata.items():
        assert set(back.ndata[ntype]) == set(arrays)
        for name, array in arrays.items():
            got, want = materialize(back.ndata[ntype][name]), materialize(array)
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(
        materialize(back.edata[("paper", "cites", "paper")]["w"]), graph.edata[("paper", "cites", "paper")]["w"]
    )


def test_write_refuses_existing_dir_and_replaces_with_overwrite(tmp_path):
    out = tmp_path / "g"
    write_chunked(_small_graph(), out, num_chunks=2)
    with pytest.raises(InputError, match="already exists"):
        write_chunked(_small_graph(), out, num_chunks=2)
    write_chunked(_small_graph(12), out, num_chunks=2, overwrite=True)
    assert read_chunked(out / "metadata.json").num_nodes["paper"] == 12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g"]


def test_write_failure_leaves_nothing_behind(tmp_path):
    graph = _small_graph()
    graph.ndata["paper"]["feat"] = ChunkedArray(
        [(10, lambda: np.zeros((9, 3), dtype=np.float32))], np.float32, (3,), "feat"
    )
    with pytest.raises(InputError, match="chunk 0"):
        write_chunked(graph, tmp_path / "g")
    assert list(tmp_path.iterdir()) == []


def test_chunk_sizes_follow_dgl():
    assert chunk_sizes(10, 4) == [3, 3, 2, 2]
    assert chunk_sizes(2, 4) == [1, 1, 0, 0]
    assert sum(chunk_sizes(1001, 7)) == 1001


def test_format_edge_lines_matches_plain_formatting():
    rng = np.random.default_rng(7)
    src = np.concatenate([[0, 9, 10, 99, 100], rng.integers(0, 2**62, 200), [2**63 - 1]])
    dst = rng.integers(0, 10**6, len(src))
    want = "".join(f"{s} {d}\n" for s, d in zip(src.tolist(), dst.tolist(), strict=True)).encode()
    assert format_edge_lines(src, dst) == want
    assert (
        format_edge_lines(src[:3], dst[:3], ",")
        == "".join(f"{s},{d}\n" for s, d in zip(src[:3], dst[:3], strict=True)).encode()
    )
    assert format_edge_lines(src[:0], dst[:0]) == b""


# Bad input: one InputError line that names the file and the problem.


def _good(tmp_path: Path) -> Path:
    return write_chunked(_small_graph(), tmp_path / "g", num_chunks=2)


def _edit_meta(meta_path: Path, edit) -> Path:
    meta = json.loads(meta_path.read_text())
    edit(meta)
    meta_path.write_text(json.dumps(meta))
    return meta_path


def _assert_error(meta_path: Path, *needles: str) -> str:
    with pytest.raises(InputError) as info:
        read_chunked(meta_path)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    return message


def _materialize_all(graph: HeteroGraph) -> None:
    for arrays in [*graph.ndata.values(), *graph.edata.values()]:
        for array in arrays.values():
            materialize(array)


def test_error_missing_metadata(tmp_path):
    _assert_error(tmp_path / "nope.json", "nope.json", "no such file")
    _assert_error(tmp_path, "is a directory")


def test_error_malformed_metadata(tmp_path):
    meta_path = _good(tmp_path)
    meta_path.write_text('{"graph_name": "g", ')
    _assert_error(meta_path, "metadata.json", "not valid JSON")
    meta_path.write_text("[1, 2]")
    _assert_error(meta_path, "expected a JSON object")
    meta_path.write_text('{"graph_name": "g"}')
    _assert_error(meta_path, "missing key", "node_type")


def test_error_malformed_entries(tmp_path):
    meta_path = _good(tmp_path)
    _edit_meta(meta_path, lambda m: m["num_nodes_per_chunk"].pop())
    _assert_error(meta_path, "metadata.json", "num_nodes_per_chunk")
    meta_path = _good(tmp_path / "b")
    _edit_meta(meta_path, lambda m: m["edges"]["paper:cites:paper"]["format"].update(name="xml"))
    _assert_error(meta_path, "format 'xml'", "csv, numpy, parquet")
    meta_path = _good(tmp_path / "c")
    _edit_meta(meta_path, lambda m: m["node_type"].append("paper"))
    _assert_error(meta_path, "'paper' twice")


def test_error_missing_chunk_file(tmp_path):
    meta_path = _good(tmp_path)
    (tmp_path / "g" / "edge_index" / "paper:cites:paper1.txt").unlink()
    _assert_error(meta_path, "paper:cites:paper1.txt", "no such file")
    meta_path = _good(tmp_path / "b")
    (tmp_path / "b" / "g" / "node_data" / "paper" / "label-0.npy").unlink()
    _assert_error(meta_path, "label-0.npy", "no such file")


def test_error_edge_chunk_row_count(tmp_path):
    meta_path = _good(tmp_path)
    _edit_meta(meta_path, lambda m: m["num_edges_per_chunk"][0].__setitem__(0, 7))
    _assert_error(meta_path, "author:writes:paper0.txt", "8 edges", "num_edges_per_chunk", "has 7")


def test_error_node_data_chunk_row_count(tmp_path):
    meta_path = _good(tmp_path)
    label = tmp_path / "g" / "node_data" / "paper" / "label-1.npy"
    np.save(label, np.load(label)[:-1])
    _assert_error(meta_path, "label-1.npy", "4 rows", "5 in chunk 1")


def test_error_edge_type_names_unknown_node_type(tmp_path):
    meta_path = _good(tmp_path)

    def rename(meta):
        meta["edge_type"][0] = "venue:writes:paper"
        meta["edges"]["venue:writes:paper"] = meta["edges"].pop("author:writes:paper")

    _edit_meta(meta_path, rename)
    _assert_error(meta_path, "metadata.json", "'venue'", "not in node_type")


def test_error_edge_id_out_of_range(tmp_path):
    meta_path = _good(tmp_path)
    chunk = tmp_path / "g" / "edge_index" / "author:writes:paper1.txt"
    lines = chunk.read_text().splitlines()
    lines[2] = "4 0"  # 4 authors: ids 0..3
    chunk.write_text("\n".join(lines) + "\n")
    _assert_error(meta_path, "author:writes:paper1.txt", "row 2", "source id 4", "'author'")


def test_error_mismatched_feature_lengths(tmp_path):
    meta_path = _good(tmp_path)
    feat = tmp_path / "g" / "node_data" / "paper" / "feat-1.npy"
    np.save(feat, np.zeros((5, 4), dtype=np.float32))
    _assert_error(meta_path, "feat-1.npy", "float32[4]", "same dtype and row shape")


def test_error_wrong_delimiter(tmp_path):
    meta_path = _good(tmp_path)
    _edit_meta(meta_path, lambda m: m["edges"]["paper:cites:paper"]["format"].update(delimiter=","))
    _assert_error(meta_path, "paper:cites:paper0.txt", "two integer columns separated by ','", "delimiter")
    meta_path = _good(tmp_path / "b")
    chunk = tmp_path / "b" / "g" / "edge_index" / "paper:cites:paper0.txt"
    chunk.write_text(chunk.read_text().replace(" ", ";"))
    _assert_error(meta_path, "paper:cites:paper0.txt", "separated by ' '")


def test_error_csv_with_one_column(tmp_path):
    meta_path = _good(tmp_path)
    chunk = tmp_path / "g" / "edge_index" / "paper:cites:paper0.txt"
    chunk.write_text("".join(line.split()[0] + "\n" for line in chunk.read_text().splitlines()))
    _assert_error(meta_path, "paper:cites:paper0.txt", "1 columns", "expected 2")


def test_error_mask_with_other_values(tmp_path):
    meta_path = _good(tmp_path)
    folder = tmp_path / "g" / "node_data" / "paper"
    np.save(folder / "train_mask-0.npy", np.array([0, 1, 1, 0, 1]))
    np.save(folder / "train_mask-1.npy", np.array([0, 1, 2, 0, 1]))
    graph = read_chunked(meta_path)
    with pytest.raises(InputError, match=r"train_mask-1.npy: mask value 2 at row 2"):
        _materialize_all(graph)


def test_error_not_an_npy(tmp_path):
    meta_path = _good(tmp_path)
    (tmp_path / "g" / "edge_data" / "paper:cites:paper" / "w-0.npy").write_bytes(b"not numpy")
    _assert_error(meta_path, "w-0.npy", "not a readable .npy")


def test_error_parquet_without_pyarrow(tmp_path, monkeypatch):
    meta_path = _good(tmp_path)
    label = tmp_path / "g" / "node_data" / "paper" / "label-0.parquet"
    label.write_bytes(b"PAR1")
    _edit_meta(
        meta_path,
        lambda m: m["node_data"]["paper"]["label"].update(
            format={"name": "parquet"}, data=["node_data/paper/label-0.parquet"]
        ),
    )
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    _assert_error(meta_path, "label-0.parquet", "needs pyarrow")


def test_parquet_shape_metadata_as_dgl_writes_it(tmp_path):
    """DGL's parquet writer stores ``str(shape)`` in the schema metadata; reading it needs no pyarrow."""
    from distgnn.data.chunked import _parquet_shape

    file = tmp_path / "feat-0.parquet"
    assert _parquet_shape(file, {b"shape": b"(5, 2, 3)"}) == (5, 2, 3)
    assert _parquet_shape(file, {b"shape": b"[7]"}) == (7,) and _parquet_shape(file, {b"shape": b"4"}) == (4,)
    assert _parquet_shape(file, None) is None and _parquet_shape(file, {b"pandas": b"{}"}) is None
    for bad in (b"(5, 'x')", b"five", b"\xff", b"(2.5,)", b"(-1, 2)", b"(True,)", b"None"):
        with pytest.raises(InputError, match=f"{file}: parquet 'shape' metadata .* is not a tuple of integers >= 0"):
            _parquet_shape(file, {b"shape": bad})


@pytest.mark.skipif(not HAVE_PYARROW, reason="pyarrow is not installed")
def test_parquet_without_shape_metadata(tmp_path):
    """Parquet from other tools: plain columns side by side, or one list column as rows of vectors."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta_path = _good(tmp_path)
    folder = tmp_path / "g"
    pq.write_table(pa.table({"a": [1, 2, 3, 4, 5], "b": [5, 6, 7, 8, 9]}), folder / "plain-0.parquet")
    pq.write_table(pa.table({"a": [6, 7, 8, 9, 10], "b": [0, 0, 0, 0, 1]}), folder / "plain-1.parquet")
    pq.write_table(pa.table({"v": [[float(i), -float(i)] for i in range(10)]}), folder / "vec.parquet")

    def edit(meta):
        meta["node_data"]["paper"]["plain"] = {
            "format": {"name": "parquet"},
            "data": ["plain-0.parquet", "plain-1.parquet"],
        }
        meta["node_data"]["paper"]["vec"] = {"format": {"name": "parquet"}, "data": ["vec.parquet"]}

    graph = read_chunked(_edit_meta(meta_path, edit))
    plain, vec = graph.ndata["paper"]["plain"], graph.ndata["paper"]["vec"]
    assert plain.shape == (10, 2) and plain.dtype == np.int64 and vec.shape == (10, 2)
    np.testing.assert_array_equal(materialize(plain)[:, 0], np.arange(1, 11))
    np.testing.assert_array_equal(materialize(vec), np.stack([np.arange(10.0), -np.arange(10.0)], axis=1))


def test_data_files_are_checked_before_edges_are_parsed(tmp_path):
    meta_path = _good(tmp_path)
    (tmp_path / "g" / "edge_index" / "paper:cites:paper1.txt").write_text("not, numbers\n")
    (tmp_path / "g" / "node_data" / "paper" / "label-1.npy").unlink()
    _assert_error(meta_path, "label-1.npy", "no such file")
