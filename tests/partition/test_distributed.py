"""The distributed partition job (``distgnn-partition --workers W``) against the single-process tool."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from subprocess import PIPE

import numpy as np
import pytest

from distgnn.data import synthetic, synthetic_mag
from distgnn.data.chunked import write_chunked
from distgnn.data.hetero import HeteroGraph
from distgnn.partition.assign import random_assignment, range_assignment
from distgnn.partition.check import check_partition
from distgnn.partition.cli import main as partition_main
from distgnn.partition.format import read_meta

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="ranks and their watchdog are tested on Linux")
CLI = [sys.executable, "-m", "distgnn.partition.cli"]


@pytest.fixture(scope="module")
def homo(tmp_path_factory) -> Path:
    graph = HeteroGraph.from_homogeneous(synthetic(300, 6.0, 4, 3, seed=1))
    ((etype, (src, _)),) = graph.edges.items()
    graph.edata[etype] = {"weight": np.random.default_rng(0).random((len(src), 2)).astype(np.float32)}
    return write_chunked(graph, tmp_path_factory.mktemp("homo") / "g", num_chunks=3)


@pytest.fixture(scope="module")
def hetero(tmp_path_factory) -> Path:
    return write_chunked(synthetic_mag(100, seed=2, feat_dim=4), tmp_path_factory.mktemp("mag") / "g", num_chunks=3)


def _run(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def _single(meta: Path, out: Path, *flags) -> Path:
    assert partition_main(["--input", str(meta), "--out", str(out), *map(str, flags)]) == 0
    return out


def _assert_identical(a: Path, b: Path) -> None:
    files = sorted(p.relative_to(a) for p in a.rglob("*.npy"))
    assert files == sorted(p.relative_to(b) for p in b.rglob("*.npy"))
    for rel in files:
        x, y = np.load(a / rel), np.load(b / rel)
        assert x.dtype == y.dtype and np.array_equal(x, y), rel
    (ja,), (jb,) = a.glob("*.json"), b.glob("*.json")
    assert json.loads(ja.read_text()) == json.loads(jb.read_text())


def _rounds(stdout: str) -> list[int]:
    return [int(m) for m in re.findall(r"^\s*\d+ \|[^|]+\|[^|]+\|\s*(\d+) \|", stdout, re.MULTILINE)]


def test_random_assignment_is_a_balanced_permutation_computable_per_id():
    part = random_assignment(1001, 4, seed=7)
    assert np.bincount(part).tolist() == [251, 250, 250, 250]
    assert np.array_equal(random_assignment(1001, 4, seed=7, ids=np.array([5, 999, 0])), part[[5, 999, 0]])
    assert not np.array_equal(random_assignment(1001, 4, seed=8), part)
    ranges = range_assignment([5, 3], 2)
    assert ranges.tolist() == [0, 0, 0, 1, 1, 0, 0, 1]


@pytest.mark.parametrize(
    "graph, method, workers, message_mb, renumber",
    [
        ("homo", "random", 1, 256, "auto"),
        ("homo", "range", 2, 0.0005, "lookup"),  # edge ends renumbered by lookups at their owners
        ("hetero", "random", 4, 256, "auto"),  # every rank holds the new-id table
    ],
)
def test_random_and_range_are_identical_to_the_single_process_tool(
    request, tmp_path, graph, method, workers, message_mb, renumber
):
    meta = request.getfixturevalue(graph)
    expected = _single(meta, tmp_path / "single", "--num-parts", 3, "--method", method, "--seed", 5)
    got = _run(
        "--input", meta, "--out", tmp_path / "dist", "--num-parts", 3, "--method", method, "--seed", 5,
        "--workers", workers, "--local", "--message-mb", message_mb, "--renumber", renumber,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    _assert_identical(expected, tmp_path / "dist")
    rounds = _rounds(got.stdout)
    assert len(rounds) == workers
    if message_mb < 0.01:  # a few hundred bytes per peer per round: many rounds, the same partition
        assert min(rounds) > 100


def test_metis_is_independent_of_the_rank_count_and_passes_check(hetero, tmp_path):
    outs = []
    for workers in (1, 3):
        out = tmp_path / f"w{workers}"
        got = _run(
            "--input", hetero, "--out", out, "--num-parts", 3, "--method", "metis", "--seed", 1,
            "--workers", workers, "--local", "--coarse-edges", 500,
        )  # fmt: skip
        assert got.returncode == 0, got.stderr
        assert "METIS on the coarse graph" in got.stdout and "level 2:" in got.stdout  # it coarsened twice
        outs.append(out)
    _assert_identical(*outs)
    meta, _ = check_partition(outs[0] / "synthetic-mag.json")
    sizes = np.diff(np.asarray(meta.node_map), axis=1).ravel()
    assert sizes.max() <= 1.05 * meta.num_nodes / 3 + 1
    assert meta.extra["metis_edge_cut"] > 0 and meta.part_method == "metis"


def test_dry_run_estimates_every_rank_from_the_metadata(homo, tmp_path):
    got = _run("--input", homo, "--out", tmp_path / "o", "--num-parts", 4, "--workers", 2, "--dry-run")
    assert got.returncode == 0, got.stderr
    rows = [line.split("|") for line in got.stdout.splitlines()[1:]]
    assert [int(r[0]) for r in rows] == [0, 1]
    edges = sum(int(r[1].replace(",", "")) for r in rows)
    meta = json.loads(homo.read_text())
    assert edges == sum(meta["num_edges_per_chunk"][0])
    assert all(0.2 < float(r[5]) < 1.0 for r in rows)  # GiB: the interpreter's base and a little more
    assert not (tmp_path / "o").exists()


def test_a_killed_rank_stops_every_rank_naming_it_and_leaves_no_partition(hetero, tmp_path):
    out = tmp_path / "out"
    args = [
        "--input", hetero, "--out", out, "--num-parts", 2, "--method", "random", "--workers", 2,
        "--message-mb", 0.00005, "--peer-timeout", 4,
    ]  # fmt: skip
    port = 29500 + os.getpid() % 1000
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(
            subprocess.Popen(
                [*CLI, *map(str, args)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    try:
        for line in procs[1].stdout:
            if "number nodes done" in line:
                break
        procs[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        _, err = procs[0].communicate(timeout=30)
        assert time.monotonic() - killed_at < 30
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    assert procs[0].returncode != 0
    assert "rank 1 died or hangs" in err
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.staging")]


def local_args(graph, out) -> list:
    """Two ``--local`` ranks in rounds of a few bytes: slow enough to be stopped mid-job."""
    return [
        "--input", graph, "--out", out, "--num-parts", 2, "--method", "random", "--workers", 2, "--local",
        "--message-mb", 0.00005,
    ]  # fmt: skip


def pids_at_numbering(job: subprocess.Popen) -> list[int]:
    """The ranks' pids the launcher printed, read from ``job``'s output up to the node numbering's end."""
    pids = []
    for line in job.stdout:
        if found := re.match(r"ranks 0-1: pids (\d+) (\d+)$", line.strip()):
            pids = [int(x) for x in found.groups()]
        if "number nodes done" in line:
            break
    assert pids, "the ranks' pids were not printed"
    return pids


