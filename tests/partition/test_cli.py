"""distgnn-partition CLI: happy paths, --check, and every bad input as one error line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from distgnn.partition.cli import main
from distgnn.partition.format import read_meta

PLANETOID_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "planetoid"


def _npz(path: Path, **arrays) -> Path:
    np.savez(path, **{k: np.asarray(v) for k, v in arrays.items()})
    return path


def _good_npz(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    n, e = 60, 400
    return _npz(
        tmp_path / "g.npz",
        src=rng.integers(0, n, e),
        dst=rng.integers(0, n, e),
        num_nodes=n,
        ndata_feat=rng.standard_normal((n, 5)).astype(np.float32),
        ndata_train_mask=rng.random(n) < 0.5,
        edata_w=rng.random(e),
    )


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _assert_one_line_error(code: int, err: str, needle: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert needle in lines[0]
    assert "Traceback" not in err


def test_npz_partition_then_check(tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, err = _run(
        ["--input", _good_npz(tmp_path), "--graph-name", "g", "--num-parts", 3, "--out", out, "--undirected"], capsys
    )
    assert code == 0, err
    for phase in ("load done", "metis partition into 3 done", "reshuffle done", "write done"):
        assert phase in stdout
    assert "passes every check" in stdout and "cut edges" in stdout
    meta = read_meta(out / "g.json")
    assert meta.num_parts == 3 and meta.num_edges == 800 and set(meta.edge_feats) == {"w"}

    code, stdout, _ = _run(["--check", out / "g.json"], capsys)
    assert code == 0
    table = stdout.splitlines()
    assert table[-2].split()[0] == "total" and len(table) == 1 + 2 + 3 + 1 + 1  # title, header, rule, parts, total, ok


def test_synthetic_random_balance_flags(tmp_path, capsys):
    out = tmp_path / "syn"
    args = ["--dataset", "synthetic", "--num-nodes", 500, "--avg-degree", 6, "--feat-dim", 4, "--num-classes", 3]
    code, stdout, err = _run([*args, "--num-parts", 2, "--method", "random", "--out", out, "--seed", 3], capsys)
    assert code == 0, err
    assert read_meta(out / "synthetic.json").part_method == "random"
    code, _, err = _run(
        [*args, "--num-parts", 2, "--balance-train", "--balance-edges", "--out", out, "--overwrite"], capsys
    )
    assert code == 0, err
    assert read_meta(out / "synthetic.json").part_method == "metis"


def test_cora_dataset(tmp_path, capsys):
    if not (PLANETOID_DIR / "ind.cora.graph").exists():
        pytest.skip(f"Cora raw files not found in {PLANETOID_DIR.resolve()}")
    code, stdout, err = _run(
        ["--dataset", "cora", "--data-dir", PLANETOID_DIR, "--num-parts", 2, "--out", tmp_path / "c", "--halo-hops", 2],
        capsys,
    )
    assert code == 0, err
    meta = read_meta(tmp_path / "c" / "cora.json")
    assert (meta.num_nodes, meta.num_edges, meta.halo_hops) == (2708, 10556, 2)


def test_module_entry_point_runs(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "distgnn.partition.cli",
            "--input",
            tmp_path / "missing.npz",
            "--num-parts",
            "2",
            "--out",
            tmp_path / "o",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "does not exist" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("make_input", "extra", "needle"),
    [
        (lambda d: d / "missing.npz", [], "does not exist"),
        (lambda d: d, [], "is a directory"),
        (lambda d: (d / "x.npz").write_text("not a zip") and d / "x.npz", [], "not an .npz"),
        (lambda d: _npz(d / "x.npz", dst=[0, 1]), [], "no src"),
        (lambda d: _npz(d / "x.npz", src=[0, 1]), [], "no dst"),
        (lambda d: _npz(d / "x.npz", src=[0, 9], dst=[1, 2], num_nodes=5), [], "src ids must be in [0, 5)"),
        (lambda d: _npz(d / "x.npz", src=[0, 1], dst=[-1, 2], num_nodes=5), [], "dst ids must be in [0, 5)"),
        (
            lambda d: _npz(d / "x.npz", src=[0, 1], dst=[1, 2], num_nodes=5, ndata_feat=np.zeros((4, 2))),
            [],
            "node array 'feat' has 4 rows, expected 5",
        ),
        (
            lambda d: _npz(d / "x.npz", src=[0, 1], dst=[1, 2], num_nodes=5, edata_w=np.zeros(3)),
            [],
            "edge array 'w' has 3 rows, expected 2",
        ),
        (lambda d: _good_npz(d), ["--num-parts", "0"], "--num-parts must be >= 1"),
        (lambda d: _good_npz(d), ["--num-parts", "61"], "num_parts must be between 1 and the node count 60"),
        (lambda d: _good_npz(d), ["--method", "spectral"], "invalid choice: 'spectral'"),
        (lambda d: _good_npz(d), ["--halo-hops", "0"], "--halo-hops must be >= 1"),
        (lambda d: _good_npz(d), ["--num-parts", "two"], "invalid int value"),
    ],
)
def test_bad_inputs_give_one_error_line(tmp_path, capsys, make_input, extra, needle):
    path = make_input(tmp_path)
    args = ["--input", path, "--num-parts", 2, "--out", tmp_path / "out", *extra]
    # argparse keeps the last --num-parts
    _assert_one_line_error(*_run(args, capsys)[::2], needle)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_input(tmp_path, capsys):
    path = _good_npz(tmp_path)
    path.chmod(0)
    code, _, err = _run(["--input", path, "--num-parts", 2, "--out", tmp_path / "out"], capsys)
    _assert_one_line_error(code, err, "not readable")


def test_output_directory_of_another_graph_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, _, err = _run(["--input", _good_npz(tmp_path), "--num-parts", 2, "--out", out], capsys)
    _assert_one_line_error(code, err, "does not hold a partition of 'g'")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]

    other = tmp_path / "other"
    assert _run(["--input", _good_npz(tmp_path), "--num-parts", 2, "--out", other, "--graph-name", "a"], capsys)[0] == 0
    code, _, err = _run(
        ["--input", _good_npz(tmp_path), "--num-parts", 2, "--out", other, "--graph-name", "b", "--overwrite"], capsys
    )
    _assert_one_line_error(code, err, "does not hold a partition of 'b'")
    code, _, err = _run(["--input", _good_npz(tmp_path), "--num-parts", 2, "--out", other, "--graph-name", "a"], capsys)
    _assert_one_line_error(code, err, "pass --overwrite")
    assert read_meta(other / "a.json").num_parts == 2


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "one of the arguments --input --dataset --check is required"),
        (["--dataset", "cora", "--data-dir", "nowhere", "--num-parts", "2", "--out", "o"], "ind.cora.x"),
        (["--dataset", "synthetic", "--out", "o"], "needs --num-parts"),
        (["--check", "nowhere/g.json"], "does not exist"),
        (["--dataset", "imagenet"], "invalid choice"),
    ],
)
def test_usage_errors(tmp_path, capsys, argv, needle, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _assert_one_line_error(*_run(argv, capsys)[::2], needle)


def test_check_reports_a_broken_partition(tmp_path, capsys):
    out = tmp_path / "out"
    assert _run(["--input", _good_npz(tmp_path), "--num-parts", 2, "--out", out], capsys)[0] == 0
    (out / "part1" / "indices.npy").unlink()
    code, _, err = _run(["--check", out / "g.json"], capsys)
    _assert_one_line_error(code, err, "indices.npy is missing")


CHUNKED = Path(__file__).resolve().parents[1] / "data" / "dgl_chunked"


def test_dgl_chunked_input_partition_then_check(tmp_path, capsys):
    """A graph DGL's chunk_graph.py wrote goes through the CLI; features land by their original ids."""
    from distgnn.partition.format import load_node_feature, load_orig_ids

    out = tmp_path / "out"
    code, stdout, err = _run(
        ["--input", CHUNKED / "hetero" / "metadata-relative.json", "--num-parts", 2, "--out", out, "--balance-train"],
        capsys,
    )
    assert code == 0, err
    assert "3 types" in stdout and "4 types" in stdout and "passes every check" in stdout
    meta = read_meta(out / "hetero.json")  # the name comes from graph_name in the metadata
    assert meta.ntypes == ["author", "field", "paper"] and meta.num_parts == 2
    expected = np.load(CHUNKED / "hetero-expected.npz")
    assert meta.num_edges == sum(len(expected[k]) for k in expected.files if k.startswith("src/"))
    book = meta.partition_book()
    orig_nid, _ = load_orig_ids(meta)
    homo = book.map_to_homo_nid(np.arange(11), "paper")
    rows = np.concatenate([np.asarray(load_node_feature(meta, i, "paper/feat")) for i in range(2)])
    first_paper = int(expected["num_nodes/author"] + expected["num_nodes/field"])
    np.testing.assert_array_equal(rows, expected["ndata/paper/feat"][np.asarray(orig_nid)[homo] - first_paper])
    val = np.concatenate([np.asarray(load_node_feature(meta, i, "paper/val_mask")) for i in range(2)])
    assert val.dtype == bool

    code, stdout, _ = _run(["--check", out / "hetero.json"], capsys)
    assert code == 0 and "passes every check" in stdout


