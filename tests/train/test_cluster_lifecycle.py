"""LocalCluster and server lifecycle: dead servers give clear errors in time, nothing is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from serving_graphs import child_processes, job_files, small_graph

from distgnn.errors import DistGNNError, RpcTimeoutError
from distgnn.rpc import RpcClient
from distgnn.store import shm
from distgnn.train.cluster import LocalCluster, sweep_orphans


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return small_graph(tmp_path_factory.mktemp("life") / "out", num_parts=2, num_nodes=100, num_edges=400)


@pytest.fixture(autouse=True)
def no_leftovers():
    before = set(os.listdir(shm.SHM_DIR))
    yield
    leaked = {n for n in set(os.listdir(shm.SHM_DIR)) - before if n.startswith("distgnn-life")}
    assert not leaked
    assert child_processes() == []


def test_a_killed_server_raises_a_timeout_naming_it_within_the_deadline(graph):
    with LocalCluster(graph.json_path, servers_per_machine=2, rpc_timeout_s=1.0, job_id="life-kill") as cluster:
        victim = cluster.process(1, 0)
        victim.send_signal(signal.SIGKILL)
        victim.wait(60)
        host, port = cluster.config(0).server_address(1, 0)
        with RpcClient(cluster.config(0)) as client:
            start = time.monotonic()
            with pytest.raises(RpcTimeoutError) as info:
                client.call(1, "pull", {"policy": "node", "name": "feat"}, [np.array([60], np.int64)])
            assert time.monotonic() - start < 2.5
            message = str(info.value)
            assert f"{host}:{port}" in message and "machine 1" in message and "'pull'" in message
            # The backup of machine 1 still maps the partition and answers reads (a live server's reply may take
            # longer than the 1 s deadline above on a loaded machine).
            pull = ("pull", {"policy": "node", "name": "feat"}, [np.array([60], np.int64)])
            reply = client.call(1, *pull, server_id=1, timeout_s=60)
            np.testing.assert_array_equal(reply.arrays[0], graph.ndata["feat"][[60]])
    assert job_files("life-kill") == []


def test_stale_segments_of_the_same_job_are_removed_on_start(graph):
    stale = shm.segment_path("life-stale", 0, "node.leftover")
    stale.write_bytes(b"crash")
    with LocalCluster(graph.json_path, job_id="life-stale") as cluster:
        assert not stale.exists()
        assert "distgnn-life-stale-p0-graph.indptr" in job_files(cluster.job_id)
    assert job_files("life-stale") == []


def test_sigterm_makes_a_main_server_remove_its_segments(graph):
    with LocalCluster(graph.json_path, job_id="life-term") as cluster:
        proc = cluster.process(0, 0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        assert not [n for n in job_files("life-term") if n.startswith("distgnn-life-term-p0-")]
        assert [n for n in job_files("life-term") if n.startswith("distgnn-life-term-p1-")]
    assert job_files("life-term") == []


def test_a_server_that_cannot_start_is_reported_with_its_log(graph, tmp_path):
    broken = small_graph(tmp_path / "broken", num_parts=2, num_nodes=60, num_edges=100)
    (broken.json_path.parent / "part1" / "indices.npy").unlink()
    with pytest.raises(DistGNNError, match=r"(?s)machine 1.*exited.*indices.npy is missing"):
        LocalCluster(broken.json_path, job_id="life-broken").start()
    assert job_files("life-broken") == []


def test_an_error_inside_the_block_still_stops_everything(graph):
    with pytest.raises(KeyError), LocalCluster(graph.json_path, servers_per_machine=2, job_id="life-err"):
        raise KeyError("a failing test body")
    assert job_files("life-err") == []


def test_servers_die_with_the_process_that_started_them(graph):
    code = textwrap.dedent(
        f"""
        import os, signal, sys
        from distgnn.train.cluster import LocalCluster, sweep_orphans
        c = LocalCluster({str(graph.json_path)!r}, servers_per_machine=2, job_id="life-orphan").start()
        print(c.workdir, " ".join(str(p.pid) for p in c.processes.values()), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    workdir, *pids = out.stdout.split()
    pids = [int(p) for p in pids]
    assert len(pids) == 4, out.stderr
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (job_files("life-orphan") or any(_alive(p) for p in pids)):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)
    assert job_files("life-orphan") == []
    # The killed owner had no chance to remove its work directory (ip_config, logs): the next sweep does.
    assert os.path.isdir(workdir)
    assert "life-orphan" not in sweep_orphans(os.path.dirname(workdir))  # too recent: could be live elsewhere
    assert "life-orphan" in sweep_orphans(os.path.dirname(workdir), min_idle_s=0)
    assert not os.path.exists(workdir)


def test_sweep_leaves_live_owners_and_foreign_directories_alone(graph, tmp_path):
    live = tmp_path / "distgnn-cluster-live"
    live.mkdir()
    (live / "owner.pid").write_text(str(os.getpid()))
    (live / "job_id").write_text("life-live")
    foreign = tmp_path / "distgnn-cluster-foreign"  # no owner.pid: not written by a LocalCluster
    foreign.mkdir()
    dead = tmp_path / "distgnn-cluster-dead"
    dead.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (dead / "owner.pid").write_text(str(gone.pid))
    (dead / "job_id").write_text("life-dead")
    segment = shm.create_array("life-dead", 0, "x", np.int64, (4,), lambda a: a.fill(1))
    del segment
    assert sweep_orphans(tmp_path, min_idle_s=0) == ["life-dead"]
    assert live.is_dir() and foreign.is_dir() and not dead.exists()
    assert job_files("life-dead") == []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False