def test_a_killed_rank_under_local_is_named_and_every_rank_stops(hetero, tmp_path):
    out = tmp_path / "out"
    job = subprocess.Popen([*CLI, *map(str, local_args(hetero, out))], stdout=PIPE, stderr=PIPE, text=True)
    try:
        pids = pids_at_numbering(job)
        pid = pids[1]
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        _, err = job.communicate(timeout=30)
        assert time.monotonic() - killed_at < 30
    finally:
        if job.poll() is None:
            job.kill()
        job.wait()
    assert job.returncode != 0
    assert "rank 1 failed; every rank stopped, no partition was written" in err
    assert not _running(pids[0])
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.staging")]


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (an exited one waiting to be reaped is a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_local_launcher_stops_its_ranks_and_leaves_no_partition(hetero, tmp_path, sig):
    out = tmp_path / "out"
    job = subprocess.Popen([*CLI, *map(str, local_args(hetero, out))], stdout=PIPE, stderr=PIPE, text=True)
    try:
        pids = pids_at_numbering(job)
        job.send_signal(sig)
        _, err = job.communicate(timeout=30)
        deadline = time.monotonic() + 30  # SIGKILL: the ranks see their launcher die and stop on their own
        while any(map(_running, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if job.poll() is None:
            job.kill()
        job.wait()
    assert not [pid for pid in pids if _running(pid)]
    if sig == signal.SIGTERM:
        assert job.returncode == 128 + signal.SIGTERM
        assert "error: interrupted; no partition was written" in err
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.staging")]


def test_bad_input_is_one_line(homo, tmp_path):
    src = homo.parent
    broken = tmp_path / "g"
    subprocess.run(["cp", "-r", str(src), str(broken)], check=True)
    (broken / "edge_index" / "_N:_E:_N1.txt").unlink()
    got = _run(
        "--input", broken / "metadata.json", "--out", tmp_path / "o", "--num-parts", 2, "--workers", 2, "--local"
    )
    assert got.returncode == 2
    assert got.stderr.strip().count("\n") == 0 and "_N:_E:_N1.txt: no such file" in got.stderr
    subprocess.run(["cp", "-r", str(src / "edge_index"), str(broken)], check=True)
    np.save(broken / "node_data" / "_N" / "feat-1.npy", np.zeros((100, 5), dtype=np.float32))
    got = _run(
        "--input", broken / "metadata.json", "--out", tmp_path / "o", "--num-parts", 2, "--workers", 2, "--local"
    )
    assert got.returncode == 2 and got.stderr.strip().count("\n") == 0
    assert "feat-1.npy: rows of float32[5]" in got.stderr
    assert not (tmp_path / "o").exists()


def test_the_job_runs_under_distgnn_launch(homo, tmp_path):
    expected = _single(homo, tmp_path / "single", "--num-parts", 2, "--method", "random")
    (tmp_path / "ip.txt").write_text("127.0.0.1 30050\n")
    launch = Path(sys.executable).parent / "distgnn-launch"
    got = subprocess.run(
        [
            str(launch), "--ip-config", "ip.txt", "--local", "--num-servers", "0", "--num-trainers", "2",
            "--", sys.executable, "-m", "distgnn.partition.cli", "--input", str(homo), "--out", "dist",
            "--num-parts", "2", "--method", "random", "--workers", "2",
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    _assert_identical(expected, tmp_path / "dist")
    assert read_meta(tmp_path / "dist" / "synthetic.json").part_method == "random"


def test_a_job_larger_than_the_machine_refuses_to_start(tmp_path):
    (tmp_path / "e0.txt").write_text("")
    meta = {
        "graph_name": "huge",
        "node_type": ["_N"],
        "num_nodes_per_chunk": [[10**10]],
        "edge_type": ["_N:_E:_N"],
        "num_edges_per_chunk": [[10**11]],
        "edges": {"_N:_E:_N": {"format": {"name": "csv", "delimiter": " "}, "data": ["e0.txt"]}},
    }
    (tmp_path / "metadata.json").write_text(json.dumps(meta))
    got = _run(
        "--input", tmp_path / "metadata.json", "--out", tmp_path / "o", "--num-parts", 2, "--workers", 2, "--local"
    )
    assert got.returncode == 2 and got.stderr.strip().count("\n") == 0
    assert re.search(
        r"--local with 2 ranks needs about [\d.]+ GiB but this machine has [\d.]+ GiB available", got.stderr
    )
    assert not (tmp_path / "o").exists()


def test_a_level_holds_its_adjacency_compactly_and_splits_into_blocks():
    from distgnn.partition.multilevel import _level_from_keys

    rng = np.random.default_rng(0)
    n, bounds = 50, np.array([0, 20, 50], dtype=np.int64)
    u = rng.integers(0, 30, 400)  # rank 1's 30 owned vertices (local ids)
    v = rng.integers(0, n, 400)
    keys = np.unique(u * n + v)
    level = _level_from_keys(n, bounds, 1, np.ones(30, dtype=np.int64), keys.copy(), None)
    assert level.index.dtype == np.int32 and level.entries == keys.size
    au, index, aw = level.block(0, 30)
    assert np.array_equal(au * n + level.nbr[index], keys) and (aw == 1).all()
    assert np.array_equal(level.nbr, np.unique(keys % n))
    blocks = level.blocks(size=37)
    assert blocks[0][0] == 0 and blocks[-1][1] == 30
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:], strict=False))
    degree = np.diff(level.indptr)
    for first, last in blocks:  # under twice the block size, plus one vertex's entries
        assert degree[first:last].sum() < 2 * 37 + degree[first:last].max()


def test_the_best_move_by_table_equals_the_one_by_sorting_and_the_lexsort_order():

    from distgnn.partition.multilevel import Multilevel, _first_best, _level_from_keys, _unit

    rng = np.random.default_rng(3)
    n, P = 400, 5
    keys = np.unique(rng.integers(0, n, 6000) * n + rng.integers(0, n, 6000))
    weights = rng.integers(1, 4, keys.size)
    level = _level_from_keys(n, np.array([0, n]), 0, np.ones(n, dtype=np.int64), keys, weights)
    ml = Multilevel.__new__(Multilevel)
    ml.P, ml.seed = P, 7
    part = rng.integers(0, P, n)
    targets = part[level.nbr]
    active, room = rng.random(n) < 0.6, np.array([True, False, True, True, True])
    every = ml._best(level, targets, part, 11, lambda gu, gt, nbr: active[gu] & room[gt])
    sparse = ml._best(level, targets, part, 11, lambda gu, gt, nbr: active[gu] & room[gt], active)
    dense = ml._best_part(level, targets, part, 11, lambda v: active[v][:, None] & room[None, :], active)
    assert all(np.array_equal(a, b) for a, b in zip(sparse, dense, strict=True)) and sparse[0].size > 50
    # skipping the vertices that may not move changes no move, nor a mover's current connection
    assert all(np.array_equal(a, b) for a, b in zip(every[:3], sparse[:3], strict=True))
    assert np.array_equal(every[3][active], sparse[3][active]) and not sparse[3][~active].any()
    # the first row per vertex in (vertex, -connection, tie hash) order, as a lexsort gives it
    gu = np.sort(rng.integers(0, 60, 500))
    conn, gt = rng.integers(1, 4, 500), rng.integers(0, 3, 500)
    tie = _unit(gt, 1, 2)
    order = np.lexsort((tie, -conn, gu))
    first = order[np.concatenate([[True], gu[order][1:] != gu[order][:-1]])]
    assert np.array_equal(_first_best(gu, conn, tie), first)


def test_the_metis_estimate_counts_its_phase_and_the_coarsest_graph_on_rank_0(homo):
    from distgnn.data.chunked import read_chunked_layout
    from distgnn.partition.memory import PER_COARSE_ENTRY, estimate_ranks

    layout = read_chunked_layout(homo)
    edges = sum(layout.num_edges(e) for e in layout.etypes)
    random = estimate_ranks(layout, 2, 4, "random")
    small = estimate_ranks(layout, 2, 4, "metis", coarse_edges=100)
    whole = estimate_ranks(layout, 2, 4, "metis", coarse_edges=10**9)  # METIS on the whole graph: 2E entries
    assert whole[0].peak_bytes - small[0].peak_bytes == PER_COARSE_ENTRY * (2 * edges - 100)
    assert whole[1].peak_bytes == small[1].peak_bytes > random[1].peak_bytes


@pytest.mark.parametrize("bound", [1, 3, 4, 5, 256, 300, 40_000])  # scans; 8-bit, 16-bit radix sorts
def test_rows_are_ordered_by_destination_stably_whatever_the_key_count(bound):
    from types import SimpleNamespace

    from distgnn.partition.collective import RankGroup

    keys = np.random.default_rng(bound).integers(0, bound, 5000)
    order = RankGroup.order_by_rank(SimpleNamespace(world=2), keys)
    assert np.array_equal(order, np.argsort(keys, kind="stable"))


@pytest.mark.parametrize(
    ("edges", "chunk", "id_bytes", "etypes"),
    [(240_000_000, 7_500_000, 4, 1), (30_000_000, 7_500_000, 4, 1), (7_500_000, 7_500_000, 8, 1), (10**6, 10**5, 8, 3)],
)
def test_edge_chunks_read_at_once_stay_within_the_estimates_read_term(edges, chunk, id_bytes, etypes):
    """The chunks in flight and the arrays they are read into fit what the estimate counts for the edges read;
    one chunk more would not (unless one is all there is)."""
    from distgnn.partition import distributed

    k = distributed.edge_chunks_at_once(edges, chunk, id_bytes, etypes)
    extra = 1 if etypes > 1 else 0
    counted = ((distributed.READ_IDS + extra) * id_bytes + 8 * distributed.READ_INT64) * edges

    def held(chunks_in_flight: int) -> int:
        return (2 + extra) * id_bytes * edges + chunks_in_flight * distributed.READ_CHUNK_PER_EDGE * chunk

    assert k >= 1
    assert k == 1 or held(k) <= counted
    assert held(k + 1) > counted
    assert distributed.edge_chunks_at_once(0, 0, 4, 1) == 1


def test_edge_chunks_are_read_in_contiguous_runs_of_about_equal_edges():
    from types import SimpleNamespace

    from distgnn.partition.distributed import edge_chunk_readers

    a, b = ("n", "a", "n"), ("n", "b", "n")
    layout = SimpleNamespace(etypes=[a, b], edge_chunks={a: [10, 10, 10, 10], b: [5, 30, 5]})
    readers = edge_chunk_readers(layout, 3)
    flat = np.concatenate([readers[a], readers[b]])
    assert np.all(np.diff(flat) >= 0) and flat[0] == 0 and flat[-1] == 2  # runs in (type, chunk) order
    edges = np.bincount(flat, weights=[10, 10, 10, 10, 5, 30, 5], minlength=3)
    assert edges.max() - edges.min() <= 30  # within one chunk of E / W each
    assert edge_chunk_readers(layout, 1)[b].tolist() == [0, 0, 0]


def test_distinct_values_by_marking_a_table_equal_those_by_sorting():
    from distgnn.partition.reshuffle import distinct_with_index

    values = np.random.default_rng(0).integers(0, 1000, 5000)
    by_sort = distinct_with_index(values)
    by_mark = distinct_with_index(values.astype(np.int32), bound=1000)
    assert np.array_equal(by_sort[0], by_mark[0]) and np.array_equal(by_sort[1], by_mark[1])
    assert np.array_equal(by_mark[0][by_mark[1]], values)


@pytest.mark.parametrize("max_runs", [4096, 0])  # plain writes of each run; a mapping
def test_feature_rows_are_written_at_their_positions(tmp_path, monkeypatch, max_runs):
    from distgnn.partition import distributed

    monkeypatch.setattr(distributed, "MAX_WRITE_RUNS", max_runs)
    path = tmp_path / "feat.npy"
    np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(100, 3)).flush()
    positions = np.r_[10:20, 50:60, 5]
    rows = np.random.default_rng(1).random((21, 3), dtype=np.float32)
    distributed._write_at(path, 100, positions, rows)
    got = np.load(path)
    assert np.array_equal(got[positions], rows)
    assert not np.delete(got, positions, axis=0).any()


@pytest.mark.parametrize("num_bounds", [0, 1, 7, 16, 17, 40])  # comparisons up to FEW_BOUNDS, then a search
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_a_values_bucket_by_comparisons_equals_the_binary_search(num_bounds, dtype):
    from distgnn.partition.distributed import bucket_of

    rng = np.random.default_rng(num_bounds)
    bounds = np.sort(rng.integers(0, 1000, num_bounds))  # above uint8's range: compared as int64
    values = rng.integers(0, 1100 if dtype != np.uint8 else 256, 3000).astype(dtype)
    got = bucket_of(bounds, values)
    assert got.dtype == np.int64
    assert np.array_equal(got, np.searchsorted(bounds, values, side="right"))


@pytest.mark.parametrize("graph", ["homo", "hetero"])
def test_a_rank_on_several_threads_writes_the_single_process_tools_partition(request, tmp_path, monkeypatch, graph):
    from distgnn.launch.transport import free_port
    from distgnn.partition.collective import RankGroup
    from distgnn.partition.distributed import DistOptions, partition_distributed

    meta = request.getfixturevalue(graph)
    expected = _single(meta, tmp_path / "single", "--num-parts", 3, "--method", "random", "--seed", 5)
    monkeypatch.setattr("distgnn.partition.threads.MIN_PIECE", 7)  # every array step split over the threads
    for name, value in (("RANK", 0), ("WORLD_SIZE", 1), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", free_port())):
        monkeypatch.setenv(name, str(value))
    group = RankGroup(dead_after_s=30)
    try:
        opts = DistOptions(input=meta, num_parts=3, out=tmp_path / "dist", method="random", seed=5, threads=3)
        partition_distributed(opts, group)
    finally:
        group.close()
    _assert_identical(expected, tmp_path / "dist")


def test_a_group_of_one_exchanges_with_itself_without_sending(monkeypatch):
    from distgnn.launch.transport import free_port
    from distgnn.partition.collective import RankGroup

    for name, value in (("RANK", 0), ("WORLD_SIZE", 1), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", free_port())):
        monkeypatch.setenv(name, str(value))
    group = RankGroup(dead_after_s=30)
    try:
        rows = np.arange(12, dtype=np.int32).reshape(6, 2)[::2]  # not contiguous
        got, counts = group.alltoallv(rows, np.array([3]), 1 << 20)
        assert np.array_equal(got, rows) and got.flags.c_contiguous and counts.tolist() == [3]
        got[0, 0] = -1
        assert rows[0, 0] == 0  # the received rows are the rank's own copy
        with pytest.raises(ValueError, match="do not add up"):
            group.alltoallv(rows, np.array([2]), 1 << 20)
        ids = np.array([5, 1, 3])
        assert group.lookup(ids, np.zeros(3, dtype=np.int64), lambda a: a * 10, 1 << 20).tolist() == [50, 10, 30]
        assert group.rounds == 0 and group.bytes_sent == 0
    finally:
        group.close()
