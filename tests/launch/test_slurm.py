"""``distgnn-launch --slurm`` against a fake ``srun`` and ``scontrol`` (tests/launch/slurm_bin) that run steps here.

The allocation's nodes are named 127.0.0.1 and 127.0.0.2: loopback addresses
resolve to themselves, so the launcher's own ip_config is exercised too.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from launch_progs.harness import CLEANUP_S, FakeJob, assert_nothing_left
from netns_cluster import free_port

from distgnn.launch.ip_config import Machine, read_ip_config
from distgnn.launch.plan import LaunchError
from distgnn.launch.slurm import SlurmTransport, job_nodes, write_ip_config

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the launcher's wrapper needs Linux /proc")

FAKE_BIN = Path(__file__).resolve().parent / "slurm_bin"
NODES = ["127.0.0.1", "127.0.0.2"]


@pytest.fixture
def allocation(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", f"{FAKE_BIN}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "127.0.0.[1-2]")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("FAKE_SRUN_LOG", str(tmp_path / "srun.log"))
    return tmp_path / "srun.log"


def slurm_job(tmp_path) -> tuple[FakeJob, list[str]]:
    job = FakeJob(tmp_path, NODES)
    (tmp_path / "ip.txt").unlink()  # the launcher writes its own
    return job, ["--slurm", "--port", str(free_port(span=10))]


def without_ip_config(argv: list[str]) -> list[str]:
    i = argv.index("--ip-config")
    return argv[:i] + argv[i + 2 :]


def test_node_list_and_ip_config(allocation, tmp_path):
    assert job_nodes() == NODES
    machines = write_ip_config(["127.0.0.1", "localhost", "127.0.0.1"], 30050, 2, tmp_path / "ip.txt")
    assert machines == [Machine("127.0.0.1", 30050), Machine("127.0.0.1", 30052), Machine("127.0.0.1", 30054)]
    assert read_ip_config(tmp_path / "ip.txt") == machines


def test_without_an_allocation_it_says_so(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    with pytest.raises(LaunchError, match="run distgnn-launch inside an allocation"):
        job_nodes()


def test_every_process_is_a_one_task_step_on_its_node():
    transport = SlurmTransport("/ws", [Machine("10.0.0.1", 1), Machine("10.0.0.2", 1)], ["n1", "n2"])
    cmd = transport.command("10.0.0.2", ["python", "-m", "x"], {"DISTGNN_JOB_ID": "j1"})
    assert cmd.argv[:4] == ["srun", "--nodes=1", "--ntasks=1", "--nodelist=n2"]
    assert "--overlap" in cmd.argv and "--chdir=/ws" in cmd.argv and cmd.argv[-3:] == ["python", "-m", "x"]
    assert cmd.env["DISTGNN_JOB_ID"] == "j1"
    with pytest.raises(LaunchError, match="lists 2 machines but the allocation has 1 nodes"):
        SlurmTransport("/ws", [Machine("10.0.0.1", 1), Machine("10.0.0.2", 1)], ["n1"])


def test_slurm_job_runs_every_process_on_its_node(allocation, tmp_path):
    job, flags = slurm_job(tmp_path)
    proc = job.start(without_ip_config(job.argv(*flags, "--num-servers", "2")))
    assert proc.wait(timeout=120) == 0, job.stderr()
    reports = job.trainer_reports()
    assert sorted(reports) == [0, 1, 2, 3]
    for rank, r in reports.items():
        assert r["slurm_node"] == NODES[rank // 2] and r["machine_id"] == rank // 2
        assert r["master_addr"] == NODES[0] and r["world_size"] == 4 and r["label"] == f"[{rank // 2}/trainer/{rank}]"
        assert r["token_sha"] and not r["token_in_argv"] and r["restart_count"] == 0
    ip_config = tmp_path / "distgnn-runs" / job.job_id() / "ip_config.txt"
    assert [m.ip for m in read_ip_config(ip_config)] == NODES and reports[0]["ip_config"] == str(ip_config)
    steps = [json.loads(line) for line in allocation.read_text().splitlines()]
    job_steps = [s for s in steps if "run" in s["argv"]]
    assert sorted((s["nodes"][0], s["ntasks"]) for s in job_steps) == sorted([(n, 1) for n in NODES] * 3)
    assert {s["nodes"][0] for s in steps if "sweep" in s["argv"]} == set(NODES)
    assert_nothing_left(job, job.job_id())


@pytest.mark.slow
def test_slurm_job_without_servers_runs_one_trainer_step_per_node(allocation, tmp_path):
    job, flags = slurm_job(tmp_path)
    proc = job.start(without_ip_config(job.argv(*flags, servers=False)))
    assert proc.wait(timeout=120) == 0, job.stderr()
    reports = job.trainer_reports()
    assert sorted(reports) == [0, 1, 2, 3]
    for rank, r in reports.items():
        assert r["slurm_node"] == NODES[rank // 2] and r["num_servers"] == 0 and r["part_config"] is None
    steps = [json.loads(line) for line in allocation.read_text().splitlines()]
    assert sorted(s["nodes"][0] for s in steps if "run" in s["argv"]) == NODES
    assert_nothing_left(job, job.job_id())


def test_slurm_kill_9_of_a_server_is_named_and_the_job_ends(allocation, tmp_path):
    job, flags = slurm_job(tmp_path)
    proc = job.start(without_ip_config(job.argv(*flags, mode="sleep")))
    job.wait_running(num_servers=2, num_trainers=4, proc=proc)
    pid = job.pids()["server-m1-s0"]
    os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    assert proc.wait(timeout=60) == 1
    took = time.monotonic() - started
    errors = [line for line in job.stderr().splitlines() if line.startswith("distgnn-launch: error:")]
    assert errors == [
        f"distgnn-launch: error: server 0 of machine 1 (partition 1, host 127.0.0.2, pid {pid}) was killed by SIGKILL"
    ]
    assert took < 10, f"{took:.1f} s from kill -9 to the launcher's exit"
    assert_nothing_left(job, job.job_id(), timeout=CLEANUP_S)
