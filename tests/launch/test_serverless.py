"""Jobs without graph servers (``--num-servers 0``): trainers alone, with torchrun's environment and no partition."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch_progs.harness import FAKE_TRAINER, FakeJob, alive, assert_nothing_left, job_pids
from netns_cluster import free_port

from distgnn.launch import env as E
from distgnn.launch.cli import options_from_args, parse_args
from distgnn.launch.ip_config import Machine
from distgnn.launch.plan import LaunchError, LaunchOptions, build_plan
from distgnn.launch.preflight import read_machines

MACHINES = [Machine("10.1.0.1", 30050), Machine("10.1.0.2", 30050)]
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="the launcher's wrapper needs Linux /proc")


def serverless(**kw) -> LaunchOptions:
    base = dict(ip_config="/ws/ip.txt", part_config=None, command=("python", "t.py"), num_trainers=2, num_servers=0)
    return LaunchOptions(**{**base, **kw})


def test_plan_without_servers_has_only_the_trainer_agents():
    plan = build_plan(MACHINES, serverless(), "jtest", 29400)
    assert [(p.machine_id, p.role, p.index, p.host) for p in plan] == [
        (0, "trainer", 0, "10.1.0.1"),
        (1, "trainer", 1, "10.1.0.2"),
    ]
    for spec in plan:
        assert spec.argv[1:3] == ("-m", "torch.distributed.run")
        assert "--nnodes=2" in spec.argv and "--nproc-per-node=2" in spec.argv
        assert "--master-addr=10.1.0.1" in spec.argv and "--master-port=29400" in spec.argv
        assert E.PART_CONFIG not in spec.env and spec.env[E.NUM_SERVERS] == "0"
    with_partition = build_plan(MACHINES, serverless(part_config="/ws/g.json"), "jtest", 29400)
    assert {p.env[E.PART_CONFIG] for p in with_partition} == {"/ws/g.json"}


def cli_options(*flags: str) -> LaunchOptions:
    args, command = parse_args(["--ip-config", "ip.txt", "--num-trainers", "1", *flags, "--", "python", "t.py"])
    return options_from_args(args, command)


def test_cli_part_config_is_optional_only_without_servers():
    assert cli_options("--num-servers", "0").part_config is None
    with pytest.raises(LaunchError, match="--part-config is required with --num-servers 1 .* pass --num-servers 0"):
        cli_options()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--num-servers", "-1"], r"need .*--num-servers >= 0.*got 1, -1, 0, 0"),
        (["--num-servers", "0", "--num-samplers", "2"], "need graph servers"),
        (["--num-servers", "0", "--server-command", "x"], "need graph servers"),
    ],
)
def test_cli_rejects_bad_counts(flags, message):
    with pytest.raises(LaunchError, match=message):
        cli_options(*flags)


def test_preflight_without_a_partition(tmp_path):
    ip = tmp_path / "ip.txt"
    ip.write_text("127.0.0.1 30050\n127.0.0.1 30050\n")  # no servers: machines on one address may share a port
    assert read_machines(serverless(ip_config=str(ip), local=True)) == [Machine("127.0.0.1", 30050)] * 2
    (tmp_path / "g.json").write_text('{"num_parts": 3}')
    with pytest.raises(LaunchError, match="lists 2 machines but .*g.json has 3 partitions"):
        read_machines(serverless(ip_config=str(ip), part_config=str(tmp_path / "g.json")))
    ip.write_text("# nobody\n")
    with pytest.raises(LaunchError, match="no machines listed"):
        read_machines(serverless(ip_config=str(ip)))


def local_job(tmp_path) -> FakeJob:
    base = free_port(span=20)
    return FakeJob(tmp_path, ["127.0.0.1", "127.0.0.1"], ports=[base, base + 10])


@linux_only
@pytest.mark.slow
def test_local_serverless_job_runs_and_cleans_up(tmp_path):
    job = local_job(tmp_path)
    proc = job.start(job.argv("--local", servers=False))
    assert proc.wait(timeout=120) == 0, job.stderr()
    assert "2 machines x 2 trainers (no graph servers) via local" in job.stderr()
    reports = job.trainer_reports()
    assert sorted(reports) == [0, 1, 2, 3]
    for rank, r in reports.items():
        assert r["label"] == f"[{rank // 2}/trainer/{rank}]"
        assert (r["machine_id"], r["local_rank"], r["world_size"]) == (rank // 2, rank % 2, 4)
        assert r["master_addr"] == "127.0.0.1"
        assert r["role"] == "trainer" and r["num_servers"] == 0 and r["part_config"] is None
    assert "server" not in "".join(p.name for p in (tmp_path / "distgnn-runs" / job.job_id() / "attempt-0").iterdir())
    assert_nothing_left(job, job.job_id())


@linux_only
@pytest.mark.slow
def test_local_serverless_sigterm_stops_everything(tmp_path):
    job = local_job(tmp_path)
    proc = job.start(job.argv("--local", mode="sleep", servers=False))
    job.wait_running(num_servers=0, num_trainers=4, proc=proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert_nothing_left(job, job.job_id())


@linux_only
@pytest.mark.slow
def test_local_serverless_kill_9_is_named_without_a_partition(tmp_path):
    job = local_job(tmp_path)
    proc = job.start(job.argv("--local", mode="sleep", servers=False))
    job.wait_running(num_servers=0, num_trainers=4, proc=proc)
    pid = job.pids()["trainer-r2"]
    os.kill(pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == 1
    errors = [line for line in job.stderr().splitlines() if line.startswith("distgnn-launch: error:")]
    assert errors == [
        f"distgnn-launch: error: trainer 2 of machine 1 (host 127.0.0.1, pid {pid}) was killed by SIGKILL"
    ]
    assert_nothing_left(job, job.job_id())


@linux_only
@pytest.mark.slow
def test_node_mode_without_servers_needs_no_partition_or_token(tmp_path):
    (tmp_path / "fake").mkdir()
    port = free_port(span=5)
    env = {k: v for k, v in os.environ.items() if k != E.TOKEN}
    env.update({"FAKE_DIR": str(tmp_path / "fake"), "FAKE_MODE": "ok", E.JOB_ID: f"tnode{os.getpid()}"})
    procs = []
    for node in (0, 1):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}"]
        argv += ["--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}", "--max-restarts=0"]
        argv += ["-m", "distgnn.launch.node", "--num-servers", "0", "--", str(FAKE_TRAINER), "--epochs", "1"]
        out = open(tmp_path / f"node{node}.out", "wb")  # noqa: SIM115 - the child owns it
        procs.append(subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT))
    assert [p.wait(timeout=120) for p in procs] == [0, 0], (tmp_path / "node0.out").read_text()
    reports = {}
    for node in (0, 1):
        for line in (tmp_path / f"node{node}.out").read_text().splitlines():
            if line.startswith("FAKE_TRAINER "):
                report = json.loads(line.split(" ", 1)[1])
                reports[report["rank"]] = report
    assert sorted(reports) == [0, 1]
    for rank, r in reports.items():
        assert (r["machine_id"], r["world_size"], r["num_servers"]) == (rank, 2, 0)
        assert r["part_config"] is None and r["ip_config"] is None and r["token_sha"] is None
    deadline = time.monotonic() + 10
    while [p for p in job_pids(env[E.JOB_ID]) if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in job_pids(env[E.JOB_ID]) if alive(p)]
    assert not list(Path("/dev/shm").glob(f"distgnn-{env[E.JOB_ID]}-*"))  # swept by local rank 0 of each node


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--num-servers", "-2"], "--num-servers must be >= 0, got -2"),
        (["--num-servers", "1"], "no partition config: .*or --num-servers 0"),
    ],
)
def test_node_mode_rejects(flags, message, monkeypatch, capsys):
    from distgnn.launch import node

    monkeypatch.delenv(E.PART_CONFIG, raising=False)
    assert node.main([*flags, "--", "t.py"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert re.search(message, line), line


def test_node_mode_refuses_a_partition_that_disagrees(tmp_path, monkeypatch, capsys):
    from distgnn.launch import node

    (tmp_path / "g.json").write_text('{"num_parts": 3}')
    for name, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="1", GROUP_RANK="0").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert node.main(["--num-servers", "0", "--part-config", str(tmp_path / "g.json"), "--", "t.py"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "has 3 partitions but torchrun runs 2 nodes" in line
