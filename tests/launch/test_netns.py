"""distgnn-launch across real hosts: network namespaces with sshd (see netns_cluster.py).

The launcher runs inside host 0, as on a real cluster's first machine, and reaches
both hosts over ssh with checked host keys.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest
from launch_progs.harness import CLEANUP_S, FakeJob, assert_nothing_left
from netns_cluster import UNUSED_ADDRESS, netns_cluster_fixture

pytestmark = [pytest.mark.netns, pytest.mark.skipif(sys.platform != "linux", reason="needs Linux")]


@pytest.fixture(scope="module")
def cluster():
    yield from netns_cluster_fixture(num_hosts=2)


def ssh_job(tmp_path, cluster, addresses=None) -> FakeJob:
    return FakeJob(tmp_path, addresses or cluster.addresses)


def start(job: FakeJob, cluster, *flags: str, known_hosts=None, **kw):
    return job.start(job.argv(*cluster.ssh_flags(known_hosts), *flags, **kw), prefix=cluster.exec_prefix(0))


def assert_hosts_idle(cluster, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while (busy := cluster.job_processes()) and any(busy.values()):
        assert time.monotonic() < deadline, f"processes left in the namespaces: {busy}"
        time.sleep(0.1)


def test_job_across_two_hosts(tmp_path, cluster):
    job = ssh_job(tmp_path, cluster)
    proc = start(job, cluster, "--num-servers", "2")
    assert proc.wait(timeout=120) == 0, job.stderr()
    reports = job.trainer_reports()
    assert sorted(reports) == [0, 1, 2, 3]
    for rank, r in reports.items():
        machine = rank // 2
        assert r["label"] == f"[{machine}/trainer/{rank}]" and r["machine_id"] == machine
        assert cluster.addresses[machine] in r["host_addresses"]  # really ran on that host
        assert r["master_addr"] == cluster.addresses[0] and r["world_size"] == 4
        assert r["token_sha"] and not r["token_in_argv"]
    assert len({r["token_sha"] for r in reports.values()}) == 1
    assert "killed leftover processes [" not in job.stderr().replace("processes []", "")  # the wrappers did it
    assert_nothing_left(job, job.job_id())
    assert_hosts_idle(cluster)


@pytest.mark.parametrize(
    "case, message",
    [
        ("unreachable", f"machine 1 \\({UNUSED_ADDRESS}\\): ssh to {UNUSED_ADDRESS} port 22 failed"),
        ("wrong port", "Is sshd listening on port 2222"),
        ("changed host key", "host key differs from the one in known_hosts"),
    ],
)
def test_ssh_problems_fail_before_anything_starts(tmp_path, cluster, case, message):
    import re

    flags = []
    addresses = known = None
    if case == "unreachable":
        addresses = [cluster.addresses[0], UNUSED_ADDRESS]
    elif case == "wrong port":
        flags = ["--ssh-port", "2222"]
    else:
        known = tmp_path / "known_hosts"
        lines = cluster.known_hosts.read_text().splitlines()
        other_key = lines[0].split()[1:]
        known.write_text(f"{lines[0]}\n{cluster.addresses[1]} {' '.join(other_key)}\n")  # host 1 claims host 0's key
    job = ssh_job(tmp_path, cluster, addresses)
    started = time.monotonic()
    proc = start(job, cluster, *flags, known_hosts=known)
    assert proc.wait(timeout=60) == 2
    assert time.monotonic() - started < 30
    err = job.stderr()
    assert "preflight failed, nothing was started" in err and re.search(message, err), err
    assert job.pids() == {} and "job j" not in err
    assert_hosts_idle(cluster)


@pytest.mark.parametrize("victim", ["server-m1-s0", "trainer-r2"])
def test_kill_9_mid_run_is_named_first_and_the_job_ends_within_10_s(tmp_path, cluster, victim):
    import os

    job = ssh_job(tmp_path, cluster)
    proc = start(job, cluster, mode="sleep")
    job.wait_running(num_servers=2, num_trainers=4, proc=proc)
    pid = job.pids()[victim]
    os.kill(pid, signal.SIGKILL)  # the namespaces share this pid space
    started = time.monotonic()
    assert proc.wait(timeout=60) == 1
    took = time.monotonic() - started
    err = job.stderr()
    who = "server 0" if victim.startswith("server") else "trainer 2"
    errors = [line for line in err.splitlines() if line.startswith("distgnn-launch: error:")]
    host = cluster.addresses[1]
    assert errors == [
        f"distgnn-launch: error: {who} of machine 1 (partition 1, host {host}, pid {pid}) was killed by SIGKILL"
    ]
    if victim.startswith("server"):
        assert "fake server ready machine=1" in err.split("lines of [1/server/0]")[1]
    assert took < 10, f"{took:.1f} s from kill -9 to the launcher's exit"
    assert_nothing_left(job, job.job_id(), timeout=CLEANUP_S)
    assert_hosts_idle(cluster, timeout=CLEANUP_S)


def test_trainer_raising(tmp_path, cluster):
    job = ssh_job(tmp_path, cluster)
    proc = start(job, cluster, mode="raise", env=("FAKE_RAISE_RANK=2", "FAKE_DELAY=1"))
    started = time.monotonic()
    assert proc.wait(timeout=60) == 1
    assert time.monotonic() - started < 60
    err = job.stderr()
    host = cluster.addresses[1]
    assert (
        f"error: trainer 2 of machine 1 (partition 1, host {host}, pid {job.pids()['trainer-r2']}) exited with code 1"
        in err
    )
    assert "last stderr line: RuntimeError: fake trainer 2 fails on cue" in err
    assert "RuntimeError: fake trainer 2 fails on cue" in err.split("lines of [1/trainer/2]")[1]
    assert_nothing_left(job, job.job_id())
    assert_hosts_idle(cluster)


def test_ctrl_c_stops_every_host(tmp_path, cluster):
    job = ssh_job(tmp_path, cluster)
    proc = start(job, cluster, mode="sleep")
    job.wait_running(num_servers=2, num_trainers=4, proc=proc)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 128 + signal.SIGINT
    assert "received SIGINT" in job.stderr()
    assert_nothing_left(job, job.job_id())
    assert_hosts_idle(cluster)


def test_launcher_killed_outright_leaves_nothing(tmp_path, cluster):
    job = ssh_job(tmp_path, cluster)
    proc = start(job, cluster, mode="sleep")
    job.wait_running(num_servers=2, num_trainers=4, proc=proc)
    proc.kill()  # its ssh connections close; every remote wrapper stops its tree and removes shared memory
    proc.wait()
    assert_nothing_left(job, job.job_id(), timeout=20)
    assert_hosts_idle(cluster, timeout=20)


CORA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "planetoid"
TRAIN = Path(__file__).resolve().parents[2] / "examples" / "graphsage" / "train_dist.py"


def result_of(output: str) -> dict:
    lines = [line for line in output.splitlines() if "RESULT " in line]
    assert len(lines) == 1, f"expected one RESULT line, got {lines}"
    return json.loads(lines[0].split("RESULT ", 1)[1])
