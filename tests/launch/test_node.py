"""Operator-started jobs: two real torchrun invocations (two "nodes" on this host) run ``distgnn.launch.node``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from launch_progs.harness import FAKE_SERVER, FAKE_TRAINER, alive, job_pids
from netns_cluster import free_port

from distgnn.launch.node import NodeError, RendezvousServer, exchange, job_id_of, torchrun_env

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG and /proc are Linux only")


def start_nodes(tmp_path: Path, mode: str, **fake_env: str) -> list[subprocess.Popen]:
    (tmp_path / "fake").mkdir()
    (tmp_path / "g.json").write_text('{"num_parts": 2}')
    port = free_port(span=40)
    env = {**os.environ, "DISTGNN_TOKEN": "s3cret", "FAKE_DIR": str(tmp_path / "fake"), "FAKE_MODE": mode}
    env.update(fake_env)
    procs = []
    for node in (0, 1):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}"]
        argv += ["--nproc-per-node=2", "--master-addr=127.0.0.1", f"--master-port={port}", "--max-restarts=0"]
        argv += ["-m", "distgnn.launch.node", "--part-config", "g.json", "--port", str(port + 10 + 10 * node)]
        argv += ["--server-command", f"{sys.executable} {FAKE_SERVER}", "--", str(FAKE_TRAINER), "--epochs", "1"]
        out, err = (open(tmp_path / f"node{node}.{s}", "wb") for s in ("out", "err"))  # noqa: SIM115
        procs.append(subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL))
    return procs


def stop_nodes(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to every node still running (torchrun stops its agent, whose servers and trainers die with it),
    SIGKILL to one that is not gone 30 s later: a failed test leaves no process to the tests after it."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def reports(tmp_path: Path) -> dict[int, dict]:
    found = {}
    for node in (0, 1):
        for line in (tmp_path / f"node{node}.out").read_text().splitlines():
            if line.startswith("FAKE_TRAINER "):
                report = json.loads(line.split(" ", 1)[1])
                found[report["rank"]] = report
    return found


def assert_nothing_left(job_id: str, tmp_path: Path, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while True:
        pids = [p for p in job_pids(job_id) if alive(p)]
        files = sorted(
            p.name for p in [*Path("/dev/shm").glob(f"distgnn-{job_id}-*"), *Path("/tmp").glob(f"distgnn-{job_id}-*")]
        )
        if not pids and not files:
            return
        assert time.monotonic() < deadline, f"left behind: processes {pids}, files {files}"
        time.sleep(0.1)


def test_two_torchrun_nodes_run_a_job(tmp_path):
    procs = start_nodes(tmp_path, "ok")
    try:
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        stop_nodes(procs)
    assert codes == [0, 0], (tmp_path / "node0.err").read_text()[-2000:] + (tmp_path / "node1.err").read_text()[-2000:]
    got = reports(tmp_path)
    assert sorted(got) == [0, 1, 2, 3]
    for rank, r in got.items():
        assert (r["machine_id"], r["local_rank"], r["num_trainers"], r["world_size"]) == (rank // 2, rank % 2, 2, 4)
        assert (
            r["role"] == "trainer" and r["part_config"] == str(tmp_path / "g.json") and r["args"] == ["--epochs", "1"]
        )
        assert r["token_sha"] and not r["token_in_argv"] and r["restart_count"] == 0
    assert len({r["job_id"] for r in got.values()}) == 1
    for node in (0, 1):
        assert (
            f"fake server ready machine={node} server=0 role=server token=yes"
            in (tmp_path / f"node{node}.out").read_text()
        )
    assert_nothing_left(got[0]["job_id"], tmp_path)


def test_a_killed_server_is_named_by_its_node(tmp_path):
    procs = start_nodes(tmp_path, "sleep")
    try:
        fake = tmp_path / "fake"
        deadline = time.monotonic() + 60
        while len(list(fake.glob("*.pid"))) < 6 or len(reports(tmp_path)) < 4:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), (
                tmp_path / "node1.err"
            ).read_text()
            time.sleep(0.1)
        pid = int((fake / "server-m1-s0.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        named = f"distgnn node: error: server 0 of machine 1 (partition 1, pid {pid}) was killed by SIGKILL"
        # The node's own detection is bounded tightly; its exit also waits for torchrun to stop the other local
        # rank, which a loaded machine slows (the 30 s wait below bounds it).
        while named not in (tmp_path / "node1.err").read_text():
            assert time.monotonic() - started < 10, "node 1 did not name the killed server within 10 s"
            time.sleep(0.05)
        assert procs[1].wait(timeout=30) != 0
        procs[0].send_signal(signal.SIGTERM)  # node 0's stand-in trainers sleep; real ones would fail on RPC
        procs[0].wait(timeout=30)
        assert_nothing_left(reports(tmp_path)[0]["job_id"], tmp_path)
    finally:
        stop_nodes(procs)


def test_a_node_whose_trainers_finished_after_node_0_failed_stops_within_seconds(tmp_path):
    # Node 0's second trainer fails; node 1's trainers finish later and reach the end-of-job rendezvous after
    # node 0 is gone: node 1 names it and exits, well before the 300 s the start may wait.
    procs = start_nodes(tmp_path, "raise_alone", FAKE_RAISE_RANK="1", FAKE_DELAY="2", FAKE_OTHERS_DELAY="6")
    start = time.monotonic()
    try:
        codes = [p.wait(timeout=90) for p in procs]
        took = time.monotonic() - start
    finally:
        stop_nodes(procs)
    err = (tmp_path / "node1.err").read_text()
    assert codes[0] != 0 and codes[1] != 0, err[-2000:]
    assert "rendezvous 'done'" in err and "node 0's leader" in err, err[-3000:]
    assert took < 60, f"node 1 took {took:.0f} s to stop"


def test_outside_torchrun_it_says_what_is_missing():
    with pytest.raises(NodeError, match="not started by torchrun: RANK, LOCAL_RANK"):
        torchrun_env({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h", "GROUP_RANK": "0"})
    topo = torchrun_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                         "MASTER_ADDR": "h", "NODE_RANK": "1"})  # fmt: skip
    assert (topo["num_nodes"], topo["node_rank"], topo["master_port"]) == (2, 1, 29500)
    a = job_id_of({"MASTER_ADDR": "h", "MASTER_PORT": "1", "TORCHELASTIC_RUN_ID": "r"})
    assert (
        a
        == job_id_of({"MASTER_ADDR": "h", "MASTER_PORT": "1", "TORCHELASTIC_RUN_ID": "r"})
        != job_id_of({"MASTER_ADDR": "h", "MASTER_PORT": "2", "TORCHELASTIC_RUN_ID": "r"})
    )
    assert job_id_of({"DISTGNN_JOB_ID": "jx", "MASTER_ADDR": "h"}) == "jx"


def test_the_rendezvous_answers_every_node_and_a_later_round_stops_soon_once_node_0_is_gone():
    port = free_port()
    server = RendezvousServer(port, 2, "tok")
    answers = {}
    threads = [
        threading.Thread(target=lambda n=n: answers.update({n: exchange("127.0.0.1", port, "tok", "a", n, n * 10, 30)}))
        for n in (1, 0)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert answers == {0: [0, 10], 1: [0, 10]}
    errors = []

    def wait_done() -> None:
        try:
            exchange("127.0.0.1", port, "tok", "done", 1, True, timeout_s=60, refused_s=0.5)
        except NodeError as exc:
            errors.append((str(exc), time.monotonic()))

    waiting = threading.Thread(target=wait_done)
    waiting.start()
    deadline = time.monotonic() + 30
    while "done" not in server.rounds:  # node 1 has sent its "done"; node 0 never will
        assert time.monotonic() < deadline
        time.sleep(0.02)
    stopped = time.monotonic()
    server.close()  # node 0's leader stops: the waiting node is hung up on, and nothing listens any more
    waiting.join(30)
    assert errors and "closed the connection before every node had arrived" in errors[0][0]
    assert errors[0][1] - stopped < 10  # not the 60 s deadline
    start = time.monotonic()
    with pytest.raises(NodeError, match="refused for 0.5 s after node 0's leader had answered"):
        exchange("127.0.0.1", port, "tok", "done", 1, True, timeout_s=60, refused_s=0.5)
    assert time.monotonic() - start < 10  # not the 60 s deadline
    with pytest.raises(NodeError, match="did not complete within 0.5 s"):  # the first round waits the deadline
        exchange("127.0.0.1", port, "tok", "addresses", 1, True, timeout_s=0.5)


def test_a_rendezvous_host_that_closes_the_connection_is_named():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def close_one() -> None:
            conn, _ = listener.accept()
            conn.close()

        thread = threading.Thread(target=close_one)
        thread.start()
        with pytest.raises(NodeError, match="closed the connection before every node had arrived"):
            exchange("127.0.0.1", port, "tok", "done", 1, True, timeout_s=30, refused_s=1)
        thread.join(10)