def test_dgl_chunked_homogeneous_input(tmp_path, capsys):
    code, _, err = _run(
        ["--input", CHUNKED / "homo" / "metadata-relative.json", "--num-parts", 2, "--out", tmp_path / "o"], capsys
    )
    assert code == 0, err
    meta = read_meta(tmp_path / "o" / "homo.json")
    assert meta.ntypes == ["_N"] and meta.num_nodes == 9 and meta.num_edges == 21


def test_synthetic_mag_dataset(tmp_path, capsys):
    out = tmp_path / "mag"
    args = ["--dataset", "synthetic-mag", "--num-papers", 400, "--feat-dim", 4, "--num-classes", 3]
    code, _, err = _run([*args, "--num-parts", 2, "--balance-train", "--target-ntype", "paper", "--out", out], capsys)
    assert code == 0, err
    meta = read_meta(out / "synthetic-mag.json")
    assert meta.ntypes == ["paper", "author", "institution", "field_of_study"] and len(meta.etypes) == 7
    assert meta.node_feats["paper/feat"].shape == (400, 4)
    assert meta.extra["num_classes"] == 3


def test_chunked_input_written_by_write_chunked(tmp_path, capsys):
    from distgnn.data import synthetic_mag
    from distgnn.data.chunked import write_chunked

    graph = synthetic_mag(300, seed=1, feat_dim=4)
    metadata = write_chunked(graph, tmp_path / "chunked", num_chunks=3)
    code, _, err = _run(["--input", metadata, "--graph-name", "mag", "--num-parts", 3, "--out", tmp_path / "o"], capsys)
    assert code == 0, err
    meta = read_meta(tmp_path / "o" / "mag.json")
    assert (meta.num_nodes, meta.num_edges) == (graph.total_nodes, graph.num_edges())


def _broken_chunked(tmp_path: Path) -> Path:
    target = tmp_path / "in"
    shutil.copytree(CHUNKED / "hetero", target)
    return target / "metadata-relative.json"


def test_bad_chunked_input_is_one_error_line_and_leaves_nothing(tmp_path, capsys):
    metadata = _broken_chunked(tmp_path)
    label = metadata.parent / "node_data" / "paper" / "label-1.npy"
    np.save(label, np.load(label)[:-1])
    code, _, err = _run(["--input", metadata, "--num-parts", 2, "--out", tmp_path / "o"], capsys)
    _assert_one_line_error(code, err, "label-1.npy")
    assert not (tmp_path / "o").exists()


def test_chunk_that_fails_while_partitioning_leaves_nothing(tmp_path, capsys):
    """A mask chunk with a 2 passes the header checks and fails as it is streamed into the partition."""
    metadata = _broken_chunked(tmp_path)
    np.save(metadata.parent / "node_data" / "paper" / "val_mask-2.npy", np.array([0, 2, 1]))
    code, _, err = _run(["--input", metadata, "--num-parts", 2, "--out", tmp_path / "o"], capsys)
    _assert_one_line_error(code, err, "val_mask-2.npy: mask value 2")
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--undirected"], "--undirected applies to an .npz --input only"),
        (["--balance-train", "--target-ntype", "venue"], "'venue'"),
    ],
)
def test_chunked_usage_errors(tmp_path, capsys, argv, needle):
    metadata = CHUNKED / "hetero" / "metadata-relative.json"
    code, _, err = _run(["--input", metadata, "--num-parts", 2, "--out", tmp_path / "o", *argv], capsys)
    _assert_one_line_error(code, err, needle)


def test_the_distributed_job_runs_its_numerics_single_threaded_unless_told_otherwise():
    code = (
        "import os, sys; from distgnn.partition import cli; cli._single_threaded_numerics(); "
        "print([os.environ.get(n) for n in cli.SINGLE_THREAD_ENV], 'numpy' in sys.modules)"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    }
    fresh = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert fresh.stdout.split() == ["['1',", "'1',", "'1']", "False"], fresh.stderr
    told = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "OPENBLAS_NUM_THREADS": "4"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert told.stdout.split()[1] == "'4',", told.stderr
    # a process that loaded numpy already (a caller's) keeps its environment
    loaded = subprocess.run(
        [sys.executable, "-c", "import numpy; " + code], env=env, capture_output=True, text=True, timeout=60
    )
    assert loaded.stdout.split()[:3] == ["[None,", "None,", "None]"], loaded.stderr
